"""The generation routes' plain-ASGI path (api/fast.py) answers exactly as Litestar's routes
do: each request is sent twice to one gateway, once through the fast path and once with it
switched off (Litestar's controller answers), and the two answers must match in status,
headers, body (ids and timestamps aside) and in what the metrics count."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from laneway.api.fast import FastRoutes
from laneway.app import create_app
from laneway.server import StartDelay, server_config
from laneway.settings import Settings
from prometheus_client.parser import text_string_to_metric_families
from support import Gateway, sim_model, start_gateway

CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
COMPLETION = {"model": "sim", "prompt": "hello", "max_tokens": 3}
MESSAGE = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
ANTHROPIC = {"anthropic-version": "2023-06-01"}
# Differ between any two answers: fresh ids, timestamps, the server's clock.
VOLATILE_HEADERS = {"date", "x-request-id", "content-length"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(
        tmp_path_factory.mktemp("fast-routes"),
        seed_with={"models": {"sim": sim_model("sim")}, "tenants": {"acme": {}, "limited": {"rpm": 1}}},
        usage_flush_interval_s=0.05,
    )
    yield gw
    gw.stop()


def fast_routes(gw: Gateway) -> FastRoutes:
    app = gw.server.server.config.app
    assert isinstance(app, StartDelay) and isinstance(app.app, FastRoutes)
    return app.app


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in ("id", "created")}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _body(response: httpx.Response) -> Any:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        # An event's data line (Anthropic's events name themselves on a line before it).
        blocks = [b.split("\n") for b in response.text.split("\n\n")]
        events = [line[6:] for block in blocks for line in block if line.startswith("data: ")]
        return [e if e == "[DONE]" else _stable(json.loads(e)) for e in events]
    return _stable(response.json()) if response.content else None


def answer(
    gw: Gateway, fast: bool, method: str, path: str, *, key: str | None = "acme", **kwargs: Any
) -> httpx.Response:
    routes = fast_routes(gw)
    table = routes.routes
    routes.routes = table if fast else {}
    try:
        headers = {"Authorization": f"Bearer {gw.keys[key]}"} if key else {}
        headers.update(kwargs.pop("headers", {}))
        return httpx.request(method, gw.base_url + path, headers=headers, timeout=30, **kwargs)
    finally:
        routes.routes = table


def refused(gw: Gateway) -> dict[tuple[str, ...], float]:
    text = httpx.get(gw.base_url + "/metrics", timeout=30).text
    return {
        tuple(sorted(s.labels.items())): s.value  # type: ignore[misc]
        for family in text_string_to_metric_families(text)
        if family.name == "laneway_requests_refused"
        for s in family.samples
        if s.name.endswith("_total")
    }


def _delta(after: dict[Any, float], before: dict[Any, float]) -> dict[Any, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("completion", "/v1/completions", {"json": COMPLETION}),
    ("chat", "/v1/chat/completions", {"json": CHAT}),
    (
        "chat stream",
        "/v1/chat/completions",
        {"json": {**CHAT, "stream": True, "stream_options": {"include_usage": True}}},
    ),
    ("completion stream", "/v1/completions", {"json": {**COMPLETION, "stream": True}}),
    ("no key", "/v1/chat/completions", {"json": CHAT, "key": None}),
    ("empty body", "/v1/completions", {"content": b""}),
    ("invalid json", "/v1/chat/completions", {"content": b"{"}),
    ("unknown parameter", "/v1/chat/completions", {"json": {**CHAT, "nope": 1}}),
    ("wrong type", "/v1/completions", {"json": {**COMPLETION, "max_tokens": "x"}}),
    ("unknown model", "/v1/chat/completions", {"json": {**CHAT, "model": "nope"}}),
    ("unsupported", "/v1/completions", {"json": {**COMPLETION, "suffix": "x"}}),
    ("too large", "/v1/completions", {"content": b" " * 10_000_001}),
    ("wrong method", "/v1/completions", {"method": "GET"}),
    # Anthropic's Messages API: its answer, its events, its error shape on the same path.
    ("message", "/v1/messages", {"json": MESSAGE, "headers": ANTHROPIC}),
    ("message stream", "/v1/messages", {"json": {**MESSAGE, "stream": True}, "headers": ANTHROPIC}),
    ("message without a key", "/v1/messages", {"json": MESSAGE, "key": None, "headers": ANTHROPIC}),
    ("message without max_tokens", "/v1/messages", {"json": {**MESSAGE, "max_tokens": None}}),
    ("message of an unknown version", "/v1/messages", {"json": MESSAGE, "headers": {"anthropic-version": "1999"}}),
    ("message, invalid json", "/v1/messages", {"content": b"{", "headers": ANTHROPIC}),
    ("message, unknown model", "/v1/messages", {"json": {**MESSAGE, "model": "nope"}, "headers": ANTHROPIC}),
]


@pytest.mark.parametrize(("label", "path", "kwargs"), CASES, ids=[c[0] for c in CASES])
def test_the_fast_path_answers_as_litestar_does(gw: Gateway, label: str, path: str, kwargs: dict[str, Any]) -> None:
    method = kwargs.pop("method", "POST")
    counts = []
    answers = []
    for fast in (True, False):
        before = refused(gw)
        answers.append(answer(gw, fast, method, path, **dict(kwargs)))
        counts.append(_delta(refused(gw), before))
    quick, litestar = answers
    assert quick.status_code == litestar.status_code, (label, quick.text, litestar.text)
    assert {k: v for k, v in quick.headers.items() if k not in VOLATILE_HEADERS} == {
        k: v for k, v in litestar.headers.items() if k not in VOLATILE_HEADERS
    }
    assert quick.headers["x-request-id"] and litestar.headers["x-request-id"]
    assert _body(quick) == _body(litestar)
    assert counts[0] == counts[1]  # the same refusal counted once on either path (or none)


def test_a_client_request_id_and_a_rate_limit_answer_alike(gw: Gateway) -> None:
    sent = {"X-Request-Id": "client-id-1"}
    for fast in (True, False):
        r = answer(gw, fast, "POST", "/v1/chat/completions", json=CHAT, headers=sent)
        assert r.status_code == 200 and r.headers["x-request-id"] == "client-id-1"
    answer(gw, True, "POST", "/v1/completions", key="limited", json=COMPLETION)  # the one request a minute
    quick = answer(gw, True, "POST", "/v1/completions", key="limited", json=COMPLETION)
    litestar = answer(gw, False, "POST", "/v1/completions", key="limited", json=COMPLETION)
    assert quick.status_code == litestar.status_code == 429
    assert set(quick.headers) == set(litestar.headers) and "retry-after" in quick.headers
    strip = lambda r: {k: v for k, v in r.json()["error"].items() if k != "message"}  # noqa: E731 (its wait differs)
    assert strip(quick) == strip(litestar) and strip(quick)["code"] == "rate_limit_exceeded"


def test_the_server_serves_generation_below_litestar_unless_traced(tmp_path: Any) -> None:
    plain = create_app(Settings(data_dir=tmp_path / "a", bootstrap_demo=False))
    served = server_config(plain, plain_settings := Settings(data_dir=tmp_path / "a", bootstrap_demo=False)).app
    assert isinstance(served, StartDelay) and isinstance(served.app, FastRoutes) and served.app.app is plain
    assert set(served.app.routes) == {"/v1/chat/completions", "/v1/completions", "/v1/messages"}
    traced_settings = Settings(
        data_dir=tmp_path / "b", bootstrap_demo=False, otlp_traces_endpoint="http://127.0.0.1:4318"
    )
    traced = create_app(traced_settings)
    assert server_config(traced, plain_settings).app.app is traced  # Litestar's middleware opens the span
