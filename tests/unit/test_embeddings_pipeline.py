"""Embeddings through the pipeline without HTTP, on the sim embedder: a deployment is chosen
by what it serves, the call is a generation-less one (its input tokens are what is reserved,
scheduled and settled), and every way it ends leaves one usage row and nothing held."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import CLIENT_CLOSED, EmbeddingIntent, Gateway, GenerationIntent
from laneway.core.policy import LanePolicy, PolicySnapshot, PolicyStore
from laneway.core.ratelimit import MemoryRateLimiter
from laneway.db.repositories import DeploymentSpec
from laneway.engines.registry import EngineRegistry
from laneway.types import TenantSnapshot
from laneway.usage import UsageRecorder
from support import until, usage_rows

TENANT = TenantSnapshot(id=1, name="acme", api_key_id=11, tpm=1000)
LANES = (LanePolicy("embed", match_tasks=frozenset({"embeddings"})), LanePolicy("standard"))


def sim(name: str, alias: str, **config: Any) -> DeploymentSpec:
    return DeploymentSpec(1, name, alias, "sim", {"decode_ms_base": 0.1, **config}, "q", "sim", 64)


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    registry = EngineRegistry()
    # One alias with a generating and an embedding deployment: each request finds its kind.
    await registry.load([sim("m-chat", "m"), sim("m-embed", "m", embeddings=True, embedding_dim=16)])
    recorder = UsageRecorder(None, interval_s=60)  # type: ignore[arg-type]
    gw = Gateway(registry, PolicyStore(None, PolicySnapshot(lanes=LANES)), MemoryRateLimiter(), sinks=[recorder])
    yield gw
    await registry.close()


async def test_embeddings_go_to_the_embedder_and_are_reserved_and_settled_as_input_tokens(gateway: Gateway) -> None:
    call = await gateway.prepare_embeddings(TENANT, EmbeddingIntent(alias="m", inputs=["abcd" * 3, "abcd"], user="u"))
    assert (call.deployment.spec.name, call.lane.name, call.task) == ("m-embed", "embed", "embeddings")
    assert call.endpoint == "embeddings"
    assert call.prompt_tokens == 3 + 1 and call.generation.max_tokens == 0
    lease = await gateway.admit(call)
    assert lease.reservation is not None and lease.reservation.tokens == 4 and lease.ticket is not None
    assert lease.ticket.cost == 4
    result = await gateway.embed(lease)
    lease.release()
    assert result.vectors.shape == (2, 16) and np.allclose(np.linalg.norm(result.vectors, axis=1), 1.0)
    [row] = usage_rows(gateway)
    assert (row["endpoint"], row["status"], row["prompt_tokens"], row["completion_tokens"]) == ("embeddings", 200, 4, 0)
    assert (row["lane"], row["end_user"], row["stream"]) == ("embed", "u", False)
    chat = await gateway.prepare(TENANT, GenerationIntent(endpoint="chat", alias="m", stream=False, prompt="hi"))
    assert chat.deployment.spec.name == "m-chat"  # text goes to the deployment that generates
    assert gateway.in_flight == 0 and call.deployment.outstanding == 0


async def test_an_input_beyond_the_context_is_refused_not_truncated(gateway: Gateway) -> None:
    with pytest.raises(GatewayError) as info:
        await gateway.prepare_embeddings(TENANT, EmbeddingIntent(alias="m", inputs=["short", "x" * 400]))
    assert (info.value.status, info.value.code, info.value.param) == (400, "context_length_exceeded", "input")
    assert "input[1]" in info.value.message


async def test_cancelled_while_embedding_frees_the_slot_and_is_recorded_as_client_closed(gateway: Gateway) -> None:
    call = await gateway.prepare_embeddings(TENANT, EmbeddingIntent(alias="m", inputs=["a"]))
    engine: Any = call.deployment.engine
    engine.embed_ms = 60_000
    lease = await gateway.admit(call)
    task = asyncio.ensure_future(gateway.embed(lease))
    await until(lambda: engine.active_slots, step=0, what="the embedding under way")  # the sim's counter
    assert engine.active_slots == 1 and ("embed", 0, 1) in gateway.scheduler(call.deployment).lane_stats()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.active_slots == 0 and call.deployment.outstanding == 0
    lease.release()
    lease.release()  # idempotent: one row
    assert [r["status"] for r in usage_rows(gateway)] == [CLIENT_CLOSED]
    assert isinstance(gateway.limiter, MemoryRateLimiter) and gateway.limiter.holders == 0


async def test_an_engine_fault_is_503_engine_error(gateway: Gateway) -> None:
    call = await gateway.prepare_embeddings(TENANT, EmbeddingIntent(alias="m", inputs=["ok", "<<laneway-sim-fault>>"]))
    lease = await gateway.admit(call)
    with pytest.raises(GatewayError) as info:
        await gateway.embed(lease)
    lease.release()
    assert (info.value.status, info.value.code) == (503, "engine_error")
    assert usage_rows(gateway)[-1]["status"] == 503 and gateway.in_flight == 0


async def test_a_model_without_an_embedder_is_400_naming_it() -> None:
    registry = EngineRegistry()
    await registry.load([sim("c-chat", "c")])
    gw = Gateway(registry, PolicyStore(None), sinks=[UsageRecorder(None, interval_s=60)])  # type: ignore[arg-type]
    try:
        with pytest.raises(GatewayError) as info:
            await gw.prepare_embeddings(TENANT, EmbeddingIntent(alias="c", inputs=["a"]))
        assert (info.value.status, info.value.code, info.value.param) == (400, "unsupported_parameter", "model")
        with pytest.raises(GatewayError) as denied:  # a key that may not use the model learns nothing more
            await gw.prepare_embeddings(
                TenantSnapshot(2, "t", 2, allowed_models=frozenset()), EmbeddingIntent(alias="c", inputs=["a"])
            )
        assert denied.value.status == 403
    finally:
        await registry.close()
