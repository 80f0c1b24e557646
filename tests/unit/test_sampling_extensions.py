"""Engine-specific sampling extensions: decoded and bounded on the wire, declared per engine,
refused by name where the engine lacks them, passed to vLLM as it names them, and honoured
by llama.cpp in both of its decoding modes (the demo model, its end token pushed forward by a
logit bias so that ignore_eos and min_tokens have something to overrule)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from laneway.api import protocol as p
from laneway.contracts.errors import GatewayError
from laneway.core import capabilities
from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN
from laneway.engines.llamacpp import CAPABILITIES as LLAMACPP
from laneway.engines.llamacpp import LlamaCppEngine
from laneway.engines.vllm import CAPABILITIES as VLLM
from laneway.engines.vllm.request_body import generation_body
from laneway.types import EXTENSIONS, EngineInfo, GenerationRequest, SamplingExtensions

# ---- the wire ----


def chat(**extra: Any) -> p.ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    return msgspec.json.decode(msgspec.json.encode(body), type=p.ChatCompletionRequest)


def test_every_extension_decodes_on_chat_and_completions() -> None:
    sent = {
        "top_k": 5,
        "min_p": 0.1,
        "repetition_penalty": 1.2,
        "ignore_eos": True,
        "min_tokens": 3,
        "stop_token_ids": [1, 2],
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "truncate_prompt_tokens": 100,
        "structured_outputs": {"choice": ["a", "b"]},
    }
    assert set(sent) == set(EXTENSIONS)
    req = chat(**sent)
    assert (req.top_k, req.min_tokens, req.structured_outputs) == (5, 3, p.StructuredOutputs(choice=["a", "b"]))
    body = msgspec.json.encode({"model": "m", "prompt": "x", **sent})
    assert msgspec.json.decode(body, type=p.CompletionRequest).ignore_eos is True


@pytest.mark.parametrize(
    "extra",
    [
        {"top_k": -2},
        {"min_p": 1.1},
        {"repetition_penalty": 0},
        {"min_tokens": -1},
        {"stop_token_ids": list(range(257))},
        {"structured_outputs": {"regex": "x" * 65_537}},
        {"structured_outputs": {"nope": 1}},
        {"guided_json": {}},  # vLLM 0.32's name is structured_outputs
    ],
)
def test_out_of_range_or_unknown_values_are_refused_at_decode(extra: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        chat(**extra)


# ---- what asks for something, and who can do it ----


def test_values_that_ask_for_nothing_are_plain_requests() -> None:
    neutral = SamplingExtensions(
        top_k=-1,
        min_p=0.0,
        repetition_penalty=1.0,
        ignore_eos=False,
        min_tokens=0,
        stop_token_ids=(),
        include_stop_str_in_output=False,
        skip_special_tokens=True,
        spaces_between_special_tokens=True,
    )
    assert neutral.asked() == [] and neutral.body() == {}
    asked = SamplingExtensions(top_k=1, stop_token_ids=(7,), skip_special_tokens=False)
    assert asked.asked() == ["top_k", "stop_token_ids", "skip_special_tokens"]
    assert asked.body() == {"top_k": 1, "stop_token_ids": [7], "skip_special_tokens": False}


def generation(**ext: Any) -> GenerationRequest:
    return GenerationRequest(
        request_id="r", prompt="p", prompt_tokens=1, max_tokens=4, extensions=SamplingExtensions(**ext)
    )


def test_an_engine_without_the_extension_refuses_it_by_name_and_engine() -> None:
    sim = EngineInfo(engine="sim", model="m")
    with pytest.raises(GatewayError) as refused:
        capabilities.check(sim, "m", generation(top_k=1))
    assert (refused.value.code, refused.value.param) == ("unsupported_parameter", "top_k")
    assert "'m' (sim)" in refused.value.message
    llama = EngineInfo(engine="llamacpp", model="m", capabilities=LLAMACPP)
    capabilities.check(
        llama, "m", generation(top_k=1, min_p=0.1, repetition_penalty=1.1, ignore_eos=True, min_tokens=2)
    )
    with pytest.raises(GatewayError) as refused:
        capabilities.check(llama, "m", generation(stop_token_ids=(3,)))
    assert refused.value.param == "stop_token_ids"
    assert set(EXTENSIONS) <= VLLM


def test_vllm_gets_the_extensions_at_the_top_level_of_both_bodies() -> None:
    req = generation(top_k=2, min_tokens=3, ignore_eos=True, structured_outputs={"regex": "[a-z]+"})
    path, body = generation_body(req, "tiny", {})
    assert path == "/v1/completions"
    assert {k: body[k] for k in ("top_k", "min_tokens", "ignore_eos", "structured_outputs")} == {
        "top_k": 2,
        "min_tokens": 3,
        "ignore_eos": True,
        "structured_outputs": {"regex": "[a-z]+"},
    }
    plain = GenerationRequest(request_id="r", prompt="p", prompt_tokens=1, max_tokens=4)
    assert not set(EXTENSIONS) & set(generation_body(plain, "tiny", {})[1])


# ---- llama.cpp honours its five, in both decoding modes ----


@pytest.fixture(params=[True, False], ids=["batched", "per-slot"])
async def llama(request: pytest.FixtureRequest, demo_model_path: Path) -> Any:
    # IM_END is banned: only EOS ends a choice, and the request's own bias pushes it first.
    config = {
        "model_path": str(demo_model_path),
        "parallel": 2,
        "demo": True,
        "ban_tokens": [IM_END_TOKEN],
        "batching": request.param,
    }
    e = LlamaCppEngine("tiny", config, max_model_len=512)
    await e.start()
    yield e
    await e.close()


async def decode(e: LlamaCppEngine, *, max_tokens: int = 10, **kw: Any) -> tuple[str, int, str | None]:
    m = await e.measure(prompt="hello world")
    ext = {k: kw.pop(k) for k in list(kw) if k in EXTENSIONS}
    req = GenerationRequest(
        request_id="r",
        prompt=m.text,
        prompt_tokens=m.tokens,
        prompt_ids=m.ids,
        max_tokens=max_tokens,
        logit_bias={EOS_TOKEN: 30.0},
        extensions=SamplingExtensions(**ext) if ext else None,
        **kw,
    )
    text, tokens, finish = "", 0, None
    async for d in e.generate(req):
        text, tokens, finish = text + d.text, tokens + d.tokens, d.finish_reason
    return text, tokens, finish


async def test_llamacpp_ignore_eos_and_min_tokens_overrule_the_end_token(llama: LlamaCppEngine) -> None:
    assert (await decode(llama, temperature=0))[1:] == (0, "stop")  # the end token comes first
    assert (await decode(llama, temperature=0, ignore_eos=True))[1:] == (10, "length")
    assert (await decode(llama, temperature=0, min_tokens=4))[1:] == (4, "stop")


async def test_llamacpp_top_k_1_draws_the_greedy_token_whatever_the_seed(llama: LlamaCppEngine) -> None:
    greedy = await decode(llama, temperature=0, ignore_eos=True)
    drawn = {await decode(llama, temperature=1.5, seed=s, top_k=1, ignore_eos=True) for s in (1, 2, 3)}
    assert drawn == {greedy}
    free = {await decode(llama, temperature=1.5, seed=s, ignore_eos=True) for s in (1, 2, 3)}
    assert len(free) > 1
    repeated = await decode(llama, temperature=0, ignore_eos=True, repetition_penalty=1.8, min_p=0.01)
    assert repeated[1] == 10  # the chain takes them (the text may differ from greedy's)
