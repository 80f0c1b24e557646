"""A new endpoint is one record and one registration (api/endpoints.py, api/registry.py): the
test below adds POST /v1/shout (a one-turn chat through the same pipeline, answered in
capitals) with a single `register(...)` call, touching nothing else of laneway, and the
gateway built afterwards serves it over HTTP on both paths (api/fast.py's and Litestar's),
describes it in its OpenAPI document and runs it as a batch's endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import httpx
import msgspec
import openai
import pytest
from laneway.api.disconnect import HttpClient
from laneway.api.endpoints import Endpoint
from laneway.api.fast import FastRoutes
from laneway.api.protocol import encode
from laneway.api.registry import batch_paths, endpoints, register, unregister
from laneway.api.request import Incoming, authenticate, decode, routing
from laneway.api.services import ApiServices
from laneway.core.pipeline import Completed, GenerationIntent
from laneway.server import StartDelay
from laneway.types import ChatTurn
from litestar import MediaType, Response
from support import Gateway, sim_model, start_gateway
from support.batches import file_lines, jsonl, line, run_batch, wait_ended


class ShoutRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    text: str
    max_tokens: int | None = None


class Shout(msgspec.Struct, kw_only=True):
    object: str = "shout"
    model: str
    text: str


async def shout(request: Incoming, api: ApiServices) -> Response[bytes]:
    tenant = await authenticate(request, api.authenticator)
    req = await decode(request, ShoutRequest)  # an unknown field is a 400 naming it, as everywhere
    intent = GenerationIntent(
        endpoint="chat",
        alias=req.model,
        stream=False,
        messages=[ChatTurn(role="user", content=req.text)],
        max_tokens=req.max_tokens,
        **routing(request, None, None),
    )
    done = await api.gateway.serve(tenant, intent, HttpClient(request))
    assert isinstance(done, Completed)
    text = "".join(d.text for d in done.deltas).upper()
    return Response(encode(Shout(model=done.call.public_model, text=text)), media_type=MediaType.JSON)


SHOUT = Endpoint(
    "/v1/shout", shout, name="shout", request=ShoutRequest, response=Shout, span="shout", fast=True, batch=True
)
BODY = {"model": "sim", "text": "hello there", "max_tokens": 4}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    register(SHOUT)  # the one place a newcomer touches
    try:
        g = start_gateway(
            tmp_path_factory.mktemp("endpoint-registry"),
            seed_with={"models": {"sim": sim_model("sim")}, "tenants": {"acme": {}}},
            batch_poll_interval_s=0.1,
        )
        try:
            yield g
        finally:
            g.stop()
    finally:
        unregister(SHOUT.path)


def post(gw: Gateway, *, fast: bool, key: bool = True, **kwargs: object) -> httpx.Response:
    """POST /v1/shout through api/fast.py (`fast`) or with it switched off (Litestar's route)."""
    app = gw.server.server.config.app
    assert isinstance(app, StartDelay) and isinstance(app.app, FastRoutes)
    routes = app.app
    table = routes.routes
    assert SHOUT.path in table  # the fast path's table, built once, has it
    routes.routes = table if fast else {}
    try:
        headers = {"Authorization": f"Bearer {gw.keys['acme']}"} if key else {}
        return httpx.post(gw.base_url + SHOUT.path, headers=headers, timeout=30, **kwargs)  # type: ignore[arg-type]
    finally:
        routes.routes = table


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "litestar"])
def test_the_registered_endpoint_is_served_over_http(gw: Gateway, fast: bool) -> None:
    ok = post(gw, fast=fast, json=BODY)
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert body["object"] == "shout" and body["model"] == "sim"
    assert body["text"] and body["text"] == body["text"].upper()
    assert ok.headers["x-request-id"]

    unknown = post(gw, fast=fast, json={**BODY, "nope": 1})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "nope"
    assert post(gw, fast=fast, key=False, json=BODY).status_code == 401


def test_the_registered_endpoint_is_in_the_openapi_document(gw: Gateway) -> None:
    doc = httpx.get(gw.base_url + "/schema/openapi.json", timeout=30).json()
    operation = doc["paths"][SHOUT.path]["post"]
    request = operation["requestBody"]["content"]["application/json"]["schema"]
    assert request == {"$ref": "#/components/schemas/ShoutRequest"}
    ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/Shout"}
    assert {"400", "401", "429", "503"} <= set(operation["responses"])
    assert operation["security"] == [{"apiKey": []}]
    assert {"ShoutRequest", "Shout"} <= set(doc["components"]["schemas"])


def test_a_batch_may_name_the_registered_endpoint(gw: Gateway) -> None:
    client = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
    lines = [line(f"s{i}", SHOUT.path, {**BODY, "text": f"line {i}"}) for i in range(3)]
    batch = run_batch(client, jsonl(lines), endpoint=SHOUT.path)
    assert batch.endpoint == SHOUT.path
    done = wait_ended(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 3
    output = file_lines(client, done.output_file_id)
    assert sorted(output) == ["s0", "s1", "s2"]
    assert all(o["response"]["status_code"] == 200 for o in output.values())
    assert all(o["response"]["body"]["object"] == "shout" for o in output.values())


def test_registration_is_by_path_once_and_undone_by_unregister() -> None:
    quiet = replace(SHOUT, path="/v1/shout-quietly", batch=False)
    assert quiet not in endpoints()
    register(quiet)
    try:
        assert quiet in endpoints() and quiet.path not in batch_paths()  # not batchable: batch=False
        with pytest.raises(ValueError, match="already registered"):
            register(replace(quiet, name="another"))
    finally:
        unregister(quiet.path)
    assert quiet not in endpoints()
