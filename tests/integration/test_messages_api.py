"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) through the official
`anthropic` SDK against a real gateway: the tiny llama.cpp model for the mechanics (tool calls
are grammar-constrained there), the simulator where stop strings or limits matter. The request
runs the chat pipeline's whole path: the usage row, the rate limits, the same prompt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from support import Gateway
from support.surfaces import surface_gateway, usage_row

STOP = " the "  # the simulator's filler words soon contain it
HELLO: list[Any] = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, demo_model_path: Path) -> Iterator[Gateway]:
    g = surface_gateway(tmp_path_factory.mktemp("messages"), demo_model_path, stop=STOP, sim_decode_ms=0.1)
    yield g
    g.stop()


@pytest.fixture
def client(gw: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.base_url, api_key=gw.keys["acme"], max_retries=0)


# ---- a message -----------------------------------------------------------------------------------


def test_a_message_is_billed_as_its_usage_says(gw: Gateway, client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model="tiny-exact", max_tokens=16, messages=HELLO, system="be brief", metadata={"user_id": "u-7"}
    )
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == "tiny-exact"
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    [block] = m.content
    assert block.type == "text" and block.text
    assert m.usage.output_tokens == 16 and m.usage.input_tokens > 3
    row = usage_row(gw, m.id)
    assert (row.endpoint, row.status, row.stream, row.finish_reason) == ("messages", 200, False, "length")
    assert (row.prompt_tokens, row.completion_tokens) == (m.usage.input_tokens, 16)
    assert row.end_user == "u-7" and row.model == "tiny-exact"


def test_the_key_is_taken_as_a_bearer_token_too(gw: Gateway) -> None:
    bearer = anthropic.Anthropic(base_url=gw.base_url, auth_token=gw.keys["acme"], max_retries=0)
    assert bearer.messages.create(model="sim", max_tokens=2, messages=HELLO).usage.output_tokens == 2


def test_a_stop_string_of_the_model_ends_the_turn(client: anthropic.Anthropic) -> None:
    """Only the request's own stop_sequences are `stop_sequence`; the model's own end its turn."""
    m = client.messages.create(model="sim-stop", max_tokens=3000, messages=HELLO)
    assert (m.stop_reason, m.stop_sequence) == ("end_turn", None) and m.usage.output_tokens < 3000


# ---- a stream ------------------------------------------------------------------------------------


def test_a_stream_reads_as_the_sdk_expects(gw: Gateway, client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="tiny-exact", max_tokens=12, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12
    row = usage_row(gw, final.id)
    assert (row.endpoint, row.stream, row.completion_tokens) == ("messages", True, 12)
    assert row.prompt_tokens == final.usage.input_tokens


def test_stream_events_come_in_anthropics_order(gw: Gateway) -> None:
    body = {"model": "tiny-exact", "max_tokens": 4, "messages": HELLO, "stream": True}
    headers = {"x-api-key": gw.keys["acme"], "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", f"{gw.base_url}/v1/messages", json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        names = [line[len("event: ") :] for line in r.iter_lines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


# ---- tools ---------------------------------------------------------------------------------------

UNIT = {
    "name": "set_unit",
    "description": "Set the temperature unit.",
    "input_schema": {
        "type": "object",
        "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["unit"],
        "additionalProperties": False,
    },
}
ONE_CALL: Any = {"type": "any", "disable_parallel_tool_use": True}


def test_a_tool_call_and_its_result_in_a_second_turn(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model="tiny", max_tokens=200, messages=HELLO, tools=[UNIT], tool_choice=ONE_CALL)  # type: ignore[list-item]
    assert m.stop_reason == "tool_use"
    [call] = m.content
    assert call.type == "tool_use" and call.name == "set_unit" and call.input["unit"] in ("celsius", "fahrenheit")  # type: ignore[index]
    follow = client.messages.create(
        model="tiny",
        max_tokens=2,
        tools=[UNIT],  # type: ignore[list-item]
        messages=[
            *HELLO,
            {"role": "assistant", "content": [block.model_dump() for block in m.content]},  # type: ignore[misc]
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "done"}]},
        ],
    )
    assert follow.usage.input_tokens > m.usage.input_tokens  # the call and its result are in the prompt


def test_a_streamed_tool_call_sends_its_input_as_json_deltas(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="tiny",
        max_tokens=200,
        messages=HELLO,
        tools=[UNIT],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "set_unit", "disable_parallel_tool_use": True},
    ) as stream:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
        final = stream.get_final_message()
    assert ("content_block_delta", "input_json_delta") in kinds
    assert final.stop_reason == "tool_use"
    block = final.content[-1]
    assert block.type == "tool_use" and block.input["unit"] in ("celsius", "fahrenheit")  # type: ignore[index]


# ---- count_tokens, stop sequences, limits --------------------------------------------------------


def test_count_tokens_is_what_a_message_is_billed(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model="tiny", messages=HELLO, system="be brief")
    m = client.messages.create(model="tiny", max_tokens=1, messages=HELLO, system="be brief")
    assert counted.input_tokens == m.usage.input_tokens > 3
    with_tools = client.messages.count_tokens(model="tiny", messages=HELLO, tools=[UNIT])  # type: ignore[list-item]
    assert with_tools.input_tokens > client.messages.count_tokens(model="tiny", messages=HELLO).input_tokens


def test_a_stop_sequence_ends_the_text_and_is_named(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model="sim", max_tokens=3000, messages=HELLO, stop_sequences=[STOP])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == STOP
    assert STOP not in m.content[0].text and m.usage.output_tokens < 3000  # type: ignore[union-attr]
    with client.messages.stream(model="sim", max_tokens=3000, messages=HELLO, stop_sequences=[STOP]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == STOP


def test_a_rate_limit_is_a_rate_limit_error_with_retry_after(gw: Gateway) -> None:
    limited = anthropic.Anthropic(base_url=gw.base_url, api_key=gw.keys["limited"], max_retries=0)
    limited.messages.create(model="sim", max_tokens=2, messages=HELLO)
    with pytest.raises(anthropic.RateLimitError) as info:
        limited.messages.create(model="sim", max_tokens=2, messages=HELLO)
    assert int(info.value.response.headers["retry-after"]) >= 1
    assert info.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    with pytest.raises(openai.RateLimitError):  # the same bucket as the chat endpoint
        openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["limited"], max_retries=0).chat.completions.create(
            model="sim", messages=HELLO, max_tokens=2
        )


def test_a_bad_key_is_an_authentication_error(gw: Gateway) -> None:
    bad = anthropic.Anthropic(base_url=gw.base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        bad.messages.create(model="sim", max_tokens=2, messages=HELLO)
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_an_unknown_model_is_not_found(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="nope", max_tokens=2, messages=HELLO)
    assert info.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


# ---- the same conversation through chat completions ----------------------------------------------


def test_chat_and_messages_give_the_same_text_and_bill_the_same(gw: Gateway, client: anthropic.Anthropic) -> None:
    chat = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0).chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}],
        max_tokens=24,
        temperature=0,
    )
    m = client.messages.create(
        model="tiny", max_tokens=24, system="be brief", messages=HELLO, extra_body={"temperature": 0}
    )
    assert m.content[0].text == chat.choices[0].message.content  # type: ignore[union-attr]
    chat_row, message_row = usage_row(gw, chat.id), usage_row(gw, m.id)
    assert (chat_row.endpoint, message_row.endpoint) == ("chat", "messages")
    assert (message_row.prompt_tokens, message_row.completion_tokens) == (
        chat_row.prompt_tokens,
        chat_row.completion_tokens,
    )
    assert message_row.cost_micros == chat_row.cost_micros


# ---- bad input: Anthropic-shaped 400s naming the field, nothing run ------------------------------

TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "set_unit", "input": {"unit": "celsius"}}
DEEP = "[" * 10_000 + "]" * 10_000


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": "sim", "max_tokens": 4, "messages": HELLO, **fields}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"model": "sim", "messages": HELLO}, "max_tokens"),
        (_body(max_tokens=0), "max_tokens"),
        (_body(messages=[{"role": "assistant", "content": "hi"}, *HELLO]), "messages[0].role"),
        (_body(messages=[{"role": "system", "content": "hi"}, *HELLO]), "messages[0].role"),
        (_body(messages=[*HELLO, {"role": "assistant", "content": "prefill"}]), "messages[1]"),
        (
            _body(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]}]),
            "messages[0].content[0].tool_use_id",
        ),
        (
            _body(messages=[*HELLO, {"role": "assistant", "content": [TOOL_USE]}, {"role": "user", "content": "and?"}]),
            "messages[2].content",
        ),
        (_body(messages=[{"role": "user", "content": [{"type": "hologram"}]}]), "messages[0].content[0].type"),
        (_body(messages=[{"role": "user", "content": []}]), "messages[0].content"),
        (
            _body(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]),
            "messages[0].content[0].type",
        ),
        (_body(messages=[{"role": "user", "content": "a\u0000b"}]), "messages[0].content"),
        (
            _body(messages=[{"role": "user", "content": [{"type": "text", "text": "\u0000"}]}]),
            "messages[0].content[0].text",
        ),
        (_body(stop_sequences=["\u0000"]), "stop_sequences[0]"),
        (_body(system=[{"type": "text", "text": "\u0000"}]), "system[0].text"),
        (_body(thinking={"type": "enabled", "budget_tokens": 1024}), "thinking"),
        (_body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type"),
        (_body(tools=[{"name": "bad name!", "input_schema": {}}]), "tools[0].name"),
        (_body(tool_choice={"type": "any"}), "tool_choice"),
        (_body(output_config={"effort": "low"}), "output_config.effort"),
        (_body(temperature=1.5), "temperature"),
        (_body(n=2), "n"),
        (_body(mcp_servers=[{"type": "url", "url": "https://x", "name": "x"}]), "mcp_servers"),
    ],
)
def test_bad_input_is_an_anthropic_400_naming_the_field(gw: Gateway, body: dict[str, Any], named: str) -> None:
    r = httpx.post(f"{gw.base_url}/v1/messages", json=body, headers={"x-api-key": gw.keys["acme"]}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert named in error["error"]["message"], error


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b'{"model": "sim", "max_tokens": 4, "messages": [{"role": "user", "content": "\xff\xfe"}]}', "UTF-8"),
        (
            b'{"model": "sim", "max_tokens": 4, "messages": '
            + b'[{"role": "user", "content": [{"type": "tool_use", "input": '
            + DEEP.encode()
            + b"}]}]}",
            "nested",
        ),
        (b"", "empty"),
    ],
)
def test_unreadable_bodies_are_anthropic_400s(gw: Gateway, content: bytes, says: str) -> None:
    headers = {"x-api-key": gw.keys["acme"], "content-type": "application/json"}
    r = httpx.post(f"{gw.base_url}/v1/messages", content=content, headers=headers, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert says in r.json()["error"]["message"]


def test_a_bad_anthropic_version_is_named(gw: Gateway) -> None:
    headers = {"x-api-key": gw.keys["acme"], "anthropic-version": "latest"}
    r = httpx.post(f"{gw.base_url}/v1/messages", json=_body(), headers=headers, timeout=30)
    assert r.status_code == 400 and "anthropic-version" in r.json()["error"]["message"]
    headers["anthropic-version"] = "2023-06-01"
    assert httpx.post(f"{gw.base_url}/v1/messages", json=_body(), headers=headers, timeout=30).status_code == 200


def test_refusals_before_the_handler_are_anthropic_shaped_too(gw: Gateway) -> None:
    """No key, a wrong method: Anthropic's shape on every path under /v1/messages."""
    r = httpx.post(f"{gw.base_url}/v1/messages", json=_body(), timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.get(f"{gw.base_url}/v1/messages", timeout=30)
    assert r.json()["type"] == "error" and r.status_code == 405
    r = httpx.post(f"{gw.base_url}/v1/chat/completions", json=_body(), timeout=30)
    assert "type" not in r.json() and r.json()["error"]["code"] == "invalid_api_key"  # OpenAI's, unchanged


def test_messages_lines_run_as_a_batch(gw: Gateway) -> None:
    """OpenAI's Batch API with /v1/messages lines (Anthropic's own batch API is not served)."""
    from support.batches import file_lines, jsonl, line, run_batch, wait_ended

    c = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
    body = {"model": "sim", "max_tokens": 3, "messages": HELLO}
    batch = run_batch(c, jsonl(line(f"r{i}", "/v1/messages", body) for i in range(2)), "/v1/messages")
    done = wait_ended(c, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 2
    output = file_lines(c, done.output_file_id)
    assert {x["response"]["body"]["type"] for x in output.values()} == {"message"}
    assert output["r0"]["response"]["body"]["usage"]["output_tokens"] == 3
    with pytest.raises(openai.BadRequestError):  # count_tokens generates nothing: no batch of it
        run_batch(c, jsonl([line("a", "/v1/messages/count_tokens", body)]), "/v1/messages/count_tokens")
