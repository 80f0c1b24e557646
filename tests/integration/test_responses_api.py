"""POST /v1/responses with the official OpenAI SDK against a real gateway: the tiny llama.cpp
model for the mechanics, the simulator where timing or faults matter. The request runs the
chat pipeline's whole path: usage row, rate limits, the lease released when the client leaves."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support import Gateway, wait_for
from support.surfaces import surface_gateway, usage_row

STOP = " the "  # sim-stop's stop sequence: the simulator's filler words soon contain it
MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, demo_model_path: Path) -> Iterator[Gateway]:
    g = surface_gateway(tmp_path_factory.mktemp("responses"), demo_model_path, stop=STOP, sim_decode_ms=0.5)
    yield g
    g.stop()


@pytest.fixture
def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)


# ---- the Response object -------------------------------------------------------------------------


def test_create_answers_a_response_whose_usage_is_the_usage_row(gw: Gateway, client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="tiny-exact", input="hello world", max_output_tokens=16, user="u-7", metadata={"ticket": "42"}
    )
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny-exact"
    assert r.status == "incomplete"  # every token allowed was used
    assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"
    [message] = r.output
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    assert message.status == "incomplete" and r.output_text and message.content[0].type == "output_text"
    assert r.usage is not None and r.usage.output_tokens == 16 and r.usage.input_tokens > 3
    assert r.usage.total_tokens == r.usage.input_tokens + 16
    assert r.metadata == {"ticket": "42"} and r.user == "u-7" and r.max_output_tokens == 16
    assert r.to_dict()["store"] is False  # nothing is kept
    row = usage_row(gw, r.id)
    assert (row.endpoint, row.status, row.stream, row.finish_reason) == ("responses", 200, False, "length")
    assert (row.prompt_tokens, row.completion_tokens) == (r.usage.input_tokens, 16)
    assert row.end_user == "u-7" and row.model == "tiny-exact"


def test_a_generation_that_stops_is_completed(client: openai.OpenAI) -> None:
    r = client.responses.create(model="sim-stop", input="tell me", max_output_tokens=3000)
    assert r.status == "completed" and r.incomplete_details is None and r.completed_at
    assert r.output_text and STOP not in r.output_text
    assert r.usage is not None and r.usage.output_tokens < 3000


def test_instructions_are_a_system_turn(client: openai.OpenAI) -> None:
    """The prompt the engine counted is the chat prompt with the instructions as its system turn."""
    chat = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=1)  # type: ignore[arg-type]
    assert chat.usage is not None
    for kwargs in (
        {"instructions": "be brief", "input": "hello world"},
        {"input": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]},
        {
            "input": [
                {"role": "system", "content": [{"type": "input_text", "text": "be brief"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello world"}]},
            ]
        },
    ):
        r = client.responses.create(model="tiny", max_output_tokens=1, **kwargs)  # type: ignore[call-overload]
        assert r.usage is not None and r.usage.input_tokens == chat.usage.prompt_tokens, kwargs
    bare = client.responses.create(model="tiny", input="hello world", max_output_tokens=1)
    assert bare.usage is not None and bare.usage.input_tokens < chat.usage.prompt_tokens


def test_a_previous_responses_output_sent_back_is_the_conversation(client: openai.OpenAI) -> None:
    """Stateless multi-turn, as OpenAI's docs do it (`input += response.output`): the output
    items come back with their ids and statuses and are read as the assistant's turn."""
    first = client.responses.create(model="tiny-exact", input="hello world", max_output_tokens=8)
    history: list[Any] = [MSGS[1], *first.output, {"role": "user", "content": "and?"}]
    second = client.responses.create(model="tiny", input=history, max_output_tokens=1)
    turns = [MSGS[1], {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "and?"}]
    chat = client.chat.completions.create(model="tiny", messages=turns, max_tokens=1)  # type: ignore[arg-type]
    assert second.usage is not None and chat.usage is not None
    assert second.usage.input_tokens == chat.usage.prompt_tokens


# ---- streaming -----------------------------------------------------------------------------------


def sse(body: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_stream_sends_openais_events_in_order(gw: Gateway) -> None:
    with httpx.stream(
        "POST",
        gw.api_url + "/responses",
        headers={"Authorization": f"Bearer {gw.keys['acme']}"},
        json={"model": "sim-stop", "input": "tell me", "stream": True},
        timeout=30,
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse(r.read().decode())
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    deltas = names.count("response.output_text.delta")
    assert deltas >= 1 and "[DONE]" not in json.dumps(events)
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    text = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    done = events[-1][1]["response"]
    assert text and done["output"][0]["content"][0]["text"] == text == events[-4][1]["text"]
    assert done["id"] == events[0][1]["response"]["id"] == r.headers["x-request-id"]
    assert done["status"] == "completed" and done["usage"]["output_tokens"] > 0


def test_sdk_stream_helper_yields_the_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(model="sim-stop", input="tell me") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == "".join(deltas) and deltas
    assert final.usage is not None and final.usage.output_tokens > 0
    assert final.output_text == client.responses.create(model="sim-stop", input="tell me").output_text


def test_sdk_stream_that_hits_max_output_tokens_ends_incomplete(client: openai.OpenAI) -> None:
    greedy = {"model": "tiny-exact", "input": "hello world", "max_output_tokens": 12, "temperature": 0}
    events = list(client.responses.create(stream=True, **greedy))  # type: ignore[call-overload]
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    last = events[-1].response
    assert last.incomplete_details is not None and last.incomplete_details.reason == "max_output_tokens"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == last.output_text == client.responses.create(**greedy).output_text
    assert last.usage is not None and last.usage.output_tokens == 12


def test_engine_fault_mid_stream_ends_with_response_failed(client: openai.OpenAI) -> None:
    fault = {"model": "sim", "input": "<<laneway-sim-fault>>", "max_output_tokens": 50}
    events = list(client.responses.create(stream=True, **fault))  # type: ignore[call-overload]
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].code == "engine_error" and "simulated engine fault" in events[-2].message
    assert events[-1].response.status == "failed" and events[-1].response.error is not None
    with pytest.raises(openai.InternalServerError) as info:  # non-streaming: a 503 before any byte
        client.responses.create(**fault)
    assert info.value.status_code == 503 and info.value.body["code"] == "engine_error"  # type: ignore[index]


# ---- refusals and limits -------------------------------------------------------------------------

FUNCTION = {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {}}}


@pytest.mark.parametrize(
    ("kwargs", "code", "param"),
    [
        ({"previous_response_id": "resp_abc"}, "unsupported_parameter", "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "unsupported_parameter", "tools[0].type"),
        ({"tools": [FUNCTION]}, "unsupported_parameter", "tools"),  # the sim engine has no tool calls
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}},
            "unsupported_parameter",
            "text.format",
        ),
        ({"reasoning": {"effort": "high"}}, "unsupported_parameter", "reasoning"),
        ({"extra_body": {"frobnicate": True}}, "unknown_parameter", "frobnicate"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
            "unsupported_parameter",
            "input[0].content[0]",
        ),
        ({"temperature": 5}, "invalid_request", "temperature"),
        ({"user": "a\x00b"}, "invalid_request", "user"),  # kept on the usage row: PostgreSQL text can't hold NUL
    ],
)
def test_what_cannot_be_honoured_is_a_bad_request(client: openai.OpenAI, kwargs: dict, code: str, param: str) -> None:
    args = {"model": "sim", "input": "hi", "max_output_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**args)
    assert (info.value.body["code"], info.value.body["param"]) == (code, param)  # type: ignore[index]
    assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]


def test_rate_limit_is_429_as_for_chat(gw: Gateway) -> None:
    limited = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["limited"], max_retries=0)
    assert limited.responses.create(model="sim", input="hi", max_output_tokens=2).status == "incomplete"
    with pytest.raises(openai.RateLimitError) as info:
        limited.responses.create(model="sim", input="hi", max_output_tokens=2)
    assert info.value.response.headers["retry-after"]
    with pytest.raises(openai.RateLimitError):  # the same bucket as the chat endpoint
        limited.chat.completions.create(model="sim", messages=MSGS, max_tokens=2)  # type: ignore[arg-type]


def test_client_gone_mid_stream_releases_the_lease(gw: Gateway) -> None:
    payload = json.dumps({"model": "sim", "input": "go", "stream": True, "max_output_tokens": 4000}).encode()
    sock = socket.create_connection(("127.0.0.1", gw.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends RST
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {gw.keys['acme']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    sock.settimeout(10)
    data = b""
    while b"response.output_text.delta" not in data:
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    request_id = next(line.split(": ")[1] for line in data.decode().split("\r\n") if line.startswith("x-request-id"))
    sock.close()
    pipeline = gw.gateway
    wait_for(lambda: pipeline.in_flight == 0, what="every lease released")
    deployment = pipeline.registry.resolve("sim").engine
    wait_for(lambda: deployment.active_slots == 0, what="the engine idle")
    row = usage_row(gw, request_id)
    assert (row.endpoint, row.status, row.error_code, row.stream) == ("responses", 499, "client_disconnected", True)
    assert 0 < row.completion_tokens < 4000


# ---- function tools and JSON output (llama.cpp: grammar-constrained) -----------------------------

UNIT = {
    "type": "function",
    "name": "set_unit",
    "parameters": {
        "type": "object",
        "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["unit"],
        "additionalProperties": False,
    },
}


def test_a_required_function_call_is_a_function_call_item(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="tiny",
        input="hello",
        tools=[UNIT],
        tool_choice="required",  # type: ignore[list-item]
        parallel_tool_calls=False,
        max_output_tokens=200,
    )
    assert r.status == "completed"
    [item] = r.output
    assert item.type == "function_call" and item.name == "set_unit" and item.call_id.startswith("call_")
    assert json.loads(item.arguments)["unit"] in ("celsius", "fahrenheit")
    # The call and its output sent back as input: the next turn sees both.
    follow = client.responses.create(
        model="tiny",
        input=[
            {"role": "user", "content": "hello"},
            item.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"type": "function_call_output", "call_id": item.call_id, "output": "done"},
        ],
        tools=[UNIT],  # type: ignore[list-item]
        max_output_tokens=2,
    )
    assert follow.usage is not None and r.usage is not None and follow.usage.input_tokens > r.usage.input_tokens


def test_a_streamed_function_call_sends_its_arguments_events(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="tiny",
        input="hello",
        tools=[UNIT],
        tool_choice="required",  # type: ignore[list-item]
        parallel_tool_calls=False,
        max_output_tokens=200,
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    assert final.output[0].type == "function_call"


def test_text_format_json_schema_is_honoured(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        model="tiny",
        input="hello",
        max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "v", "schema": schema}},
    )
    assert isinstance(json.loads(r.output_text)["ok"], bool)
