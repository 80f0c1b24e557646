"""The OpenAI features beyond text, through the official SDK, on llama.cpp (the tiny model:
these check mechanics; test_real_demo_model checks that the answers make sense): tools and
tool_choice, JSON output by schema, logprobs, n, logit_bias, penalties, and the capabilities
each model's engine declares."""

from __future__ import annotations

import json
import math
from typing import Literal

import httpx
import openai
import pytest
from laneway.engines.demo_model import BANNED_BYTE_TOKENS, EOS_TOKEN, IM_END_TOKEN
from pydantic import BaseModel
from support import Gateway, wait_for

MSGS = [{"role": "user", "content": "hello world"}]
UNIT_TOOL = {
    "type": "function",
    "function": {
        "name": "set_unit",
        "description": "Choose the temperature unit.",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["unit"],
            "additionalProperties": False,
        },
    },
}
OTHER_TOOL = {
    "type": "function",
    "function": {"name": "noop", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
}


@pytest.fixture
def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.api_url, api_key=gateway.keys["acme"], max_retries=0)


def test_models_say_what_their_engine_accepts(gateway: Gateway) -> None:
    cards = httpx.get(gateway.api_url + "/models", headers={"Authorization": f"Bearer {gateway.keys['acme']}"}).json()
    by_id = {c["id"]: c for c in cards["data"]}
    assert {"tools", "json_schema", "logprobs", "n"} <= set(by_id["tiny"]["capabilities"])
    assert by_id["sim"]["capabilities"] == []


# ---- tools ---------------------------------------------------------------------------------


def test_a_required_tool_call_comes_back_as_tool_calls(client: openai.OpenAI) -> None:
    # One call (a random model would go on adding parallel calls until the token cap); the
    # tiny model spells JSON a character a token.
    tools = [UNIT_TOOL, OTHER_TOOL]
    r = client.chat.completions.create(
        model="tiny",
        messages=MSGS,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        seed=3,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert calls and all(c.type == "function" and c.id.startswith("call_") for c in calls)
    for call in calls:
        args = json.loads(call.function.arguments)  # the grammar makes it valid JSON for that tool
        assert call.function.name in ("set_unit", "noop")
        if call.function.name == "set_unit":
            assert args["unit"] in ("celsius", "fahrenheit")


def test_a_named_tool_choice_calls_that_tool_once_without_parallel_calls(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny",
        messages=MSGS,
        tools=[OTHER_TOOL, UNIT_TOOL],
        tool_choice={"type": "function", "function": {"name": "set_unit"}},
        parallel_tool_calls=False,
        max_tokens=200,
        seed=1,
    )
    calls = r.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["set_unit"]
    assert json.loads(calls[0].function.arguments)["unit"] in ("celsius", "fahrenheit")


def test_streamed_tool_calls_are_what_the_sdk_stream_helper_assembles(client: openai.OpenAI) -> None:
    with client.beta.chat.completions.stream(
        model="tiny",
        messages=MSGS,
        tools=[UNIT_TOOL],
        tool_choice={"type": "function", "function": {"name": "set_unit"}},
        parallel_tool_calls=False,
        max_tokens=200,
        seed=2,
    ) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert final.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in calls] == ["set_unit"]
    assert json.loads(calls[0].function.arguments)["unit"] in ("celsius", "fahrenheit")


def test_tool_results_in_the_history_are_rendered_into_the_prompt(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2)
    history = [
        *MSGS,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "set_unit", "arguments": '{"unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "unit set"},
    ]
    r = client.chat.completions.create(model="tiny", messages=history, tools=[UNIT_TOOL], max_tokens=2)
    assert r.usage is not None and plain.usage is not None
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens + 20  # the tools, the call and its result


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [UNIT_TOOL], "tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
        ({"tools": [UNIT_TOOL, UNIT_TOOL]}, "tools"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ],
)
def test_tool_requests_that_make_no_sense_are_400(client: openai.OpenAI, kwargs: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**{"model": "tiny", "messages": MSGS, "max_tokens": 2, **kwargs})
    assert info.value.body["param"] == param  # type: ignore[index]


# ---- structured output -----------------------------------------------------------------------


class Verdict(BaseModel):
    ok: bool
    grade: Literal["a", "b", "c"]
    score: int


def test_parse_with_a_pydantic_model_returns_a_parsed_object(client: openai.OpenAI) -> None:
    r = client.beta.chat.completions.parse(model="tiny", messages=MSGS, response_format=Verdict, max_tokens=80, seed=4)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"  # the grammar closed the object, then only the end could follow
    assert isinstance(choice.message.parsed, Verdict)
    assert choice.message.parsed.grade in ("a", "b", "c")


def test_json_object_mode_answers_a_json_object(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny", messages=MSGS, response_format={"type": "json_object"}, max_tokens=40, seed=9
    )
    text = r.choices[0].message.content or ""
    assert text.lstrip().startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_an_invalid_schema_is_400(client: openai.OpenAI) -> None:
    schema = {"name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="tiny", messages=MSGS, response_format={"type": "json_schema", "json_schema": schema}, max_tokens=4
        )


# ---- logprobs, n, biases, penalties ---------------------------------------------------------


def test_logprobs_are_the_chosen_tokens_with_their_top_alternatives(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny-exact", messages=MSGS, logprobs=True, top_logprobs=3, max_tokens=8, temperature=0
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 8
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        values = [a.logprob for a in t.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert math.isclose(t.logprob, values[0], abs_tol=1e-4)  # greedy: the chosen token is the likeliest
        assert bytes(t.bytes or []).decode() == t.token


def test_streamed_logprobs_equal_the_non_streamed_ones(client: openai.OpenAI) -> None:
    args = {"model": "tiny-exact", "messages": MSGS, "logprobs": True, "max_tokens": 6, "seed": 8}
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content or []]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [
        (t.token, round(t.logprob, 4))
        for t in whole.choices[0].logprobs.content  # type: ignore[union-attr]
    ]
    assert all(t.top_logprobs == [] for t in streamed)  # top_logprobs not asked


def test_legacy_completions_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny-exact", prompt="hello", logprobs=2, max_tokens=5, temperature=0)
    lp = r.choices[0].logprobs
    assert lp is not None and len(lp.tokens or []) == 5 and "".join(lp.tokens or []) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in (lp.tokens or [])[:i]) for i in range(5)]
    assert all(len(top) == 2 for top in lp.top_logprobs or [])


def test_n_choices_are_counted_n_times(gateway: Gateway, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny-exact", messages=MSGS, n=3, max_tokens=6, seed=5, user="n-test")
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1  # each choice has its own seed
    assert r.usage is not None and r.usage.completion_tokens == 18

    def row() -> list[int]:
        return [u.completion_tokens for u in gateway.usage_rows("acme") if u.end_user == "n-test"]

    wait_for(row, what="the n=3 usage row")
    assert row() == [18]


def test_n_streamed_choices_each_open_and_finish(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="tiny-exact", messages=MSGS, n=2, max_tokens=4, stream=True))
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert mine[0].delta.role == "assistant"
        assert [c.finish_reason for c in mine if c.finish_reason] == ["length"]
        assert "".join(c.delta.content or "" for c in mine)


def test_logit_bias_changes_the_greedy_choice(client: openai.OpenAI) -> None:
    base = client.chat.completions.create(model="tiny-exact", messages=MSGS, max_tokens=6, temperature=0)
    changed = set()
    allowed = [t for t in range(300, 400) if t not in (*BANNED_BYTE_TOKENS, EOS_TOKEN, IM_END_TOKEN)][:10]
    for tok in allowed:  # pushing any one of these ids up by 100 makes it win every step
        r = client.chat.completions.create(
            model="tiny-exact", messages=MSGS, max_tokens=6, temperature=0, logit_bias={str(tok): 100}
        )
        changed.add(r.choices[0].message.content != base.choices[0].message.content)
    assert changed == {True}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, logit_bias={"99999999": 1})
    assert "vocabulary" in info.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, logit_bias={"abc": 1})
    assert info.value.body["param"] == "logit_bias"  # type: ignore[index]


def test_penalties_change_what_is_decoded(client: openai.OpenAI) -> None:
    args = {"model": "tiny-exact", "messages": MSGS, "max_tokens": 40, "temperature": 0}
    plain = client.chat.completions.create(**args).choices[0].message.content
    penalised = client.chat.completions.create(**args, frequency_penalty=2.0, presence_penalty=2.0)
    assert penalised.choices[0].message.content != plain


# ---- parameters: unknown ones are not ignored --------------------------------------------------


def test_an_unknown_parameter_is_a_400_naming_it_as_openai_answers(client: openai.OpenAI) -> None:
    for make in (
        lambda **kw: client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, **kw),
        lambda **kw: client.completions.create(model="tiny", prompt="hi", max_tokens=2, **kw),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            make(extra_body={"use_beam_search": True})  # a vLLM parameter laneway does not pass: never ignored
        assert (info.value.body["code"], info.value.body["param"]) == ("unknown_parameter", "use_beam_search")  # type: ignore[index]


def test_parameters_that_change_nothing_in_the_answer_are_accepted(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny",
        messages=MSGS,
        max_tokens=2,
        store=False,
        service_tier="auto",
        prompt_cache_key="k",
        safety_identifier="u1",
    )
    assert r.choices[0].message.content is not None


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
    ],
)
def test_parameters_that_would_change_the_answer_and_cannot_are_refused(
    client: openai.OpenAI, kwargs: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, **kwargs)
    assert (info.value.body["code"], info.value.body["param"]) == ("unsupported_parameter", param)  # type: ignore[index]
