"""Tool calls and JSON output for engines that decode text themselves (engines/tool_calls.py)."""

from __future__ import annotations

import json

from laneway.engines.tool_calls import call_schema, offered, output_schema, parse_calls, with_tools
from laneway.types import ChatTurn, ToolCall

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
CLOCK = {"type": "function", "function": {"name": "clock"}}


def test_an_answer_that_calls_a_known_tool_is_a_call_and_anything_else_is_text() -> None:
    calls = parse_calls(' {"name": "weather", "arguments": {"city": "Paris"}} ', [WEATHER])
    assert calls is not None and [(c.name, json.loads(c.arguments), c.index) for c in calls] == [
        ("weather", {"city": "Paris"}, 0)
    ]
    assert calls[0].id.startswith("call_") and len(calls[0].id) == 29
    several = parse_calls(
        '[{"name": "weather", "arguments": {}}, {"name": "clock", "arguments": {}}]', [WEATHER, CLOCK]
    )
    assert several is not None and [c.index for c in several] == [0, 1]
    for text in (
        "Paris is sunny.",
        '{"name": "unknown", "arguments": {}}',
        '{"name": "weather", "arguments": 3}',
        '{"name": "weather"',
        "[]",
        "{}",
    ):
        assert parse_calls(text, [WEATHER]) is None, text


def test_tool_choice_decides_what_is_offered() -> None:
    assert offered([WEATHER, CLOCK], "none") == []
    assert offered([WEATHER, CLOCK], "auto") == [WEATHER, CLOCK]
    assert offered([WEATHER, CLOCK], {"type": "function", "function": {"name": "clock"}}) == [CLOCK]


def test_the_call_schema_names_each_tool_and_allows_an_array_only_for_parallel_calls() -> None:
    one = call_schema([WEATHER], parallel=False)
    assert one["properties"]["name"] == {"const": "weather"} and one["required"] == ["name", "arguments"]
    assert call_schema([CLOCK], parallel=False)["properties"]["arguments"] == {"type": "object", "properties": {}}
    both = call_schema([WEATHER, CLOCK], parallel=True)
    single, array = both["anyOf"]
    assert len(single["anyOf"]) == 2 and array["type"] == "array" and array["items"] == single


def test_tools_and_history_become_text_turns() -> None:
    call = ToolCall(id="call_1", name="weather", arguments='{"city": "Paris"}')
    turns = with_tools(
        [
            ChatTurn("system", "be brief"),
            ChatTurn("assistant", "", tool_calls=(call,)),
            ChatTurn("tool", "sunny", tool_call_id="call_1"),
        ],
        [WEATHER],
    )
    assert [t.role for t in turns] == ["system", "assistant", "tool"]
    assert turns[0].content.startswith("be brief\n\n") and '"name":"weather"' in turns[0].content
    assert json.loads(turns[1].content) == {"name": "weather", "arguments": {"city": "Paris"}}
    assert turns[2].content == "sunny"
    plain = with_tools([ChatTurn("user", "hi")], [])
    assert plain == [ChatTurn("user", "hi")]


def test_a_json_answer_is_described_in_a_system_turn() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": ["a"]}}}
    turns = with_tools([ChatTurn("user", "hi")], [], fmt)
    assert turns[0].role == "system" and '{"type":"object","required":["a"]}' in turns[0].content
    assert output_schema(fmt) == {"type": "object", "required": ["a"]}
    assert output_schema({"type": "json_object"}) == {"type": "object"}
    assert output_schema(None) is None
