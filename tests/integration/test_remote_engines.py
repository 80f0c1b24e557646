"""vLLM and TensorRT-LLM adapters against protocol-level stand-ins on loopback: request
mapping, streaming, cancellation reaching the engine, token counting, overload and health
ejection, and swapping a model alias between engines while requests run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from laneway.db.repositories import DeploymentSpec, ModelRepository
from laneway.db.session import make_engine, make_sessionmaker
from laneway.engines.registry import EngineRegistry
from laneway.engines.trtllm import TritonTRTLLMEngine
from laneway.engines.vllm import VLLMEngine, parse_prometheus
from laneway.types import ChatTurn, GenerationRequest
from standins.triton_server import TritonStandIn
from standins.vllm_server import VLLMStandIn, vllm_config
from support import start_gateway, until


async def drain(stream: Any) -> tuple[str, int, str | None]:
    text, tokens, finish = "", 0, None
    async for d in stream:
        text, tokens, finish = text + d.text, tokens + d.tokens, d.finish_reason
    return text, tokens, finish


# ---- vLLM ----


async def test_vllm_maps_the_request_and_counts_with_tokenize(vllm: VLLMStandIn) -> None:
    engine = VLLMEngine("chat", vllm_config(vllm, tokenize="always"), max_model_len=4096)
    await engine.start()
    try:
        m = await engine.measure(messages=[ChatTurn("user", "one two three")])
        assert m.tokens == 3 + 4 + 3 and vllm.tokenize_calls >= 1  # the stand-in's tokenizer, not an estimate
        req = GenerationRequest(
            request_id="req-1",
            prompt="",
            prompt_tokens=m.tokens,
            max_tokens=5,
            seed=3,
            temperature=0.5,
            top_p=0.9,
            stop=("zzz",),
            priority=2,
            messages=(ChatTurn("user", "one two three"),),
        )
        text, tokens, finish = await drain(engine.generate(req))
        assert tokens == 5 and finish == "length" and len(text.split()) == 5
        sent = vllm.requests[-1]
        assert sent["_path"] == "/v1/chat/completions" and sent["_request_id"] == "req-1"
        assert sent["messages"] == [{"role": "user", "content": "one two three"}]
        assert (sent["max_tokens"], sent["seed"], sent["temperature"], sent["top_p"]) == (5, 3, 0.5, 0.9)
        assert sent["stop"] == ["zzz"] and sent["priority"] == 2 and sent["stream"] is True
        done = await drain(engine.generate(GenerationRequest("req-2", "hello", 1, 4, seed=1)))
        assert vllm.requests[-1]["_path"] == "/v1/completions" and vllm.requests[-1]["prompt"] == "hello"
        assert done[1] == 4
    finally:
        await engine.close()


async def test_vllm_measures_without_a_round_trip_unless_the_prompt_nears_the_context(vllm: VLLMStandIn) -> None:
    """The hot path estimates; /tokenize only where the exact count decides (near the context
    limit); what is billed is the count vLLM reports."""
    engine = VLLMEngine("chat", vllm_config(vllm), max_model_len=4096)
    await engine.start()
    try:
        calls = engine.tokenize_calls
        short = await engine.measure(prompt="a short question")
        assert short.tokens == 4 and engine.tokenize_calls == calls  # an estimate, no round trip
        long = await engine.measure(prompt="word " * 2500)  # ~3100 estimated: within a quarter of 4096
        assert long.tokens == 2500 and engine.tokenize_calls == calls + 1  # the server's exact count
        vllm.prompt_tokens = 37
        for stream in (True, False):
            req = GenerationRequest(f"count-{stream}", "a short question", short.tokens, 3, seed=1, stream=stream)
            deltas = [d async for d in engine.generate(req)]
            assert deltas[-1].prompt_tokens == 37 and sum(d.tokens for d in deltas) == 3
            assert vllm.requests[-1]["stream"] is stream  # a non-streaming client: one JSON answer
    finally:
        vllm.prompt_tokens = 1
        await engine.close()


async def test_vllm_takes_the_servers_max_model_len_when_smaller(vllm: VLLMStandIn) -> None:
    engine = VLLMEngine("chat", vllm_config(vllm), max_model_len=32768)
    await engine.start()
    try:
        assert engine.info.max_model_len == 4096  # as the server lists it in /v1/models
    finally:
        await engine.close()
    small = VLLMEngine("chat", vllm_config(vllm), max_model_len=2048)
    await small.start()
    try:
        assert small.info.max_model_len == 2048  # a lower configured limit stands
    finally:
        await small.close()


async def test_vllm_closing_the_stream_aborts_the_request_on_the_engine(vllm: VLLMStandIn) -> None:
    engine = VLLMEngine("chat", vllm_config(vllm))
    await engine.start()
    try:
        stream = engine.generate(GenerationRequest("abort-me", "x", 1, 10_000))
        await anext(stream)
        assert engine.active_slots == 1
        await stream.aclose()
        assert engine.active_slots == 0
        await until(lambda: "abort-me" in vllm.cancelled)
    finally:
        await engine.close()


async def test_vllm_metrics_mark_an_overloaded_replica_and_the_registry_avoids_it(vllm: VLLMStandIn) -> None:
    assert parse_prometheus('vllm:num_requests_waiting{a="1"} 3\nvllm:num_requests_waiting{a="2"} 4\n') == {
        "vllm:num_requests_waiting": 7.0
    }
    registry = EngineRegistry()
    await registry.load(
        [
            DeploymentSpec(1, "busy", "m", "vllm", vllm_config(vllm, max_waiting=5), "fp8", "H100", 4096),
            DeploymentSpec(2, "idle", "m", "sim", {}, "fp8", "H100", 4096),
        ]
    )
    try:
        busy = registry.deployments()[0]
        busy.outstanding = -1  # would win on outstanding alone
        vllm.waiting = 50
        await until(lambda: busy.overloaded)
        assert registry.resolve("m").spec.name == "idle"
        vllm.waiting = 0
        await until(lambda: not busy.overloaded)
        assert registry.resolve("m").spec.name == "busy"
        busy.outstanding = 0
    finally:
        vllm.waiting = 0
        await registry.close()


async def test_failing_deployment_is_ejected_and_returns_when_healthy(vllm: VLLMStandIn) -> None:
    registry = EngineRegistry()
    await registry.load(
        [
            DeploymentSpec(1, "flaky", "m", "vllm", vllm_config(vllm), "q", "g", 4096),
            DeploymentSpec(2, "steady", "m", "sim", {}, "q", "g", 4096),
        ]
    )
    flaky, steady = registry.deployments()
    try:
        vllm.fail_generation = True
        for _ in range(3):
            with pytest.raises(Exception, match="vLLM answered 500"):
                await drain(flaky.engine.generate(GenerationRequest("f", "x", 1, 3)))
            registry.record(flaky, ok=False)
        assert not flaky.healthy
        steady.outstanding = 5  # would lose on load: ejection, not load, keeps traffic away
        assert registry.resolve("m") is steady
        vllm.fail_generation = False
        await registry.check_health()  # its /health answers 200: back in rotation
        assert flaky.healthy and registry.resolve("m") is flaky
        vllm.healthy = False
        await registry.check_health()
        assert not flaky.healthy
    finally:
        vllm.healthy, vllm.fail_generation, steady.outstanding = True, False, 0
        await registry.close()


# ---- TensorRT-LLM behind Triton ----


async def test_triton_maps_the_ensemble_tensors_and_streams(triton: TritonStandIn) -> None:
    engine = TritonTRTLLMEngine(
        "trt", {"url": triton.url, "end_id": 2, "pad_id": 0, "top_k": 40, "bad_words": ["badword"]}
    )
    await engine.start()
    try:
        req = GenerationRequest("t-1", "hello there", 3, 6, temperature=0.7, top_p=0.8, seed=9, stop=("nope",))
        text, tokens, finish = await drain(engine.generate(req))
        assert tokens == 6 and finish == "length" and len(text.split()) == 6
        sent = triton.requests[-1]
        assert sent["model"] == "ensemble" and sent["id"] == "t-1"
        assert sent["text_input"] == ["hello there"] and sent["max_tokens"] == [6] and sent["stream"] == [True]
        assert sent["stop_words"] == ["nope"] and sent["bad_words"] == ["badword"]
        assert sent["temperature"] == [pytest.approx(0.7)] and sent["top_p"] == [pytest.approx(0.8)]
        assert (sent["top_k"], sent["end_id"], sent["pad_id"], sent["random_seed"]) == ([40], [2], [0], [9])
        again = await drain(engine.generate(req))
        assert again == (text, tokens, finish)  # the seed makes it reproducible
    finally:
        await engine.close()


async def test_triton_cancelling_the_stream_reaches_the_server(triton: TritonStandIn) -> None:
    engine = TritonTRTLLMEngine("trt", {"url": triton.url})
    await engine.start()
    try:
        stream = engine.generate(GenerationRequest("t-cancel", "x", 1, 100_000))
        await anext(stream)
        await stream.aclose()
        assert engine.active_slots == 0
        await until(lambda: "t-cancel" in triton.cancelled)
    finally:
        await engine.close()


async def test_triton_readiness_needs_the_model(triton: TritonStandIn) -> None:
    from laneway.engines.base import EngineError

    with pytest.raises(EngineError, match="not ready"):
        await TritonTRTLLMEngine("trt", {"url": triton.url, "model": "missing"}).start()


# ---- through the gateway ----


def _models(vllm: VLLMStandIn, triton: TritonStandIn) -> dict[str, list[dict[str, Any]]]:
    return {
        "v": [{"name": "v-vllm", "engine_kind": "vllm", "config": vllm_config(vllm), "max_model_len": 4096}],
        "t": [{"name": "t-trt", "engine_kind": "trtllm", "config": {"url": triton.url}, "max_model_len": 4096}],
        "swap": [{"name": "swap-vllm", "engine_kind": "vllm", "config": vllm_config(vllm), "max_model_len": 4096}],
    }


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, vllm: VLLMStandIn, triton: TritonStandIn) -> Iterator[Any]:
    seed_with = {"models": _models(vllm, triton), "tenants": {"acme": {}}}
    gw = start_gateway(tmp_path_factory.mktemp("remote"), seed_with=seed_with, policy_poll_interval_s=0.1)
    yield gw.server, gw.keys["acme"], gw.database_url
    gw.stop()


async def test_openai_sdk_through_vllm_and_triton(gateway: Any) -> None:
    server, key, _ = gateway
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)
    for model in ("v", "t"):
        r = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, seed=1
        )
        assert r.usage is not None and r.usage.completion_tokens == 4, model
        assert r.system_fingerprint == ("laneway-vllm" if model == "v" else "laneway-trtllm")
        chunks = [c async for c in await client.completions.create(model=model, prompt="hi", max_tokens=3, stream=True)]
        assert "".join(c.choices[0].text for c in chunks if c.choices).count(" ") == 3


async def test_swapping_an_alias_to_another_engine_loses_no_running_request(
    gateway: Any, vllm: VLLMStandIn, triton: TritonStandIn
) -> None:
    server, key, url = gateway
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)
    vllm.token_delay_s = 0.02  # 40 tokens = ~0.8 s: the swap happens mid-stream

    async def one(i: int) -> tuple[int, str | None]:
        stream = await client.completions.create(model="swap", prompt=f"p{i}", max_tokens=40, stream=True, seed=i)
        n, finish = 0, None
        async for c in stream:
            if c.choices:
                n += bool(c.choices[0].text)
                finish = c.choices[0].finish_reason or finish
        return n, finish

    try:
        running = [asyncio.create_task(one(i)) for i in range(8)]
        await until(lambda: vllm.running >= 8)
        engine = make_engine(url)
        async with make_sessionmaker(engine)() as s, s.begin():  # an admin points "swap" at TensorRT-LLM
            await ModelRepository(s).upsert(
                "swap",
                deployments=[
                    {"name": "swap-trt", "engine_kind": "trtllm", "config": {"url": triton.url}, "max_model_len": 4096}
                ],
            )
        await engine.dispose()
        registry = server.runtime.gateway.registry
        await until(lambda: registry.resolve("swap").spec.name == "swap-trt")
        before = len(triton.requests)
        r = await client.completions.create(model="swap", prompt="after", max_tokens=2)
        assert r.system_fingerprint == "laneway-trtllm" and len(triton.requests) == before + 1
        results = await asyncio.gather(*running)
        assert results == [(40, "length")] * 8  # every request that started on vLLM finished there
        assert not [rid for rid in vllm.cancelled if rid.startswith("cmpl-")]
    finally:
        vllm.token_delay_s = 0.002
