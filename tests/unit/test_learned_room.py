"""With the shipped lanes (no lane caps), a replica's room is its learned running limit (issue 38,
item 3): laneway fills an engine that has room and stops at the engine's own limit, so the
engine's queue never grows; a tenant under its share is bound at once while another tenant
holds the rest of the deployment; and admission refuses by predicted TTFT only what cannot meet
its bound, its wait played out from the running requests' ages (a stream near its end frees
its slot soon), and only on a model that is warm and recently right."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
import yaml
from laneway.bootstrap import POLICIES_DIR
from laneway.contracts.errors import GatewayError
from laneway.core.latency import ReplicaLatencyModel
from laneway.core.latency.outlook import Outlook, ReplicaState
from laneway.core.pipeline import Gateway, GenerationIntent
from laneway.core.pipeline.lease import Lease
from laneway.core.policy import LanePolicy, PolicySnapshot, PolicyStore
from laneway.core.scheduler import DeploymentScheduler, Ticket
from laneway.engines.registry import EngineRegistry
from laneway.types import TenantSnapshot
from support.specs import sim_replica
from support.waiting import until

F = TenantSnapshot(id=1, name="flood", api_key_id=11)
B = TenantSnapshot(id=2, name="b", api_key_id=12)


def shipped_lanes() -> tuple[LanePolicy, ...]:
    """policies/lanes.yaml as the policy snapshot reads it from its seeded rows."""
    lanes = yaml.safe_load((POLICIES_DIR / "lanes.yaml").read_text())["lanes"]
    return tuple(
        LanePolicy(**{**lane, "match_tasks": frozenset(lane["match_tasks"]) if "match_tasks" in lane else None})
        for lane in lanes
    )


def stream(max_tokens: int = 4000) -> GenerationIntent:
    """A short streamed chat: the interactive lane's."""
    return GenerationIntent(endpoint="chat", alias="m", stream=True, prompt="hello there", max_tokens=max_tokens)


@contextlib.asynccontextmanager
async def deployment(**sim: object) -> AsyncIterator[tuple[Gateway, EngineRegistry]]:
    registry = EngineRegistry()
    await registry.load([sim_replica(0, **sim)])
    gw = Gateway(registry, PolicyStore(None, PolicySnapshot(lanes=shipped_lanes())))  # type: ignore[arg-type]
    try:
        yield gw, registry
    finally:
        await registry.close()


async def first_token(gw: Gateway, lease: Lease) -> None:
    async for delta in gw.run(lease):
        if delta.text:
            return


def test_the_shipped_lanes_set_no_cap() -> None:
    assert all(lane.max_concurrency is None for lane in shipped_lanes())


async def test_the_defaults_fill_an_engine_with_room_and_stop_before_its_own_queue_grows() -> None:
    # 64 sequences, fast at 32 (2 ms + 0.1 ms a sequence a step: far inside the 100 ms target).
    async with deployment(max_concurrency=64) as (gw, registry):
        engine = registry.deployments()[0].engine
        leases: list[Lease] = []
        tasks: list[asyncio.Task[None]] = []

        async def offer(n: int) -> None:
            for _ in range(n):
                lease = gw.lease(await gw.prepare(F, stream()))
                leases.append(lease)
                tasks.append(asyncio.ensure_future(gw.acquire(lease)))

        try:
            await offer(32)
            await until(lambda: all(t.done() for t in tasks), what="32 streams on a 64-sequence engine admitted")
            running = [asyncio.ensure_future(first_token(gw, lease)) for lease in leases]
            await asyncio.gather(*running)
            assert engine.active_slots == 32 and engine.waiting == 0  # every offered stream runs, none waits
            await offer(48)  # 80 offered: past the engine's 64
            await until(lambda: sum(t.done() for t in tasks) == 64, what="the engine's 64 sequences taken")
            await asyncio.sleep(0.05)
            assert sum(t.done() for t in tasks) == 64  # the other 16 wait in laneway, where order is kept
            scheduler = gw.waiting.scheduler(registry.deployments()[0])
            assert scheduler.running_total == 64 and scheduler.waiting_total == 16
            assert engine.waiting == 0  # the engine's own queue never grows from laneway's side
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, GatewayError):
                    await task
            for lease in leases:
                lease.release()


async def test_a_tenant_under_its_share_is_bound_at_once_while_another_holds_the_deployment() -> None:
    """The noisy neighbour with the shipped lanes: F keeps 100 streams on an 8-sequence
    deployment (none of them ever ends here); B, active before, is bound at once: it waits for
    none of F's streams to end."""
    async with deployment(max_concurrency=8) as (gw, registry):
        held: list[Lease] = []
        tasks: list[asyncio.Task[None]] = []

        async def ask(tenant: TenantSnapshot) -> tuple[Lease, asyncio.Task[None]]:
            lease = gw.lease(await gw.prepare(tenant, stream()))
            held.append(lease)
            task = asyncio.ensure_future(gw.acquire(lease))
            tasks.append(task)
            return lease, task

        try:
            _, before = await ask(B)  # B's earlier stream: B is an active tenant here
            await before
            held.pop().release()
            flood = [(await ask(F))[1] for _ in range(100)]
            await asyncio.sleep(0.01)
            scheduler = gw.waiting.scheduler(registry.deployments()[0])
            assert sum(t.done() and not t.exception() for t in flood) == 7  # F: all but the newcomers' slot
            _, b = await ask(B)
            await asyncio.wait_for(b, 0.5)  # bound while every one of F's streams still runs
            assert scheduler.running_total == 8 and scheduler.capacity == 8
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, GatewayError):
                    await task
            for lease in held:
                lease.release()


def warm_model(now: float, *, service_s: float, error: float = 0.05) -> ReplicaLatencyModel:
    """A one-slot replica's model that has seen 20 requests: TTFT 50 ms, each holding the slot
    `service_s`, its predictions `error` off."""
    model = ReplicaLatencyModel()
    for i in range(20):
        model.observe_ttft(now, 10.0 + i, 0.0, 1.0, 0.05)
        model.observe_service(now, service_s)
        model.observe_error(now, error)
    return model


def test_a_request_behind_a_stream_near_its_end_is_predicted_that_streams_rest_not_a_whole_stream() -> None:
    """One slot, streams of 20 s, a 30 s bound: behind one that ran 19 s the next first token
    comes in about 1 s; counted as one slot per mean hold it was 20 s, and one more queued
    then 40 s: refused, where waiting served it (what CI saw on real llama.cpp)."""
    now = time.perf_counter()
    model = warm_model(now, service_s=20.0)
    model.begin(now - 19.0, prompt_tokens=10)  # running for 19 s
    outlook = Outlook.of([ReplicaState(model, outstanding=1, capacity=1)], 10.0, now=now)
    assert outlook is not None and outlook.refuses
    assert outlook.ttft(0) == pytest.approx(1.05, abs=0.1)  # its rest, then its own first token
    assert outlook.ttft(1) == pytest.approx(21.05, abs=0.1)  # the next one holds it a whole stream
    assert outlook.ttft(1, low=True) < 30.0  # within the bound: admitted
    assert outlook.ttft(2) > 30.0  # two whole streams behind it: cannot meet the bound


def test_a_cold_or_recently_wrong_model_refuses_nothing() -> None:
    now = time.perf_counter()
    few = ReplicaLatencyModel()
    for _ in range(4):  # predicts (3 observations) but is not warm enough to refuse on
        few.observe_ttft(now, 10.0, 0.0, 1.0, 0.05)
        few.observe_service(now, 1.0)
        few.observe_error(now, 0.05)
    wrong = warm_model(now, service_s=1.0, error=0.9)  # its recent predictions 90 % off
    stale = warm_model(now - 120.0, service_s=1.0)  # learned two minutes ago: decayed away
    for model in (few, wrong, stale):
        outlook = Outlook.of([ReplicaState(model, outstanding=1, capacity=1)], 10.0, now=now)
        assert outlook is not None and not outlook.refuses
    assert warm_model(now, service_s=1.0).trusted(now)


async def test_counted_in_queue_places_the_first_slot_frees_as_the_oldest_hold_ends() -> None:
    """The fallback while a model is cold or untrusted: one slot, a stream holding it 19 s of
    its mean 20 s: the next request waits about 1 s, not a whole hold."""
    clock = [0.0]
    scheduler = DeploymentScheduler(1, clock=lambda: clock[0])
    lane = LanePolicy("standard", queue_timeout_s=30.0)
    await scheduler.acquire(Ticket("running", 1, 1.0, 10, lane))
    scheduler._service_s["standard"] = 20.0  # its lane's mean hold, as releases measured it
    clock[0] = 19.0
    assert scheduler.predicted_wait(lane, 2) == pytest.approx(1.0)
    assert scheduler.predicted_wait(lane) == pytest.approx(1.0)  # nobody queued: the next slot is its
