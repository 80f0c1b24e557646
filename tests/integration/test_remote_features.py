"""The OpenAI features beyond text through the HTTP and gRPC engines (stand-ins on loopback),
with the official SDK: vLLM is handed tools, response_format, logprobs, n, penalties and
biases and its answers come back in OpenAI's shapes; Triton's TensorRT-LLM ensemble declares
none of them and refuses each with a 400 naming the parameter; one alias changes what it
accepts when its engine is swapped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from laneway.db.repositories import ModelRepository
from laneway.db.session import make_engine, make_sessionmaker
from standins.triton_server import TritonStandIn
from standins.vllm_server import VLLMStandIn, vllm_config
from support import Gateway, start_gateway, wait_for

MSGS = [{"role": "user", "content": "weather in Paris?"}]
CITY_TOOL = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory, vllm: VLLMStandIn, triton: TritonStandIn) -> Iterator[Gateway]:
    def deployment(name: str, kind: str, config: dict) -> list[dict]:  # type: ignore[type-arg]
        return [{"name": name, "engine_kind": kind, "config": config, "max_model_len": 4096}]

    models = {
        "v": deployment("v-vllm", "vllm", vllm_config(vllm, tool_calling=True)),
        "v-no-tools": deployment("v-plain", "vllm", vllm_config(vllm)),
        "t": deployment("t-trt", "trtllm", {"url": triton.url}),
        "swap": deployment("swap-vllm", "vllm", vllm_config(vllm)),
    }
    gateway = start_gateway(
        Path(tmp_path_factory.mktemp("remote-features")),
        policy_poll_interval_s=0.1,
        seed_with={"models": models, "tenants": {"acme": {}}},
    )
    yield gateway
    gateway.stop()


@pytest.fixture
def client(remote: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=remote.api_url, api_key=remote.keys["acme"], max_retries=0)


def test_vllm_is_handed_the_features_as_they_were_asked(client: openai.OpenAI, vllm: VLLMStandIn) -> None:
    client.chat.completions.create(
        model="v",
        messages=MSGS,
        max_tokens=3,
        tools=[CITY_TOOL],
        tool_choice="auto",
        parallel_tool_calls=False,
        logprobs=True,
        top_logprobs=2,
        n=2,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        logit_bias={"7": -100},
        response_format={"type": "json_object"},
    )
    body = vllm.requests[-1]
    assert body["tools"] == [CITY_TOOL] and body["tool_choice"] == "auto" and body["parallel_tool_calls"] is False
    assert (body["logprobs"], body["top_logprobs"], body["n"]) == (True, 2, 2)
    assert (body["presence_penalty"], body["frequency_penalty"], body["logit_bias"]) == (0.5, 0.25, {"7": -100.0})
    assert body["response_format"] == {"type": "json_object"}


def test_vllm_tool_calls_come_back_whole_and_streamed(client: openai.OpenAI) -> None:
    args = {"model": "v", "messages": MSGS, "max_tokens": 8, "tools": [CITY_TOOL], "tool_choice": "required"}
    r = client.chat.completions.create(**args)
    calls = r.choices[0].message.tool_calls or []
    assert r.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["weather"]
    assert "city" in json.loads(calls[0].function.arguments)
    with client.beta.chat.completions.stream(**args) as stream:  # fragments, assembled by the SDK
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls or []
    assert [c.function.arguments for c in streamed] == [calls[0].function.arguments]
    assert final.choices[0].finish_reason == "tool_calls"


def test_vllm_history_with_tool_calls_is_sent_natively(client: openai.OpenAI, vllm: VLLMStandIn) -> None:
    call = {"id": "call_9", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    history = [
        *MSGS,
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_9", "content": "sunny"},
    ]
    client.chat.completions.create(model="v", messages=history, tools=[CITY_TOOL], max_tokens=2)
    sent = vllm.requests[-1]["messages"]
    assert sent[1] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert sent[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_9"}


def test_vllm_n_choices_and_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="v", messages=MSGS, max_tokens=3, n=3, logprobs=True, top_logprobs=2, seed=1
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage is not None and r.usage.completion_tokens == 9
    for c in r.choices:
        content = c.logprobs.content  # type: ignore[union-attr]
        assert content is not None and "".join(t.token for t in content) == c.message.content
        assert all(len(t.top_logprobs) == 2 for t in content)
    chunks = list(client.chat.completions.create(model="v", messages=MSGS, max_tokens=3, n=2, stream=True))
    for index in (0, 1):
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].index == index]
        assert [f for f in finishes if f] == ["length"]
    legacy = client.completions.create(model="v", prompt="hi", max_tokens=3, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert lp is not None and "".join(lp.tokens or []) == legacy.choices[0].text


def test_vllm_structured_output_parses(client: openai.OpenAI) -> None:
    from pydantic import BaseModel

    class Answer(BaseModel):
        answer: str

    r = client.beta.chat.completions.parse(model="v", messages=MSGS, response_format=Answer, max_tokens=10)
    assert isinstance(r.choices[0].message.parsed, Answer)


def test_a_vllm_started_without_a_tool_parser_refuses_tools(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="v-no-tools", messages=MSGS, max_tokens=2, tools=[CITY_TOOL])
    assert (info.value.body["code"], info.value.body["param"]) == ("unsupported_parameter", "tools")  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tools": [CITY_TOOL]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"n": 2}, "n"),
        ({"logit_bias": {"1": 1}}, "logit_bias"),
    ],
)
def test_triton_refuses_what_its_ensemble_does_not_do(client: openai.OpenAI, kwargs: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="t", messages=MSGS, max_tokens=2, **kwargs)
    assert (info.value.body["code"], info.value.body["param"]) == ("unsupported_parameter", param)  # type: ignore[index]
    assert "trtllm" in info.value.body["message"]  # type: ignore[index]


def test_triton_is_handed_the_penalties_as_the_ensembles_tensors(client: openai.OpenAI, triton: TritonStandIn) -> None:
    client.chat.completions.create(model="t", messages=MSGS, max_tokens=2, presence_penalty=0.5, frequency_penalty=1)
    sent = triton.requests[-1]
    assert (sent["presence_penalty"], sent["frequency_penalty"]) == ([0.5], [1.0])


def test_triton_takes_top_k_as_the_ensembles_tensor_and_refuses_the_other_extensions(
    client: openai.OpenAI, triton: TritonStandIn
) -> None:
    client.chat.completions.create(model="t", messages=MSGS, max_tokens=2, extra_body={"top_k": 3})
    assert triton.requests[-1]["top_k"] == [3]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="t", messages=MSGS, max_tokens=2, extra_body={"min_tokens": 2})
    assert (info.value.body["code"], info.value.body["param"]) == ("unsupported_parameter", "min_tokens")  # type: ignore[index]


def test_models_list_each_engines_capabilities(client: openai.OpenAI) -> None:
    cards = {m.id: m for m in client.models.list()}
    assert "tools" in cards["v"].capabilities  # type: ignore[attr-defined]
    assert "tools" not in cards["v-no-tools"].capabilities  # type: ignore[attr-defined]
    assert cards["t"].capabilities == ["penalties", "top_k"]  # type: ignore[attr-defined]


def test_swapping_an_aliass_engine_changes_what_it_accepts(
    remote: Gateway, client: openai.OpenAI, triton: TritonStandIn
) -> None:
    assert len(client.chat.completions.create(model="swap", messages=MSGS, max_tokens=2, n=2).choices) == 2

    async def point_at_triton() -> None:
        engine = make_engine(remote.database_url)
        try:
            async with make_sessionmaker(engine)() as s, s.begin():
                trt = {
                    "name": "swap-trt",
                    "engine_kind": "trtllm",
                    "config": {"url": triton.url},
                    "max_model_len": 4096,
                }
                await ModelRepository(s).upsert("swap", deployments=[trt])
        finally:
            await engine.dispose()

    asyncio.run(point_at_triton())
    wait_for(lambda: remote.engine("swap").info.engine == "trtllm", what="the swap to TensorRT-LLM")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="swap", messages=MSGS, max_tokens=2, n=2)
    assert info.value.body["param"] == "n"  # type: ignore[index]
    assert client.chat.completions.create(model="swap", messages=MSGS, max_tokens=2).choices[0].message.content
