"""A stream survives its replica over HTTP (issue 39): two vLLM-protocol stand-ins speaking a
deterministic model; the one serving a stream drops its connection, sends an error event or
stalls mid-answer, and the client still gets one stream: the unbroken answer's text, one id,
one finish_reason, one usage chunk. The next replica is asked to continue the answer
(chat: the answer so far as the last assistant message, continue_final_message; completions:
the prompt followed by it). An answer that cannot continue (n > 1) ends with an error event."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from laneway.embedded import EmbeddedServer
from standins.vllm_server import VLLMStandIn
from support import stand_in_deployment as deployment
from support import start_gateway

DIES_AFTER = 5
ADMIN_PASSWORD = "correct horse battery"


@pytest.fixture
def pair() -> Iterator[tuple[VLLMStandIn, VLLMStandIn]]:
    standins = (VLLMStandIn(), VLLMStandIn())
    servers = []
    for standin in standins:
        standin.markov = True
        server = EmbeddedServer(standin.app).start(wait_ready=False)
        standin.base_url = server.base_url
        servers.append(server)
    yield standins
    for server in servers:
        server.stop()


def gateway(
    tmp_path: Path, pair: tuple[VLLMStandIn, VLLMStandIn], *, both: dict[str, Any] | None = None, **first_config: Any
) -> Any:
    both = both or {}
    models = {
        "m": [
            deployment("m-a", pair[0].base_url, **both, **first_config),
            deployment("m-b", pair[1].base_url, **both),
        ]
    }
    # Bound at arrival to the replica with the fewest requests, the first listed on a tie: the
    # stream goes to the failing m-a on purpose.
    return start_gateway(
        tmp_path,
        seed_with={"models": models, "tenants": {"acme": {}}},
        usage_flush_interval_s=0.05,
        routing="least_outstanding",
        admin_password=ADMIN_PASSWORD,
    )


def replicas_panel(gw: Any) -> str:
    """The alias page's replicas panel, as an admin sees it."""
    with httpx.Client(base_url=gw.base_url + "/admin", timeout=60) as admin:
        admin.post("/api/login", json={"username": "admin", "password": ADMIN_PASSWORD}).raise_for_status()
        return admin.get("/models/replicas/panel", params={"name": "m"}).text


def metric(gw: Any, name: str, **labels: str) -> float:
    total = 0.0
    for line in httpx.get(gw.base_url + "/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def stream(gw: Any, path: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The stream's events (parsed) and its last data line."""
    headers = {"Authorization": f"Bearer {gw.keys['acme']}"}
    body = {"model": "m", "seed": 3, "stream": True, "stream_options": {"include_usage": True}, **body}
    async with httpx.AsyncClient(base_url=gw.api_url, headers=headers, timeout=30) as client:
        async with client.stream("POST", path, json=body) as r:
            assert r.status_code == 200
            lines = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
    return [json.loads(x) for x in lines if x != "[DONE]"], lines[-1]


def read(events: list[dict[str, Any]], chat: bool) -> tuple[str, set[str], list[str], list[dict[str, Any]]]:
    text, ids, finishes, usages = "", set(), [], []
    for e in events:
        ids.add(e["id"])
        if e.get("usage"):
            usages.append(e["usage"])
        for c in e.get("choices", []):
            text += (c.get("delta", {}).get("content") or "") if chat else c.get("text", "")
            if c.get("finish_reason"):
                finishes.append(c["finish_reason"])
    return text, ids, finishes, usages


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("die_after_tokens", "engine_error"),
        ("error_after_tokens", "engine_error"),
        ("stall_after_tokens", "inter_token_timeout"),
    ],
)
@pytest.mark.parametrize("chat", [True, False])
async def test_a_stream_cut_mid_answer_is_continued_into_the_same_response(
    tmp_path: Path, pair: tuple[VLLMStandIn, VLLMStandIn], chat: bool, fault: str, reason: str
) -> None:
    failing, healthy = pair
    gw = await asyncio.to_thread(gateway, tmp_path, pair, inter_token_timeout_s=0.3)
    path, asked = (
        ("/chat/completions", {"messages": [{"role": "user", "content": "tell me more"}]})
        if chat
        else ("/completions", {"prompt": "tell me more"})
    )
    try:
        reference, _ = await stream(gw, path, {**asked, "max_tokens": 16})  # on m-a, unbroken
        setattr(failing, fault, DIES_AFTER)
        events, last = await stream(gw, path, {**asked, "max_tokens": 16})
        text, ids, finishes, usages = read(events, chat)
        want, _, _, _ = read(reference, chat)
        assert text == want and len(text.split()) == 16
        assert len(ids) == 1 and finishes == ["length"] and last == "[DONE]"
        [usage] = usages  # one usage chunk, billing what the client got
        assert usage["completion_tokens"] == 16
        continued = healthy.requests[-1]
        if chat:
            said = continued["messages"][-1]
            assert (said["role"], continued["continue_final_message"], continued["add_generation_prompt"]) == (
                "assistant",
                True,
                False,
            )
            assert len(said["content"].split()) == DIES_AFTER and want.startswith(said["content"])
        else:
            assert continued["prompt"].startswith("tell me more") and len(continued["prompt"].split()) == 3 + DIES_AFTER
        assert continued["max_tokens"] == 16 - DIES_AFTER
        rows = sorted(await asyncio.to_thread(gw.usage_rows, "acme"), key=lambda r: r.id)
        row = rows[-1]
        assert (row.status, row.deployment, row.failed_deployments, row.continuations) == (200, "m-b", "m-a", 1)
        # The failed replica never reported the prompt's count: the gateway's measurement is billed.
        assert (row.completion_tokens, row.prompt_tokens) == (16, usage["prompt_tokens"])
        assert row.continued_prompt_tokens > 0
        assert metric(gw, "laneway_continuations_total", alias="m", reason=reason) == 1
        assert metric(gw, "laneway_continuation_seam_seconds_count", alias="m") == 1
        assert gw.gateway.in_flight == 0
        if chat and fault == "die_after_tokens":  # the alias page counts it against the replica that failed
            panel = await asyncio.to_thread(replicas_panel, gw)
            failed_row = panel.split('id="replica-m-a"', 1)[1].split("</tr>", 1)[0]
            assert (
                "1 continued elsewhere" in failed_row
                and "continued elsewhere" not in panel.split('id="replica-m-b"')[1]
            )
    finally:
        await asyncio.to_thread(gw.stop)


async def test_an_answer_that_cannot_continue_ends_with_an_error_event(
    tmp_path: Path, pair: tuple[VLLMStandIn, VLLMStandIn]
) -> None:
    failing = pair[0]
    gw = await asyncio.to_thread(gateway, tmp_path, pair)
    failing.die_after_tokens = DIES_AFTER
    try:
        events, last = await stream(gw, "/completions", {"prompt": "two please", "max_tokens": 16, "n": 2})
        assert last != "[DONE]" and events[-1]["error"]["code"] == "engine_error"
        assert "n > 1" in events[-1]["error"]["message"]
        assert not any(c.get("finish_reason") for e in events for c in e.get("choices", []))
        [row] = await asyncio.to_thread(gw.usage_rows, "acme")
        assert (row.status, row.continuations) == (503, 0)
        assert metric(gw, "laneway_continuations_total") == 0
        assert gw.gateway.in_flight == 0
    finally:
        await asyncio.to_thread(gw.stop)


WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


@pytest.mark.parametrize(
    ("asked", "why"),
    [
        ({"tools": [WEATHER], "tool_choice": "required"}, "a tool call was under way"),
        ({"response_format": {"type": "json_object"}}, "a JSON grammar cannot be resumed"),
    ],
    ids=["tool_call", "json_object"],
)
async def test_a_stream_cut_mid_envelope_ends_with_an_error_never_a_corrupted_envelope(
    tmp_path: Path, pair: tuple[VLLMStandIn, VLLMStandIn], asked: dict[str, Any], why: str
) -> None:
    """A tool call's arguments, or a JSON answer, cut half-sent: the engine's grammar (its tool
    parser, its JSON mode) starts at the answer's start and cannot resume mid-value, so the
    stream is not continued: it ends with an error event saying why, never a clean [DONE]
    after a half envelope glued to a second one. Not streamed, nothing was sent: the answer
    starts again on the other replica and the client gets one whole, valid envelope."""
    failing = pair[0]
    gw = await asyncio.to_thread(functools.partial(gateway, tmp_path, pair, both={"tool_calling": True}))
    failing.die_after_tokens = 2  # after the call's name and the start of its arguments / `{"answer"`
    body = {"messages": [{"role": "user", "content": "weather in Paris?"}], "max_tokens": 16, **asked}
    try:
        events, last = await stream(gw, "/chat/completions", body)
        assert last != "[DONE]" and events[-1]["error"]["code"] == "engine_error"
        assert why in events[-1]["error"]["message"]
        assert not any(c.get("finish_reason") for e in events for c in e.get("choices", []))
        headers = {"Authorization": f"Bearer {gw.keys['acme']}"}
        async with httpx.AsyncClient(base_url=gw.api_url, headers=headers, timeout=30) as client:
            r = await client.post("/chat/completions", json={"model": "m", "seed": 3, **body})
        assert r.status_code == 200
        message = r.json()["choices"][0]["message"]
        if "tools" in asked:
            [call] = message["tool_calls"]
            assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"])["city"]
        else:
            assert isinstance(json.loads(message["content"]), dict)
        rows = sorted(await asyncio.to_thread(gw.usage_rows, "acme"), key=lambda r: r.id)
        assert [(row.status, row.continuations) for row in rows] == [(503, 0), (200, 0)]
        assert (rows[1].deployment, rows[1].failed_deployments) == ("m-b", "m-a")
        assert gw.gateway.in_flight == 0
    finally:
        await asyncio.to_thread(gw.stop)
