"""A tool-call envelope cut short becomes calls, never text (engines/call_envelope.py and the
llama.cpp choice that holds a call back, engines/llamacpp/choice_text.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from laneway.engines.call_envelope import EnvelopeReader, cut_calls
from laneway.engines.llamacpp.choice_text import ChoiceText
from laneway.types import Delta, GenerationRequest

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CLOCK = {"type": "function", "function": {"name": "clock"}}
TOOLS = [WEATHER, CLOCK]
PARIS = '{"name":"get_weather","arguments":{"city":"Paris"}}'


def shape(calls: Any) -> list[tuple[str, str]] | None:
    return None if calls is None else [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{", []),
        ('{"name":"get_wea', []),  # the name is not complete: no call yet
        ('{"name":"get_weather"', [("get_weather", "")]),
        ('{"name":"get_weather","arguments', [("get_weather", "")]),
        ('{"name":"get_weather","arguments":{"city":"Par', [("get_weather", '{"city":"Par')]),
        ('{"name": "clock", "arguments": {"n": 12', [("clock", '{"n": 12')]),
        ('{"name":"clock","arguments":{"x":1}', [("clock", '{"x": 1}')]),  # whole arguments, open object
        ('{"name":"clock","parameters":{"q":true', [("clock", '{"q":true')]),
        ('{"arguments":{"x":1},"name":"clock"', [("clock", '{"x": 1}')]),  # any key order
        ("[" + PARIS + ', {"name', [("get_weather", '{"city": "Paris"}')]),
        ("[" + PARIS + ', {"name":"clock","arguments":{', [("get_weather", '{"city": "Paris"}'), ("clock", "{")]),
        (
            '{"name":"get_weather","arguments":{"a":[1,{"b":"}\\""}],"c":',
            [("get_weather", '{"a":[1,{"b":"}\\""}],"c":')],
        ),
    ],
)
def test_a_cut_envelope_is_its_complete_calls_and_the_named_one_in_progress(text: str, expected: list[Any]) -> None:
    assert shape(cut_calls(text, TOOLS)) == expected


@pytest.mark.parametrize(
    "text",
    ["hello", '{"answer": 3', '{"name":"other', '{"name":"other"', '["x"', '{"name":"clock","arguments":3}', "   "],
)
def test_text_that_is_not_an_envelope_for_these_tools_is_none(text: str) -> None:
    assert cut_calls(text, TOOLS) is None, text


def test_whole_envelopes_close_and_json_in_strings_does_not_confuse_the_reader() -> None:
    for text in (PARIS, "[" + PARIS + "," + PARIS + "] ", '{"name":"get_weather","arguments":{"s":"]}\\"{"}}'):
        reader = EnvelopeReader.of(TOOLS)
        for ch in text:  # a character a piece: positions survive any split
            reader.feed(ch)
        assert reader.closed and not reader.broken, text
        assert [c.index for c in reader.calls()] == list(range(reader.complete_calls))
    reader = EnvelopeReader.of(TOOLS)
    reader.feed("[" + PARIS + ",")
    assert not reader.closed and reader.complete_calls == 1
    assert json.loads(reader.calls()[0].arguments) == {"city": "Paris"}


def test_an_unknown_name_or_key_breaks_the_envelope() -> None:
    bad = (
        '{"name":"nope","arguments":{}}',
        '{"name":"clock","extra":1}',
        '[{"name":"clock","arguments":{}},3',
        '{"name":"clo\nck"',
    )  # a raw newline in a string: not JSON
    for text in bad:
        reader = EnvelopeReader.of(TOOLS)
        reader.feed(text)
        assert reader.broken and not reader.closed, text


# ---- the llama.cpp choice ----


def run_choice(
    pieces: list[str], *, mode: str = "tools", max_tokens: int = 100, parallel: bool = True, end: str = "stop"
) -> tuple[list[Delta], int]:
    """Feed `pieces` as tokens; the choice's deltas and how many pieces it took."""
    req = GenerationRequest(
        request_id="r", prompt="p", prompt_tokens=1, max_tokens=max_tokens, parallel_tool_calls=parallel
    )
    out: list[Delta] = []
    choice = ChoiceText(req, mode, TOOLS, 0, out.append)
    for taken, piece in enumerate(pieces, 1):
        if choice.token(piece.encode()):
            return out, taken
    choice.finish(end)  # type: ignore[arg-type]
    return out, len(pieces)


def chars(text: str) -> list[str]:
    return list(text)


def test_a_required_call_cut_by_the_cap_is_the_partial_call_with_finish_length() -> None:
    text = '{"name":"get_weather","arguments":{"city":"Pa'
    out, _ = run_choice(chars(text), max_tokens=len(text))
    assert [d.text for d in out] == [""]  # the envelope never goes out as text
    assert out[-1].finish_reason == "length"
    assert shape(out[-1].tool_calls) == [("get_weather", '{"city":"Pa')]
    assert out[-1].tokens == len(text)


def test_a_required_call_cut_before_its_name_is_complete_has_no_calls_and_no_text() -> None:
    out, _ = run_choice(chars('{"name":"get_'), max_tokens=10)
    assert [(d.text, d.tool_calls, d.finish_reason) for d in out] == [("", (), "length")]
    out, _ = run_choice([" "], max_tokens=1)  # nothing but a space: still no text
    assert [(d.text, d.tool_calls, d.finish_reason) for d in out] == [("", (), "length")]


def test_a_cut_second_call_is_the_first_whole_and_the_second_partial() -> None:
    text = "[" + PARIS + ', {"name":"clock","arguments":{"tz":"U'
    out, _ = run_choice(chars(text), max_tokens=len(text))
    assert out[-1].finish_reason == "length" and out[-1].text == ""
    assert shape(out[-1].tool_calls) == [("get_weather", '{"city": "Paris"}'), ("clock", '{"tz":"U')]
    assert [c.index for c in out[-1].tool_calls] == [0, 1]


def test_the_choice_ends_when_the_envelope_is_whole_and_after_one_call_without_parallel_calls() -> None:
    out, taken = run_choice([*chars(PARIS), " ", "x", "y"])
    assert taken == len(PARIS) and out[-1].finish_reason == "tool_calls"
    assert shape(out[-1].tool_calls) == [("get_weather", '{"city": "Paris"}')]
    # an array without parallel calls (auto mode has no grammar): one call, then the end
    array = "[" + PARIS + ', {"name":"clock","arguments":{}}]'
    out, taken = run_choice(chars(array), mode="auto", parallel=False)
    assert taken == 1 + len(PARIS) and shape(out[-1].tool_calls) == [("get_weather", '{"city": "Paris"}')]
    out, taken = run_choice(chars(array), mode="auto")
    assert taken == len(array) and [c.name for c in out[-1].tool_calls] == ["get_weather", "clock"]


def test_auto_mode_a_cut_envelope_is_calls_and_json_of_its_own_stays_text() -> None:
    out, _ = run_choice(chars('  {"name":"clock","argu'), mode="auto", max_tokens=23)
    assert [(d.text, shape(d.tool_calls), d.finish_reason) for d in out] == [("", [("clock", "")], "length")]
    out, _ = run_choice(chars('{"answer": "it is sun'), mode="auto", max_tokens=21)
    assert [(d.text, d.finish_reason) for d in out] == [('{"answer": "it is sun', "length")]
    out, _ = run_choice(chars("It is sunny"), mode="auto", max_tokens=11)
    assert "".join(d.text for d in out) == "It is sunny" and out[-1].finish_reason == "length"
    out, _ = run_choice(chars('{"answer": 1}'), mode="auto")  # whole, ended by the model: text
    assert "".join(d.text for d in out) == '{"answer": 1}' and out[-1].finish_reason == "stop"
