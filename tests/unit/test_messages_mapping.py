"""Anthropic's Messages API onto the chat pipeline, without HTTP: messages -> chat turns (tool
calls and results paired), tools and tool_choice -> the chat shapes, and deltas (tool-call
fragments included) -> content blocks and stream events, checked against the official
`anthropic` SDK's own models."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from laneway.api.messages import protocol as mp
from laneway.api.messages.stream import MessageAssembler, text_delta_event
from laneway.api.messages.translate import chat_tool_choice, chat_tools, chat_turns
from laneway.api.sse import named_event
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import Call
from laneway.types import ChatTurn, Delta, ToolCall

STREAM_EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


def conversation(*messages: dict[str, Any], **fields: Any) -> mp.ConversationRequest:
    return msgspec.convert({"model": "m", "messages": list(messages), **fields}, mp.CountTokensRequest)


def test_tool_uses_and_results_become_chat_tool_calls_and_tool_turns() -> None:
    req = conversation(
        {"role": "user", "content": "weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "?"}],
                    "is_error": True,
                },
                {"type": "text", "text": "and tomorrow?", "cache_control": {"type": "ephemeral"}},
            ],
        },
        {"role": "user", "content": "in Celsius"},  # combined with the one before, as Anthropic does
        system=[{"type": "text", "text": "be brief"}, {"type": "text", "text": "be kind"}],
    )
    paris = ToolCall(id="toolu_1", name="weather", arguments='{"city":"Paris"}', index=0)
    rome = ToolCall(id="toolu_2", name="weather", arguments='{"city":"Rome"}', index=1)
    assert chat_turns(req) == [
        ChatTurn("system", "be brief\nbe kind"),
        ChatTurn("user", "weather in Paris and Rome?"),
        ChatTurn("assistant", "Checking.", tool_calls=(paris, rome)),
        ChatTurn("tool", "sunny", tool_call_id="toolu_1"),
        ChatTurn("tool", "Error: ?", tool_call_id="toolu_2"),
        ChatTurn("user", "and tomorrow?\nin Celsius"),
    ]


def test_tools_and_tool_choice_take_the_chat_shapes() -> None:
    tools = chat_tools([{"name": "clock", "description": "now", "input_schema": {"type": "object"}}])
    assert tools == [
        {"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}, "description": "now"}}
    ]
    names = {"clock"}
    assert chat_tool_choice({"type": "auto"}, names) == ("auto", True)
    assert chat_tool_choice({"type": "any", "disable_parallel_tool_use": True}, names) == ("required", False)
    assert chat_tool_choice({"type": "none"}, names) == ("none", True)
    assert chat_tool_choice({"type": "tool", "name": "clock"}, names) == (
        {"type": "function", "function": {"name": "clock"}},
        True,
    )
    with pytest.raises(GatewayError) as info:
        chat_tool_choice({"type": "tool", "name": "other"}, names)
    assert info.value.param == "tool_choice.name"


def fake_call(finish: str | None, *, stop_sequence: str | None = None) -> Call:
    return cast(
        Call,
        SimpleNamespace(
            request_id="msg_1",
            public_model="m",
            finish_reason=finish,
            stop_sequence=stop_sequence,
            prompt_tokens=7,
            completion_tokens=5,
        ),
    )


def run(call: Call, deltas: list[Delta], **kwargs: Any) -> tuple[MessageAssembler, list[dict[str, Any]]]:
    """Feed the deltas; return the assembler and the events, each checked as the SSE framing
    (`event:` line = `type`) and against the SDK's event model."""
    a = MessageAssembler(call, stream=True, **kwargs)
    frames = [a.start()] + [frame for d in deltas for frame in a.feed(d)]
    events = []
    for block in b"".join(frames).split(b"\n\n")[:-1]:
        head, data = block.split(b"\n")
        event = json.loads(data.removeprefix(b"data: "))
        assert head == b"event: " + event["type"].encode()
        if event["type"] != "ping":  # the SDK skips pings: not in its event union
            STREAM_EVENT.validate_python(event)
        events.append(event)
    return a, events


def final(a: MessageAssembler) -> Message:
    return Message.model_validate(json.loads(msgspec.json.encode(a.message(final=True))))


def test_text_then_tool_calls_stream_as_blocks_in_anthropics_order() -> None:
    deltas = [
        Delta("Let me check."),
        Delta("", tool_calls=(ToolCall(id="call_a", name="weather", arguments='{"ci', index=0),)),
        Delta("", tool_calls=(ToolCall(id="", name="", arguments='ty":"Paris"}', index=0),)),
        Delta("", tool_calls=(ToolCall(id="call_b", name="clock", arguments="{}", index=1),)),
        Delta("", tokens=0, finish_reason="tool_calls"),
    ]
    a, events = run(fake_call("tool_calls"), deltas)
    kinds = [(e["type"], e.get("index"), (e.get("delta") or {}).get("type")) for e in events]
    assert kinds == [
        ("message_start", None, None),
        ("ping", None, None),
        ("content_block_start", 0, None),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, None),
        ("content_block_delta", 1, "input_json_delta"),
        ("content_block_delta", 1, "input_json_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, None),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert events[5]["content_block"] == {"type": "tool_use", "id": "call_a", "name": "weather", "input": {}}
    assert events[-2]["delta"]["stop_reason"] == "tool_use" and events[-2]["usage"]["output_tokens"] == 5
    message = final(a)
    assert [b.type for b in message.content] == ["text", "tool_use", "tool_use"]
    assert message.content[1].input == {"city": "Paris"} and message.stop_reason == "tool_use"  # type: ignore[union-attr]
    assert message.usage.input_tokens == 7 and message.usage.output_tokens == 5


@pytest.mark.parametrize(
    ("finish", "matched", "asked", "reason", "sequence"),
    [
        ("length", None, (), "max_tokens", None),
        ("stop", None, (), "end_turn", None),
        ("stop", "END", ("END",), "stop_sequence", "END"),
        ("stop", "<|im_end|>", ("END",), "end_turn", None),  # the model's own stop string ends its turn
    ],
)
def test_stop_reasons(
    finish: str, matched: str | None, asked: tuple[str, ...], reason: str, sequence: str | None
) -> None:
    a = MessageAssembler(fake_call(finish, stop_sequence=matched), stream=False, stop_sequences=asked)
    a.feed(Delta("x", finish_reason=finish))  # type: ignore[arg-type]
    message = final(a)
    assert (message.stop_reason, message.stop_sequence) == (reason, sequence)


def test_a_cut_tool_call_has_an_empty_input() -> None:
    a = MessageAssembler(fake_call("length"), stream=False)
    a.feed(Delta("", tool_calls=(ToolCall(id="call_a", name="weather", arguments='{"ci', index=0),)))
    a.feed(Delta("", tokens=0, finish_reason="length"))
    [block] = final(a).content
    assert block.type == "tool_use" and block.input == {}


@pytest.mark.parametrize("text", ["hi", "", 'quote " back\\slash', "line\nbreak\x00nul", "ünï 😀 \u2028"])
@pytest.mark.parametrize("index", [0, 7, 12345])
def test_the_framed_text_delta_is_byte_for_byte_the_structs_event(index: int, text: str) -> None:
    event = mp.ContentBlockDelta(index=index, delta=mp.TextDelta(text=text))
    assert text_delta_event(index, text) == named_event("content_block_delta", event)
