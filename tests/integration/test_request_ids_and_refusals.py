"""X-Request-Id on every response and a client's own id kept end to end (header, usage row,
engine); error answers of requests refused before admission counted once in the metrics."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import Gateway, sim_model, start_gateway, wait_for

FRESH = re.compile(r"req_[0-9a-f]{32}")
MSGS: list[Any] = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(
        tmp_path_factory.mktemp("request-ids"),
        seed_with={"models": {"sim": sim_model("sim")}, "tenants": {"acme": {}, "limited": {"rpm": 1}}},
        usage_flush_interval_s=0.05,
    )
    yield gw
    gw.stop()


def sdk(gw: Gateway, key: str | None = "acme") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.api_url, api_key=gw.keys[key] if key else "sk-wrong", max_retries=0)


CHAT = b'{"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
RESPONSES = [
    ("GET", "/health/live", False, None, 200),
    ("GET", "/health/ready", False, None, 200),
    ("GET", "/metrics", False, None, 200),
    ("GET", "/schema/openapi.json", False, None, 200),
    ("GET", "/v1/models", True, None, 200),
    ("GET", "/v1/models/sim", True, None, 200),
    ("GET", "/v1/models", False, None, 401),
    ("GET", "/v1/models/nope", True, None, 404),
    ("POST", "/v1/chat/completions", False, CHAT, 401),
    ("POST", "/v1/chat/completions", True, b"{", 400),
    ("POST", "/v1/chat/completions", True, CHAT.replace(b'"sim"', b'"nope"'), 404),
    ("POST", "/v1/completions", True, b'{"model": "sim", "prompt": "x", "temperature": 9}', 400),
    ("PUT", "/v1/models", True, None, 405),
    ("GET", "/no/such/path", False, None, 404),
    ("GET", "/admin/api/tenants", False, None, 401),
    ("GET", "/admin/login", False, None, 200),
]


@pytest.mark.parametrize(("method", "path", "auth", "body", "status"), RESPONSES)
def test_every_response_carries_a_request_id(
    gw: Gateway, method: str, path: str, auth: bool, body: bytes | None, status: int
) -> None:
    headers = {"Authorization": f"Bearer {gw.keys['acme']}"} if auth else {}

    def send(**extra: str) -> httpx.Response:
        r = httpx.request(method, gw.base_url + path, content=body, headers={**headers, **extra})
        assert r.status_code == status, r.text
        assert len(r.headers.get_list("x-request-id")) == 1
        return r

    first, second = send().headers["x-request-id"], send().headers["x-request-id"]
    assert FRESH.fullmatch(first) and FRESH.fullmatch(second) and first != second
    assert send(**{"X-Request-Id": "trace-1.a:b_c"}).headers["x-request-id"] == "trace-1.a:b_c"
    assert FRESH.fullmatch(send(**{"X-Request-Id": "x" * 65}).headers["x-request-id"])


def test_a_client_id_is_kept_end_to_end_and_the_body_id_stays_openai_shaped(gw: Gateway) -> None:
    client = sdk(gw)
    raw = client.chat.completions.with_raw_response.create(
        model="sim", messages=MSGS, max_tokens=3, extra_headers={"X-Request-Id": "trace-7"}
    )
    completion = raw.parse()
    assert raw.headers["x-request-id"] == "trace-7" and completion._request_id == "trace-7"
    assert completion.id.startswith("chatcmpl-") and len(completion.id) == 41
    # The engine gets the client's id, made unique by the gateway's own.
    assert gw.engine("sim").recent[-1] == f"trace-7:{completion.id}"
    with client.completions.with_streaming_response.create(
        model="sim", prompt="hi", max_tokens=3, stream=True, extra_headers={"X-Request-Id": "trace-8"}
    ) as stream:
        assert stream.headers["x-request-id"] == "trace-8"
        chunks = list(stream.parse())
    assert chunks[0].id.startswith("cmpl-")
    rows: dict[str, Any] = {}

    def both_written() -> bool:  # a stream's row follows its last byte: the lease is released after it
        rows.update({r.request_id: r for r in gw.usage_rows("acme")})
        return {"trace-7", "trace-8"} <= rows.keys()

    wait_for(both_written, what="the usage rows of trace-7 and trace-8")
    assert rows["trace-7"].status == 200 and rows["trace-8"].stream


def test_without_a_client_id_a_completion_answers_with_its_own_id(gw: Gateway) -> None:
    raw = sdk(gw).chat.completions.with_raw_response.create(model="sim", messages=MSGS, max_tokens=2)
    completion = raw.parse()
    assert raw.headers["x-request-id"] == completion.id == completion._request_id
    assert gw.engine("sim").recent[-1] == completion.id
    assert completion.id in {r.request_id for r in gw.usage_rows("acme")}


def test_an_insane_client_id_is_ignored_not_refused(gw: Gateway) -> None:
    def chat(client_id: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {gw.keys['acme']}", "X-Request-Id": client_id.encode("latin-1")}
        r = httpx.post(gw.api_url + "/chat/completions", content=CHAT, headers=headers)
        assert r.status_code == 200
        return r

    sane = "a" * 64
    assert chat(sane).headers["x-request-id"] == sane
    for insane in ["a" * 65, "", "two words", "a/b", "tab\tid", "caf\u00e9", "<script>"]:
        r = chat(insane)
        assert r.headers["x-request-id"] == r.json()["id"], insane


def test_one_client_id_on_concurrent_requests_keeps_them_apart(gw: Gateway) -> None:
    async def both() -> list[Any]:
        same = {"X-Request-Id": "retry-me"}
        async with openai.AsyncOpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0) as client:
            create = client.chat.completions.create
            return await asyncio.gather(
                *(create(model="sim", messages=MSGS, max_tokens=20, extra_headers=same) for _ in "ab")
            )

    done = asyncio.run(both())
    assert len({c.id for c in done}) == 2 and {c._request_id for c in done} == {"retry-me"}
    assert {f"retry-me:{c.id}" for c in done} <= set(gw.engine("sim").recent)
    assert sum(r.request_id == "retry-me" and r.status == 200 for r in gw.usage_rows("acme")) == 2


def snapshot(gw: Gateway) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(gw.base_url + "/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def count(snap: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in snap.items() if n == name and want <= ls)


REFUSED = "laneway_requests_refused_total"
ADMITTED = "laneway_requests_total"


def test_refusals_before_admission_are_counted_once_by_endpoint_status_and_code(gw: Gateway) -> None:
    before = snapshot(gw)
    with pytest.raises(openai.AuthenticationError):
        sdk(gw, key=None).chat.completions.create(model="sim", messages=MSGS)
    with pytest.raises(openai.NotFoundError):
        sdk(gw).chat.completions.create(model="nope", messages=MSGS)
    with pytest.raises(openai.BadRequestError):
        sdk(gw).completions.create(model="sim", prompt="x", temperature=9)
    with pytest.raises(openai.NotFoundError):
        sdk(gw).models.retrieve("nope")
    assert httpx.get(gw.base_url + "/no/such/path").status_code == 404
    assert httpx.delete(gw.base_url + "/v1/fine_tuning/jobs/ftjob-1").status_code == 404  # an OpenAI area laneway lacks
    after = snapshot(gw)

    def delta(**labels: str) -> float:
        return count(after, REFUSED, **labels) - count(before, REFUSED, **labels)

    chat = "/v1/chat/completions"
    assert delta(endpoint=chat, status="401", code="invalid_api_key") == 1
    assert delta(endpoint=chat, status="404", code="model_not_found") == 1
    assert delta(endpoint="/v1/completions", status="400", code="invalid_request") == 1
    assert delta(endpoint="/v1/models/{model_id}", status="404", code="model_not_found") == 1
    # Unmatched routes by method and a bounded path: an OpenAI area by name, anything else "other".
    assert delta(endpoint="unmatched", status="404", code="", method="GET", path="other") == 1
    assert delta(endpoint="unmatched", status="404", code="", method="DELETE", path="/v1/fine_tuning") == 1
    assert delta(endpoint=chat, method="POST", path="") == 2  # a matched route's template says where
    assert delta() == 6
    assert count(after, ADMITTED) == count(before, ADMITTED)  # none of them was admitted


def test_a_refusal_after_admission_is_counted_by_its_lease_only(gw: Gateway) -> None:
    client = sdk(gw, key="limited")
    client.chat.completions.create(model="sim", messages=MSGS, max_tokens=2)  # the minute's one request
    before = snapshot(gw)
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.with_raw_response.create(
            model="sim", messages=MSGS, max_tokens=2, extra_headers={"X-Request-Id": "limited-2"}
        )
    after = snapshot(gw)
    assert refused.value.response.headers["x-request-id"] == "limited-2"  # an error after admission too
    assert count(after, ADMITTED, status="429") - count(before, ADMITTED, status="429") == 1
    assert (
        count(after, "laneway_rejections_total", reason="rate_limit")
        - count(before, "laneway_rejections_total", reason="rate_limit")
        == 1
    )
    assert count(after, REFUSED) == count(before, REFUSED)
    (row,) = [r for r in gw.usage_rows("limited") if r.request_id == "limited-2"]
    assert row.status == 429 and row.error_code == "rate_limit_exceeded"
