"""The pipeline without HTTP: resolve, measure, policy, stop enforcement, accounting."""

from typing import Any

import pytest
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import CLIENT_CLOSED, Gateway, GatewayConfig, GenerationIntent
from laneway.core.policy import PolicyStore
from laneway.db.repositories import DeploymentSpec
from laneway.engines.registry import EngineRegistry, UnknownModel
from laneway.types import ChatTurn, TenantSnapshot
from laneway.usage import UsageRecorder
from support import usage_rows

TENANT = TenantSnapshot(id=1, name="acme", api_key_id=11)


def spec(alias: str, kind: str = "sim", config: dict[str, Any] | None = None, max_len: int = 256) -> DeploymentSpec:
    return DeploymentSpec(
        id=1,
        name=f"{alias}-{kind}",
        alias=alias,
        engine_kind=kind,
        config=config or {"decode_ms_base": 0.1, "prefill_ms_per_token": 0.0},
        quantization="q8",
        gpu_type="sim",
        max_model_len=max_len,
    )


@pytest.fixture
async def gateway() -> Gateway:
    registry = EngineRegistry()
    await registry.load([spec("sim"), spec("broken", kind="nope")])
    gw = Gateway(
        registry,
        PolicyStore(None),
        sinks=[UsageRecorder(None, interval_s=60)],
        config=GatewayConfig(default_max_tokens=32),
    )  # type: ignore[arg-type]
    yield gw  # type: ignore[misc]
    await registry.close()


async def drain(gw: Gateway, call: Any) -> str:
    lease = await gw.admit(call)
    try:
        return "".join([d.text async for d in gw.run(lease)])
    finally:
        lease.release()


async def test_unknown_model_is_404_and_a_failed_deployment_is_reported(gateway: Gateway) -> None:
    with pytest.raises(GatewayError) as info:
        await gateway.prepare(TENANT, GenerationIntent(endpoint="chat", alias="nope", stream=False, prompt="x"))
    assert (info.value.status, info.value.code, info.value.param) == (404, "model_not_found", "model")
    assert "broken-nope" in gateway.registry.failed and not gateway.registry.ready


async def test_model_outside_the_tenants_allow_list_is_403(gateway: Gateway) -> None:
    tenant = TenantSnapshot(id=2, name="t", api_key_id=2, allowed_models=frozenset({"other"}))
    with pytest.raises(GatewayError) as info:
        await gateway.prepare(tenant, GenerationIntent(endpoint="chat", alias="sim", stream=False, prompt="x"))
    assert info.value.status == 403 and info.value.code == "model_not_allowed"


async def test_prompt_that_fills_the_context_is_400_context_length_exceeded(gateway: Gateway) -> None:
    with pytest.raises(GatewayError) as info:
        await gateway.prepare(
            TENANT, GenerationIntent(endpoint="completions", alias="sim", stream=False, prompt="x" * 1024)
        )
    assert info.value.status == 400 and info.value.code == "context_length_exceeded"


async def test_max_tokens_is_the_clients_when_lower_and_never_beyond_the_context(gateway: Gateway) -> None:
    async def budget(prompt_chars: int, asked: int | None) -> int:
        call = await gateway.prepare(
            TENANT,
            GenerationIntent(
                endpoint="completions", alias="sim", stream=False, prompt="x" * prompt_chars, max_tokens=asked
            ),
        )
        return call.generation.max_tokens

    assert await budget(40, 5) == 5  # the client's own, lower
    assert await budget(40, None) == 32  # the default cap
    assert await budget(1000, 100) == 256 - 250  # the context left


async def test_chat_messages_are_rendered_and_generation_is_accounted(gateway: Gateway) -> None:
    call = await gateway.prepare(
        TENANT,
        GenerationIntent(
            endpoint="chat", alias="sim", stream=True, messages=[ChatTurn("user", "hi")], max_tokens=4, seed=3
        ),
    )
    assert call.generation.prompt.startswith("<|im_start|>user\nhi")
    text = await drain(gateway, call)
    assert call.completion_tokens == 4 and call.finish_reason == "length" and len(text.split()) == 4
    [row] = usage_rows(gateway)
    assert row["tenant_id"] == 1 and row["api_key_id"] == 11 and row["status"] == 200
    assert row["completion_tokens"] == 4 and row["stream"] is True and row["ttft_ms"] is not None


async def test_stop_sequences_are_enforced_by_the_gateway(gateway: Gateway) -> None:
    full = await drain(
        gateway,
        await gateway.prepare(
            TENANT,
            GenerationIntent(endpoint="completions", alias="sim", stream=False, prompt="q", max_tokens=30, seed=5),
        ),
    )
    stop = full.split()[5]  # a word the sim will emit (first occurrence is the cut point)
    call = await gateway.prepare(
        TENANT,
        GenerationIntent(
            endpoint="completions", alias="sim", stream=False, prompt="q", max_tokens=30, seed=5, stop=[stop]
        ),
    )
    text = await drain(gateway, call)
    assert text == full[: full.index(stop)]
    assert call.finish_reason == "stop" and stop not in text


async def test_abandoned_stream_frees_the_engine_and_is_recorded_as_client_closed(gateway: Gateway) -> None:
    call = await gateway.prepare(
        TENANT, GenerationIntent(endpoint="chat", alias="sim", stream=True, prompt="q", max_tokens=200)
    )
    lease = await gateway.admit(call)
    stream = gateway.run(lease)
    await anext(stream)
    engine = call.deployment.engine
    assert engine.active_slots == 1 and call.deployment.outstanding == 1
    await stream.aclose()
    assert engine.active_slots == 0 and call.deployment.outstanding == 0
    lease.release()
    assert usage_rows(gateway)[-1]["status"] == CLIENT_CLOSED


async def test_lanes_map_to_replicas_and_least_outstanding_among_them() -> None:
    from laneway.core.policy import LanePolicy, PolicySnapshot

    def sim(**extra: Any) -> dict[str, Any]:
        return {"decode_ms_base": 0.1, **extra}

    registry = EngineRegistry()
    await registry.load(
        [
            DeploymentSpec(1, "m-fast", "m", "sim", sim(lanes=["interactive"]), "q", "g", 4096),
            DeploymentSpec(2, "m-any", "m", "sim", sim(), "q", "g", 4096),
        ]
    )
    lanes = (LanePolicy("interactive", match_stream=True), LanePolicy("standard"))
    gw = Gateway(registry, PolicyStore(None, PolicySnapshot(lanes=lanes)), sinks=[UsageRecorder(None)])  # type: ignore[arg-type]
    try:
        # The standard lane may only use the replica that serves every lane ...
        bulk = [
            await gw.prepare(
                TENANT, GenerationIntent(endpoint="chat", alias="m", stream=False, prompt="q", max_tokens=50)
            )
            for _ in "ab"
        ]
        assert {c.lane.name for c in bulk} == {"standard"} and {c.deployment.spec.name for c in bulk} == {"m-any"}
        leases = [await gw.admit(c) for c in bulk]
        # ... and interactive traffic avoids it while it has a backlog.
        short = await gw.prepare(
            TENANT, GenerationIntent(endpoint="chat", alias="m", stream=True, prompt="q", max_tokens=50)
        )
        assert (short.lane.name, short.deployment.spec.name) == ("interactive", "m-fast")
        for lease in leases:
            lease.release()
        assert bulk[0].deployment.outstanding == 0
        # Idle: interactive may use either replica (least outstanding, first on ties).
        assert (
            await gw.prepare(TENANT, GenerationIntent(endpoint="chat", alias="m", stream=True, prompt="q"))
        ).deployment.spec.name == "m-fast"
    finally:
        await registry.close()


async def test_warm_up_shapes_and_readiness() -> None:
    from laneway.engines.registry import warmup_prompts

    registry = EngineRegistry()
    await registry.load([spec("w", config={"warmup_system_prompts": ["Be brief."]}, max_len=1000)])
    try:
        assert not registry.ready  # loaded, not yet warm
        [d] = registry.deployments()
        short, long, system = await warmup_prompts(d)
        assert (await d.engine.measure(prompt=short)).tokens < 10
        assert 250 <= (await d.engine.measure(prompt=long)).tokens <= 500  # about half the context
        assert "Be brief." in system and system.startswith("<|im_start|>system")
        await registry.warm_up()
        assert registry.ready and registry.warm == {"w-sim"}
    finally:
        await registry.close()


async def test_live_swap_keeps_the_old_engine_when_the_new_one_cannot_start() -> None:
    registry = EngineRegistry()
    await registry.load([spec("m")])
    try:
        [old] = registry.deployments()
        assert await registry.sync([spec("m", kind="nope")]) == ["m"]
        await registry.warm_up()
        assert registry.resolve("m") is old and "m-nope" in registry.rejected
        assert registry.ready  # still serving with the old engine
        new = DeploymentSpec(9, "m-sim-2", "m", "sim", {"decode_ms_base": 0.1}, "q", "g", 256)
        assert await registry.sync([new]) == ["m"]
        assert registry.resolve("m").spec.name == "m-sim-2" and "m-sim-2" in registry.warm
        assert await registry.sync([]) == ["m"]  # the alias removed
        with pytest.raises(UnknownModel):
            registry.resolve("m")
    finally:
        await registry.close()


async def test_lanes_and_priorities_only_as_far_as_the_tenant_is_granted(gateway: Gateway) -> None:
    """Any key could send X-Laneway-Lane: interactive with a 4K prompt, or priority -1000000."""
    with pytest.raises(GatewayError) as info:
        await gateway.prepare(
            TENANT, GenerationIntent(endpoint="chat", alias="sim", stream=False, prompt="x", lane="interactive")
        )
    assert (info.value.status, info.value.code, info.value.param) == (403, "lane_not_allowed", "X-Laneway-Lane")
    call = await gateway.prepare(
        TENANT, GenerationIntent(endpoint="chat", alias="sim", stream=False, prompt="x", priority=-1_000_000)
    )
    assert call.generation.priority == 0  # clamped to the tenant's floor
    trusted = TenantSnapshot(id=3, name="ops", api_key_id=3, allowed_lanes=frozenset({"gone"}), priority_floor=-10)
    call = await gateway.prepare(
        trusted, GenerationIntent(endpoint="chat", alias="sim", stream=False, prompt="x", priority=-1_000_000)
    )
    assert call.generation.priority == -10
    with pytest.raises(GatewayError) as info:  # granted, but no such lane: the router's 400
        await gateway.prepare(
            trusted, GenerationIntent(endpoint="chat", alias="sim", stream=False, prompt="x", lane="gone")
        )
    assert info.value.status == 400
