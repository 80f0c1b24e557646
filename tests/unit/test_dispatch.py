"""Late binding and cache-aware placement (core/dispatch/), through the Gateway with simulated
replicas: where a request waits, which replica it is bound to and why, and that nothing leaks
whatever ends it."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import pytest
from laneway.contracts.errors import GatewayError
from laneway.core.dispatch import Dispatcher, RoutingParams
from laneway.core.pipeline import Gateway, GatewayConfig, GenerationIntent
from laneway.core.pipeline.lease import Lease
from laneway.core.policy import LanePolicy, PolicySnapshot, PolicyStore
from laneway.engines.registry import EngineRegistry, LiveDeployment
from laneway.types import DeploymentSpec, TenantSnapshot
from support import until
from support.pipeline import run_admitted
from support.specs import sim_replica

ACME = TenantSnapshot(id=1, name="acme", api_key_id=11)
BETA = TenantSnapshot(id=2, name="beta", api_key_id=22)
SYSTEM = "You are a careful assistant for the billing team. " * 40  # about 2 KB: several blocks


def spec(i: int, slots: int = 2, **config: object) -> DeploymentSpec:
    return sim_replica(i, **{"decode_ms_base": 2.0, "prefill_ms_per_token": 0.0, "max_concurrency": slots, **config})


@pytest.fixture
async def replicas() -> EngineRegistry:
    registry = EngineRegistry()
    await registry.load([spec(0), spec(1), spec(2)])
    yield registry
    await registry.close()


def gateway(registry: EngineRegistry, routing: str = "cache_aware") -> Gateway:
    return Gateway(registry, PolicyStore(None), config=GatewayConfig(routing=routing))  # type: ignore[arg-type]


def chat(prompt: str, *, key: str | None = None, max_tokens: int = 2) -> GenerationIntent:
    return GenerationIntent(
        endpoint="completions", alias="m", stream=False, prompt=prompt, max_tokens=max_tokens, prompt_cache_key=key
    )


async def served_by(gw: Gateway, tenant: TenantSnapshot, intent: GenerationIntent) -> tuple[str, str | None]:
    call = await gw.prepare(tenant, intent)
    await run_admitted(gw, call)
    return call.deployment.spec.name, call.route_reason


async def hold(gw: Gateway, tenant: TenantSnapshot, prompt: str) -> Lease:
    """An admitted request that holds its slot until released."""
    return await gw.admit(await gw.prepare(tenant, chat(prompt)))


def queued(gw: Gateway) -> int:
    """Requests waiting for a slot: in the alias's queue (any replica) or in a replica's own."""
    replicas = gw.registry.deployments()
    return gw.waiting.dispatch.alias_scheduler("m").waiting_total + sum(gw.scheduler(d).waiting_total for d in replicas)


async def test_a_conversations_next_turn_goes_back_to_the_replica_holding_its_prefix(replicas: EngineRegistry) -> None:
    gw = gateway(replicas)
    first, _ = await served_by(gw, ACME, chat(SYSTEM + "Q: my invoice?"))
    for question in ("Q: my invoice? A: sent. Q: when?", "Q: my refund, please"):
        assert await served_by(gw, ACME, chat(SYSTEM + question)) == (first, "prefix")


async def test_another_tenants_same_prompt_finds_no_cached_prefix(replicas: EngineRegistry) -> None:
    gw = gateway(replicas)
    await served_by(gw, ACME, chat(SYSTEM + "Q: my invoice?"))
    _, reason = await served_by(gw, BETA, chat(SYSTEM + "Q: my invoice?"))
    assert reason != "prefix"  # its salt starts another chain: acme's blocks never match


async def test_a_prompt_cache_key_keeps_a_session_on_its_replica_whatever_the_prompt(replicas: EngineRegistry) -> None:
    gw = gateway(replicas)
    first, _ = await served_by(gw, ACME, chat("short one", key="conv-7"))
    for prompt in ("another", "a third, unrelated", "x" * 600):
        assert await served_by(gw, ACME, chat(prompt, key="conv-7")) == (first, "session")


async def test_a_hot_prefix_spills_to_other_replicas_once_its_replica_is_busier(replicas: EngineRegistry) -> None:
    gw = gateway(replicas)
    home, _ = await served_by(gw, ACME, chat(SYSTEM + "warm"))
    leases = [gw.lease(await gw.prepare(ACME, chat(SYSTEM + f"q{i}"))) for i in range(7)]
    waits = [asyncio.ensure_future(gw.acquire(lease)) for lease in leases]  # 3 replicas x 2 slots, and one
    try:
        await until(
            lambda: all(lease.placement is not None and lease.placement.replica for lease in leases),
            what="every request bound",
        )
        placed = [lease.placement.replica.spec.name for lease in leases if lease.placement]
        # The hot replica takes more than its share while it is at most one engine's worth busier
        # than the least busy (it may queue one beyond its two slots), then the rest spread.
        # The slot-counted guard decides because the replicas' latency models are cold here (one
        # observation): warm, predicted seconds decide instead (tests/unit/test_predicted_ttft.py).
        assert 2 <= placed.count(home) <= 3
        assert {d.spec.name for d in replicas.deployments()} <= set(placed)
    finally:
        for lease, wait in zip(leases, waits, strict=True):
            wait.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await wait
            lease.release()
    assert [d.outstanding for d in replicas.deployments()] == [0, 0, 0]


async def test_a_request_waits_for_any_replica_and_takes_the_first_that_frees(replicas: EngineRegistry) -> None:
    gw = gateway(replicas)
    held = [await hold(gw, ACME, f"filler {i}") for i in range(6)]
    call = await gw.prepare(BETA, chat("waiting one"))
    lease = gw.lease(call)
    waiter = asyncio.ensure_future(gw.acquire(lease))
    try:
        await until(lambda: queued(gw) == 1, what="the waiter queued")
        assert not waiter.done() and lease.placement is not None and lease.placement.replica is None
        assert sum(d.outstanding for d in replicas.deployments()) == 6  # it is bound to none of them
        freed = held.pop(4)
        freed.release()
        await waiter
        assert call.deployment is freed.call.deployment  # whichever replica freed, not one chosen at arrival
    finally:
        lease.release()
        for h in held:
            h.release()
    assert [d.outstanding for d in replicas.deployments()] == [0, 0, 0]


async def test_a_client_leaving_while_waiting_for_any_replica_leaks_nothing(replicas: EngineRegistry) -> None:
    gw = gateway(replicas)
    held = [await hold(gw, ACME, f"filler {i}") for i in range(6)]
    waiters = []
    for i in range(3):
        call = await gw.prepare(BETA, chat(f"leaver {i}"))
        lease = gw.lease(call)
        waiters.append((lease, asyncio.ensure_future(gw.acquire(lease))))
    await until(lambda: queued(gw) == 3, what="three waiters queued")
    waiters[1][1].cancel()  # one leaves while waiting
    held[0].release()  # and a slot frees in the same instant
    waiters[2][1].cancel()
    for lease, task in waiters:
        with contextlib.suppress(asyncio.CancelledError):
            await task
        lease.release()
    for h in held[1:]:
        h.release()
    await until(lambda: gw.in_flight == 0, what="every lease released")
    assert [d.outstanding for d in replicas.deployments()] == [0, 0, 0]
    assert [gw.scheduler(d).running_total for d in replicas.deployments()] == [0, 0, 0]
    alias = gw.waiting.dispatch.alias_scheduler("m")
    assert (alias.running_total, alias.waiting_total) == (0, 0)


async def test_a_tenant_under_its_share_gets_the_next_free_slot_ahead_of_a_flood(replicas: EngineRegistry) -> None:
    gw = gateway(replicas)
    flood: list[tuple[Lease, asyncio.Future[None]]] = []
    for i in range(20):
        call = await gw.prepare(ACME, chat(f"flood {i}"))
        lease = gw.lease(call)
        flood.append((lease, asyncio.ensure_future(gw.acquire(lease))))
    await until(lambda: queued(gw) == 14, what="the flood queued past its six slots")
    running = [lease for lease, task in flood if task.done()]
    assert len(running) == 6  # alone, a tenant may use every slot of the alias
    newcomer = gw.lease(await gw.prepare(BETA, chat("hello")))
    waiter = asyncio.ensure_future(gw.acquire(newcomer))
    await until(lambda: queued(gw) == 15, what="the newcomer queued")
    assert not waiter.done()
    running[0].release()  # the first slot that frees goes to beta, not to acme's next in line
    await asyncio.wait_for(waiter, 1)
    assert sum(task.done() for _, task in flood) == 6
    newcomer.release()
    for lease, task in flood:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        lease.release()
    assert [d.outstanding for d in replicas.deployments()] == [0, 0, 0]


async def test_gateways_that_share_nothing_place_a_new_prompt_alike(replicas: EngineRegistry) -> None:
    one, two = gateway(replicas), gateway(replicas)
    for i in range(5):
        prompt = f"Conversation {i}: " + SYSTEM
        assert (await served_by(one, ACME, chat(prompt)))[0] == (await served_by(two, ACME, chat(prompt)))[0]


async def test_a_replica_serving_another_lane_only_is_not_chosen(replicas: EngineRegistry) -> None:
    registry = EngineRegistry()
    await registry.load([spec(0), spec(1, lanes=["batch"])])
    try:
        gw = gateway(registry)
        for i in range(4):
            assert (await served_by(gw, ACME, chat(f"interactive {i}")))[0] == "m-0"
    finally:
        await registry.close()


async def test_baselines_bind_at_arrival(replicas: EngineRegistry) -> None:
    rr = gateway(replicas, routing="round_robin")
    assert [(await served_by(rr, ACME, chat(SYSTEM)))[0] for _ in range(3)] == ["m-0", "m-1", "m-2"]
    lo = gateway(replicas, routing="least_outstanding")
    held = await hold(lo, ACME, "one")
    assert held.call.deployment.spec.name == "m-0" and not held.late
    assert (await served_by(lo, ACME, chat("two")))[0] == "m-1"
    held.release()
    with pytest.raises(ValueError, match="routing must be one of"):
        Dispatcher(replicas, lambda d: 1, routing="random")


async def test_the_alias_queue_holds_as_many_as_its_replicas_queues_would(replicas: EngineRegistry) -> None:
    lane = LanePolicy("standard", max_queue_depth=2, max_concurrency=2, queue_timeout_s=30)
    gw = Gateway(replicas, PolicyStore(None, PolicySnapshot(lanes=(lane,))))  # type: ignore[arg-type]
    held = [await hold(gw, ACME, f"filler {i}") for i in range(6)]
    waiting = []
    for i in range(6):  # 3 replicas x a depth of 2
        lease = gw.lease(await gw.prepare(ACME, chat(f"queued {i}")))
        waiting.append((lease, asyncio.ensure_future(gw.acquire(lease))))
    await until(lambda: queued(gw) == 6, what="six waiters queued")
    assert not any(task.done() for _, task in waiting)
    with pytest.raises(GatewayError) as refused:
        await gw.admit(await gw.prepare(ACME, chat("one too many")))
    assert refused.value.code == "queue_full"
    for lease, task in waiting:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        lease.release()
    for h in held:
        h.release()
    assert [d.outstanding for d in replicas.deployments()] == [0, 0, 0]


async def test_an_engine_that_knows_its_cache_is_believed_over_the_index(replicas: EngineRegistry) -> None:
    gw = gateway(replicas)
    asked: list[str | None] = []
    knowing = replicas.deployments()[2]

    def cached_prefix_tokens(token_ids: tuple[int, ...], salt: str | None) -> int:
        asked.append(salt)
        return len(token_ids) // 2  # as vLLM's KV events would tell: half of it is cached there

    knowing.engine.cached_prefix_tokens = cached_prefix_tokens  # type: ignore[attr-defined]
    for d in replicas.deployments()[:2]:
        d.engine.cached_prefix_tokens = lambda ids, salt: None  # type: ignore[attr-defined]  # unknown: the index decides
    call = await gw.prepare(ACME, chat("a prompt nobody has placed yet"))
    call.generation.prompt_ids = tuple(range(64))
    lease = await gw.admit(call)
    lease.release()
    assert (call.deployment, call.route_reason, call.cached_estimate) == (knowing, "prefix", 32)
    assert asked == [call.generation.cache_salt]


def test_routing_params_come_from_settings() -> None:
    from laneway.settings import Settings

    params = RoutingParams.from_settings(Settings(routing_imbalance=2.0))
    assert replace(RoutingParams(), imbalance=2.0) == params


def _unused(d: LiveDeployment) -> None: ...


async def test_a_shutdown_refuses_requests_waiting_for_any_replica_and_leaks_nothing(replicas: EngineRegistry) -> None:
    gw = gateway(replicas)
    held = [await hold(gw, ACME, f"filler {i}") for i in range(6)]
    waiting = []
    for i in range(3):
        lease = gw.lease(await gw.prepare(BETA, chat(f"waiting {i}")))
        waiting.append((lease, asyncio.ensure_future(gw.acquire(lease))))
    await until(lambda: queued(gw) == 3, what="three waiters queued")
    drain = asyncio.ensure_future(gw.drain(5.0))
    for lease, task in waiting:
        with pytest.raises(GatewayError) as refused:
            await task
        assert refused.value.code == "shutting_down"
        lease.release()
    for h in held:
        h.release()
    await drain
    assert gw.in_flight == 0 and [d.outstanding for d in replicas.deployments()] == [0, 0, 0]
    alias = gw.waiting.dispatch.alias_scheduler("m")
    assert (alias.running_total, alias.waiting_total) == (0, 0)
