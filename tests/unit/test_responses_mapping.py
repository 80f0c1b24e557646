"""The Responses API's mapping onto the chat pipeline, without HTTP: input items -> chat turns,
tools -> the chat shape, what is refused, and deltas (hand-built, tool calls included) -> output
items and stream events, checked against the official SDK's own models."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pydantic
import pytest
from laneway.api.responses import protocol as rp
from laneway.api.responses.assembler import ResponseAssembler
from laneway.api.responses.request import (
    chat_response_format,
    chat_tool_choice,
    chat_tools,
    feature_arguments,
    input_turns,
    refuse_unsupported,
    text_format,
)
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.types import ChatTurn, Delta, ToolCall
from openai.types.responses import Response, ResponseStreamEvent

STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


def request(**fields: Any) -> rp.ResponsesRequest:
    return msgspec.convert({"model": "m", "input": "hi", **fields}, rp.ResponsesRequest)


def refused(exc: pytest.ExceptionInfo[GatewayError]) -> tuple[int, str | None, str | None]:
    return exc.value.status, exc.value.code, exc.value.param


# ---- input -> chat turns -------------------------------------------------------------------------


def test_instructions_are_a_system_turn_before_a_string_input() -> None:
    assert input_turns("be brief", "hello") == [ChatTurn("system", "be brief"), ChatTurn("user", "hello")]
    assert input_turns(None, "hello") == [ChatTurn("user", "hello")]


def test_message_items_of_every_role_and_text_part() -> None:
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "more"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        # A previous response's output item sent back as input: its extra fields do not matter.
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "answer", "annotations": [], "logprobs": []}],
        },
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
    ]
    assert input_turns("first", items) == [
        ChatTurn("system", "first"),
        ChatTurn("developer", "rules"),
        ChatTurn("system", "more"),
        ChatTurn("user", "ab"),
        ChatTurn("assistant", "answer"),
        ChatTurn("assistant", "no"),
    ]


def test_function_calls_join_the_assistant_turn_and_outputs_are_tool_turns() -> None:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"role": "assistant", "content": "Checking."},
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city":"Paris"}'},
        {
            "type": "function_call",
            "id": "fc_2",
            "call_id": "call_2",
            "name": "weather",
            "arguments": '{"city":"Rome"}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "function_call", "call_id": "call_3", "name": "clock", "arguments": "{}"},
    ]
    paris = ToolCall(id="call_1", name="weather", arguments='{"city":"Paris"}', index=0)
    rome = ToolCall(id="call_2", name="weather", arguments='{"city":"Rome"}', index=1)
    assert input_turns(None, items) == [
        ChatTurn("user", "weather in Paris and Rome?"),
        ChatTurn("assistant", "Checking.", tool_calls=(paris, rome)),
        ChatTurn("tool", "sunny", tool_call_id="call_1"),
        ChatTurn("tool", "rain", tool_call_id="call_2"),
        ChatTurn("assistant", "", tool_calls=(ToolCall(id="call_3", name="clock", arguments="{}", index=0),)),
    ]


@pytest.mark.parametrize(
    ("items", "code", "param"),
    [
        (
            [{"role": "user", "content": [{"type": "input_text", "text": "x"}, {"type": "input_image"}]}],
            "unsupported_parameter",
            "input[0].content[1]",
        ),
        (
            [{"role": "user", "content": "x"}, {"type": "item_reference", "id": "msg_1"}],
            "unsupported_parameter",
            "input[1]",
        ),
        ([{"type": "reasoning", "summary": []}], "unsupported_parameter", "input[0].type"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "invalid_request", "input[0].call_id"),
        ([{"role": "tool", "content": "x"}], "invalid_request", "input[0].role"),
        (
            [{"role": "user", "content": [{"type": "input_text", "text": 5}]}],
            "invalid_request",
            "input[0].content[0].text",
        ),
        ([], "invalid_request", "input"),
    ],
)
def test_input_that_cannot_be_read_is_a_400_naming_the_item(items: list[Any], code: str, param: str) -> None:
    with pytest.raises(GatewayError) as info:
        input_turns(None, items)
    assert refused(info) == (400, code, param)


# ---- tools ---------------------------------------------------------------------------------------


def test_function_tools_map_to_the_chat_shape() -> None:
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [
        {"type": "function", "name": "weather", "description": "Weather now", "parameters": params, "strict": True},
        {"type": "function", "name": "clock", "defer_loading": False},
    ]
    assert chat_tools(tools) == (
        {
            "type": "function",
            "function": {"name": "weather", "description": "Weather now", "parameters": params, "strict": True},
        },
        {"type": "function", "function": {"name": "clock"}},
    )
    assert chat_tools(None) == ()


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([{"type": "function", "name": "f"}, {"type": "web_search"}], "tools[1].type"),
        ([{"type": "file_search", "vector_store_ids": ["vs_1"]}], "tools[0].type"),
        ([{"type": "function"}], "tools[0].name"),
    ],
)
def test_hosted_tools_and_malformed_functions_are_refused_by_name(tools: list[Any], param: str) -> None:
    with pytest.raises(GatewayError) as info:
        chat_tools(tools)
    assert info.value.status == 400 and info.value.param == param


def test_tool_choice_maps_to_the_chat_shape() -> None:
    assert [chat_tool_choice(c) for c in (None, "none", "auto", "required")] == [None, "none", "auto", "required"]
    assert chat_tool_choice({"type": "function", "name": "weather"}) == {
        "type": "function",
        "function": {"name": "weather"},
    }
    for choice in ({"type": "web_search_preview"}, {"type": "allowed_tools", "mode": "auto", "tools": []}, "any"):
        with pytest.raises(GatewayError) as info:
            chat_tool_choice(choice)
        assert refused(info) == (400, "unsupported_parameter", "tool_choice")


def test_text_format_maps_to_the_chat_response_format() -> None:
    assert text_format(None) == text_format({"verbosity": "medium"}) == {"type": "text"}
    assert chat_response_format({"type": "text"}) is None
    assert chat_response_format({"type": "json_object"}) == {"type": "json_object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
    assert chat_response_format(text_format({"format": fmt})) == {
        "type": "json_schema",
        "json_schema": {"name": "thing", "schema": schema, "strict": True},
    }
    for bad, code, param in [
        ({"type": "json_schema", "schema": schema}, "invalid_request", "text.format.name"),
        ({"type": "grammar"}, "unsupported_parameter", "text.format"),
    ]:
        with pytest.raises(GatewayError) as info:
            chat_response_format(bad)
        assert refused(info) == (400, code, param)


def test_tools_and_json_output_are_handed_to_the_pipeline_in_the_chat_shapes() -> None:
    tool = ({"type": "function", "function": {"name": "f"}},)
    plain = [ChatTurn("user", "hi")]
    assert feature_arguments((), None, None, None, plain) == {
        "tools": [],
        "tool_choice": None,
        "parallel_tool_calls": True,
        "response_format": None,
    }
    fmt = {"type": "json_object"}
    assert feature_arguments(tool, "required", False, fmt, plain) == {
        "tools": list(tool),
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "response_format": fmt,
    }


# ---- what is refused -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
        ({"context_management": [{"type": "compaction"}]}, "context_management"),
    ],
)
def test_what_laneway_cannot_honour_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as info:
        refuse_unsupported(request(**fields))
    assert refused(info) == (400, "unsupported_parameter", param)
    if param == "previous_response_id":
        assert "stores no responses" in info.value.message


def test_the_values_that_ask_for_nothing_pass() -> None:
    refuse_unsupported(
        request(
            store=True,
            reasoning={},
            text={"format": {"type": "text"}, "verbosity": "medium"},
            truncation="disabled",
            top_logprobs=0,
            include=["reasoning.encrypted_content"],
            service_tier="auto",
            prompt_cache_key="k",
            safety_identifier="s",
            max_tool_calls=3,
            stream=True,
            stream_options={"include_obfuscation": False},
        )
    )
    with pytest.raises(GatewayError) as info:
        refuse_unsupported(request(stream_options={"include_obfuscation": False}))
    assert info.value.param == "stream_options"


# ---- deltas -> output items and events -----------------------------------------------------------

USAGE = rp.ResponseUsage(input_tokens=7, output_tokens=3, total_tokens=10)


def assembler(*, stream: bool = True) -> ResponseAssembler:
    base = rp.ResponseObject(id="resp_1", created_at=1, status="in_progress", model="tiny", output=[])
    return ResponseAssembler(base, lambda: USAGE, stream=stream)


def run(deltas: list[Delta], *, stream: bool = True) -> tuple[ResponseAssembler, list[dict[str, Any]]]:
    """Feed the deltas; return the assembler and the events, each checked as the SSE framing
    (`event:` line = `type`) and against the SDK's event model (every required field)."""
    a = assembler(stream=stream)
    frames = [a.start()] + [frame for d in deltas for frame in a.feed(d)]
    events = []
    for block in b"".join(frames).split(b"\n\n")[:-1]:
        head, data = block.split(b"\n")
        event = json.loads(data.removeprefix(b"data: "))
        assert head == b"event: " + event["type"].encode()
        STREAM_EVENT.validate_python(event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return a, events


def final(a: ResponseAssembler) -> Response:
    return Response.model_validate(json.loads(msgspec.json.encode(a.response())))


def test_text_streams_in_openais_event_order_and_completes() -> None:
    a, events = run([Delta("Hel"), Delta("lo"), Delta("", tokens=0, finish_reason="stop")])
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    added, done = events[2]["item"], events[8]["item"]
    assert added["status"] == "in_progress" and added["content"] == [] and added["id"].startswith("msg_")
    assert {e.get("item_id") for e in events[3:8]} == {added["id"]} == {done["id"]}
    assert events[3]["part"] == {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    assert [e["delta"] for e in events[4:6]] == ["Hel", "lo"] and events[6]["text"] == "Hello"
    assert done["status"] == "completed" and done["content"][0]["text"] == "Hello"
    completed = events[-1]["response"]
    assert completed["status"] == "completed" and completed["usage"]["total_tokens"] == 10
    response = final(a)
    assert response.output_text == "Hello" and response.status == "completed" and response.completed_at
    assert response.usage is not None and response.usage.input_tokens == 7 and response.incomplete_details is None


def test_length_is_incomplete_for_max_output_tokens() -> None:
    a, events = run([Delta("Hi"), Delta(" there", finish_reason="length")])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-2]["item"]["status"] == "incomplete"
    response = final(a)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens" and response.output_text == "Hi there"


def test_no_text_at_all_is_still_one_empty_message() -> None:
    a, events = run([Delta("", tokens=0, finish_reason="stop")])
    assert [e["type"] for e in events[2:]] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final(a).output_text == ""


def test_tool_call_fragments_become_function_call_items() -> None:
    deltas = [
        Delta("Let me check."),
        Delta("", tool_calls=(ToolCall(id="call_a", name="weather", arguments='{"ci', index=0),)),
        Delta("", tool_calls=(ToolCall(id="", name="", arguments='ty":"Paris"}', index=0),)),
        Delta("", tool_calls=(ToolCall(id="call_b", name="clock", arguments="{}", index=1),)),
        Delta("", tokens=0, finish_reason="tool_calls"),
    ]
    a, events = run(deltas)
    assert [e["type"] for e in events[2:]] == [
        "response.output_item.added",  # the message
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",  # a call opening closes the text before it
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # call_a
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.output_item.added",  # call_b
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    first, second = events[8]["item"], events[11]["item"]
    assert (first["type"], first["call_id"], first["name"], first["arguments"]) == (
        "function_call",
        "call_a",
        "weather",
        "",
    )
    assert events[8]["output_index"] == 1 and events[11]["output_index"] == 2 and second["call_id"] == "call_b"
    assert {e["item_id"] for e in events[9:11]} == {first["id"]} and first["id"].startswith("fc_")
    assert events[13]["arguments"] == '{"city":"Paris"}' and events[14]["item"]["status"] == "completed"
    response = final(a)
    assert response.status == "completed" and response.output_text == "Let me check."
    calls = [(o.type, getattr(o, "call_id", None), getattr(o, "arguments", None)) for o in response.output]
    assert calls == [
        ("message", None, None),
        ("function_call", "call_a", '{"city":"Paris"}'),
        ("function_call", "call_b", "{}"),
    ]


def test_non_streaming_builds_the_same_output_and_no_events() -> None:
    deltas = [Delta("a"), Delta("", tool_calls=(ToolCall("call_1", "f", "{}"),)), Delta("", finish_reason="tool_calls")]
    streamed, _ = run(deltas)
    a = assembler(stream=False)
    assert a.start() == b"" and all(a.feed(d) == [] for d in deltas)
    strip = [{k: v for k, v in o.model_dump().items() if k != "id"} for o in final(streamed).output]
    assert [{k: v for k, v in o.model_dump().items() if k != "id"} for o in final(a).output] == strip


def test_a_failure_mid_stream_ends_with_an_error_event_and_response_failed() -> None:
    a, events = run([Delta("partial")])
    tail = a.failed(GatewayError(ErrorCode.ENGINE_ERROR, "The engine failed"))
    blocks = [json.loads(b.split(b"\ndata: ")[1]) for b in tail.split(b"\n\n")[:-1]]
    for block in blocks:
        STREAM_EVENT.validate_python(block)
    assert [b["type"] for b in blocks] == ["error", "response.failed"]
    assert blocks[0]["code"] == "engine_error" and blocks[0]["sequence_number"] == len(events)
    failed = blocks[1]["response"]
    assert failed["status"] == "failed" and failed["error"] == {"code": "server_error", "message": "The engine failed"}
    assert failed["output"][0]["content"][0]["text"] == "partial" and failed["output"][0]["status"] == "incomplete"
