"""A tool call cut short at max_tokens, through the official SDK on llama.cpp (the tiny model:
the mechanics, grammar-forced JSON a character a token): the calls as far as they got in
`tool_calls`, finish_reason "length", no content, streamed or not, in chat and Responses; a
generation without parallel calls ends after one call. SmolLM2's own run of cut calls is in
test_cut_tool_calls_smollm2.py."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from support import Gateway

MSGS = [{"role": "user", "content": "hello world"}]
UNIT_TOOL = {
    "type": "function",
    "function": {
        "name": "set_unit",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["unit"],
            "additionalProperties": False,
        },
    },
}
NOOP_TOOL = {
    "type": "function",
    "function": {"name": "noop", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
}
ENVELOPE_MARKS = ('"name"', '"arguments"', "{")


@pytest.fixture
def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.api_url, api_key=gateway.keys["acme"], max_retries=0, timeout=120)


Answer = tuple[str, list[tuple[str, str]], str]  # content, calls (name, arguments), finish_reason


def chat(client: openai.OpenAI, **kwargs: Any) -> Answer:
    r = client.chat.completions.create(model="tiny", messages=MSGS, **kwargs)  # type: ignore[call-overload]
    choice = r.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.message.content or "", calls, str(choice.finish_reason)


def chat_streamed(client: openai.OpenAI, **kwargs: Any) -> Answer:
    """The stream's chunks put together as a client does: content, calls by index, finish."""
    content, finish = "", ""
    calls: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(model="tiny", messages=MSGS, stream=True, **kwargs):  # type: ignore[call-overload]
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for c in choice.delta.tool_calls or []:
                name, args = calls.setdefault(c.index, ["", ""])
                fn = c.function
                calls[c.index] = [name + (fn.name or "" if fn else ""), args + (fn.arguments or "" if fn else "")]
            finish = choice.finish_reason or finish
    return content, [(n, a) for _, (n, a) in sorted(calls.items())], finish


def assert_no_envelope(content: str) -> None:
    assert not any(mark in content for mark in ENVELOPE_MARKS), content


def assert_partial(arguments: str) -> None:
    with pytest.raises(ValueError):
        json.loads(arguments)


# ---- chat ----


def test_a_required_call_cut_in_its_arguments_is_the_partial_call_in_tool_calls(client: openai.OpenAI) -> None:
    # '{"name":"set_unit","arguments":{"unit":"' is 40 characters: the cut falls in the arguments.
    kwargs = {
        "tools": [UNIT_TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 36,
        "seed": 5,
    }
    for answer in (chat(client, **kwargs), chat_streamed(client, **kwargs)):
        content, calls, finish = answer
        assert finish == "length" and content == ""
        [(name, arguments)] = calls
        assert name == "set_unit" and arguments.startswith("{")
        assert_partial(arguments)
    assert chat(client, **kwargs)[1] == chat_streamed(client, **kwargs)[1]  # the same calls either way


def test_a_cut_before_the_name_is_complete_has_no_calls_and_no_content(client: openai.OpenAI) -> None:
    for answer in (
        chat(client, tools=[UNIT_TOOL], tool_choice="required", max_tokens=6, seed=1),
        chat_streamed(client, tools=[UNIT_TOOL], tool_choice="required", max_tokens=6, seed=1),
    ):
        assert answer == ("", [], "length")


def test_a_cut_second_call_is_the_first_whole_and_the_second_partial(client: openai.OpenAI) -> None:
    # With parallel calls allowed, this seed has the tiny model write an array of calls: the
    # cap falls in the second call's arguments.
    kwargs = {"tools": [UNIT_TOOL, NOOP_TOOL], "tool_choice": "required", "max_tokens": 90, "seed": 11}
    plain = chat(client, **kwargs)
    for content, calls, finish in (plain, chat_streamed(client, **kwargs)):
        assert finish == "length" and content == ""
        assert len(calls) >= 2, calls
        *whole, (last_name, last_arguments) = calls
        for name, arguments in whole:
            assert name in ("set_unit", "noop") and isinstance(json.loads(arguments), dict)
        assert last_name in ("set_unit", "noop")
        assert_partial(last_arguments)
    assert plain[1] == chat_streamed(client, **kwargs)[1]


def test_without_parallel_calls_the_generation_ends_after_one_call(client: openai.OpenAI) -> None:
    for seed in (1, 2, 3):
        r = client.chat.completions.create(
            model="tiny",
            messages=MSGS,
            tools=[UNIT_TOOL, NOOP_TOOL],  # type: ignore[list-item]
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=300,
            seed=seed,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert len(choice.message.tool_calls or []) == 1
        # Ended by the call's last brace, not by the cap or an end token after it.
        assert r.usage is not None and r.usage.completion_tokens < 300


def test_auto_mode_never_returns_a_cut_call_as_text(client: openai.OpenAI) -> None:
    """Without a grammar the tiny model rarely starts JSON: what it writes is text, a cut
    envelope (if any) becomes calls; either way no envelope reaches the content."""
    for seed in range(4):
        content, calls, finish = chat(client, tools=[UNIT_TOOL], tool_choice="auto", max_tokens=12, seed=seed)
        assert finish in ("length", "stop", "tool_calls")
        if content.lstrip().startswith('{"name'):
            pytest.fail(f"an envelope as content: {content!r}")
        assert not (calls and content)


# ---- Responses ----


RESPONSES_UNIT = {"type": "function", "name": "set_unit", "parameters": UNIT_TOOL["function"]["parameters"]}  # type: ignore[index]


def test_responses_a_cut_call_is_an_incomplete_function_call_item(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": "tiny",
        "input": "hello",
        "tools": [RESPONSES_UNIT],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_output_tokens": 36,
        "temperature": 0,
    }
    r = client.responses.create(**kwargs)
    assert r.status == "incomplete" and r.incomplete_details is not None
    [item] = r.output
    assert item.type == "function_call" and item.name == "set_unit" and item.status == "incomplete"
    assert_partial(item.arguments)
    events = list(client.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert "response.output_text.delta" not in kinds and kinds[-1] == "response.incomplete"
    assert "response.function_call_arguments.done" in kinds
    [streamed] = events[-1].response.output  # type: ignore[union-attr]
    assert streamed.type == "function_call" and (streamed.name, streamed.arguments) == (item.name, item.arguments)
