"""One owner for a request's resources: whatever await a request is cancelled at, and however
it ends, its engine slot, outstanding count, rate-limit reservation and concurrency holder
come back, exactly once, and it leaves one usage row."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import CLIENT_CLOSED, Gateway, GenerationIntent
from laneway.core.pipeline.stream import pumped
from laneway.core.policy import LanePolicy, PolicySnapshot, PolicyStore
from laneway.core.ratelimit import MemoryRateLimiter, Reservation
from laneway.core.scheduler import DeploymentScheduler, Ticket
from laneway.db.repositories import DeploymentSpec
from laneway.engines.registry import EngineRegistry
from laneway.types import TenantSnapshot
from laneway.usage import UsageRecorder
from support import usage_rows

LANE = LanePolicy(name="only", max_concurrency=2, max_queue_depth=100, queue_timeout_s=30)
TENANT = TenantSnapshot(id=1, name="acme", api_key_id=11, max_concurrency=100)


class SlowMemoryLimiter(MemoryRateLimiter):
    """The memory limiter behind a network-like await, so reserve() can be cancelled mid-way."""

    def reserve_at_once(
        self, tenant: TenantSnapshot, tokens: int, request_id: str, cost: int = 0
    ) -> Reservation | None:
        return None  # never decided without the network

    async def reserve(self, tenant: TenantSnapshot, tokens: int, request_id: str, cost: int = 0) -> Reservation:
        await asyncio.sleep(0)
        reservation = self.reserve_now(tenant, tokens, request_id, cost)
        await asyncio.sleep(0)  # the answer is "on the wire" when the caller is cancelled
        return reservation


@pytest.fixture(params=["memory", "remote"])
async def gateway(request: pytest.FixtureRequest) -> Any:
    registry = EngineRegistry()
    # A step costs nothing: each decode step is one event-loop iteration, so "cancel after k
    # iterations" walks through every await of the request, deterministically.
    config = {"max_concurrency": 2, "decode_ms_base": 0, "decode_ms_per_seq": 0, "prefill_ms_per_token": 0}
    spec = DeploymentSpec(1, "m-sim", "m", "sim", config, "q", "g", 4096)
    await registry.load([spec])
    limiter = MemoryRateLimiter() if request.param == "memory" else SlowMemoryLimiter()
    gw = Gateway(registry, PolicyStore(None, PolicySnapshot(lanes=(LANE,))), limiter, sinks=[UsageRecorder(None)])  # type: ignore[arg-type]
    yield gw
    await registry.close()


def assert_nothing_held(gw: Gateway) -> None:
    [d] = gw.registry.deployments()
    scheduler = gw.scheduler(d)
    assert (d.outstanding, scheduler.running_total, scheduler.waiting_total) == (0, 0, 0)
    assert d.engine.active_slots == 0 and gw.in_flight == 0
    limiter = gw.limiter
    assert isinstance(limiter, MemoryRateLimiter) and limiter.in_flight(TENANT.id) == 0


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def test_a_waiter_cancelled_as_it_is_granted_hands_the_slot_back() -> None:
    s = DeploymentScheduler(1)
    holder = Ticket("holder", 1, 1.0, 1, LANE)
    await s.acquire(holder)
    waiter = Ticket("waiter", 1, 1.0, 1, LANE)
    task = asyncio.create_task(s.acquire(waiter))
    await asyncio.sleep(0)
    assert s.depth("only") == 1
    s.release(holder)  # grants the waiter ...
    task.cancel()  # ... which is cancelled in the same instant
    with pytest.raises(asyncio.CancelledError):  # wait_for(shield()) returned normally here
        await task
    assert s.running_total == 0 and s.depth("only") == 0


async def test_cancelled_at_every_await_of_admission_and_generation_nothing_leaks(gateway: Gateway) -> None:
    """Run a request through admit -> run -> release, cancelling it after k loop iterations
    for every k until one gets through: each time, everything comes back and one row is left."""
    for stream in (True, False):
        k = 0
        while True:
            # Two hogs fill both slots, so the request also waits in the queue for a while.
            hogs = [await gateway.admit(await prepared(gateway, stream=True)) for _ in range(2)]
            call = await prepared(gateway, stream=stream)
            opened = []

            async def request(call: Any = call, opened: list[Any] = opened) -> str:
                lease = gateway.lease(call)  # as the HTTP layer does: opened before the first await
                opened.append(lease)
                try:
                    await gateway.acquire(lease)
                    return "".join([d.text async for batch in pumped(gateway, lease, limit=10_000) for d in batch])
                except BaseException as exc:
                    call.fail(gateway.outcome_of(exc))
                    raise
                finally:
                    lease.release()

            task = asyncio.create_task(request())
            for i in range(k):
                await asyncio.sleep(0)
                if i == 2:  # free the slots part-way: at k == 3 the grant races the cancel
                    for hog in hogs:
                        hog.release()
            task.cancel()
            for hog in hogs:
                hog.release()
            outcome = await asyncio.gather(task, return_exceptions=True)
            await settle()
            assert_nothing_held(gateway)
            rows = [r for r in usage_rows(gateway) if r["request_id"] == call.request_id]
            assert len(rows) == len(opened), (k, rows)  # cancelled before it started: nothing taken
            if not isinstance(outcome[0], asyncio.CancelledError):
                assert rows[0]["status"] == 200
                break
            if rows:
                assert (rows[0]["status"], rows[0]["error_code"]) == (CLIENT_CLOSED, "client_disconnected")
            k += 1
            assert k < 500, "the request never completed"
        assert k > 10  # it was cut at many points before one got through


async def prepared(gateway: Gateway, *, stream: bool) -> Any:
    return await gateway.prepare(
        TENANT, GenerationIntent(endpoint="completions", alias="m", stream=stream, prompt="hi", max_tokens=4)
    )


async def test_release_is_idempotent_and_refusals_release_too(gateway: Gateway) -> None:
    lease = await gateway.admit(await prepared(gateway, stream=False))
    lease.release()
    lease.release()
    assert len(usage_rows(gateway)) == 1
    limited = TenantSnapshot(id=1, name="acme", api_key_id=11, tpm=1)
    call = await gateway.prepare(
        limited, GenerationIntent(endpoint="completions", alias="m", stream=False, prompt="hi", max_tokens=4)
    )
    with pytest.raises(GatewayError):
        await gateway.admit(call)  # 429: more tokens than the tenant's TPM
    assert_nothing_held(gateway)
    assert usage_rows(gateway)[-1]["status"] == 429


async def test_a_lease_whose_generation_is_left_suspended_still_frees_the_engine(gateway: Gateway) -> None:
    call = await gateway.prepare(
        TENANT, GenerationIntent(endpoint="completions", alias="m", stream=True, prompt="hi", max_tokens=500)
    )
    lease = await gateway.admit(call)
    deltas = gateway.run(lease)
    await anext(deltas)  # generating; then nobody iterates or closes it
    assert call.deployment.engine.active_slots == 1
    lease.release()
    await settle()
    assert_nothing_held(gateway)


async def test_drain_refuses_the_queued_lets_the_running_finish_then_cuts(gateway: Gateway) -> None:
    running = [await gateway.admit(await prepared(gateway, stream=True)) for _ in range(2)]
    queued_call = await prepared(gateway, stream=False)
    queued = asyncio.create_task(gateway.admit(queued_call))
    await settle()
    interrupted: list[GatewayError] = []
    running[0].interrupter = interrupted.append
    drain = asyncio.create_task(gateway.drain(0.05, cut_grace_s=0.05))
    with pytest.raises(GatewayError) as refused:
        await queued
    assert refused.value.status == 503 and refused.value.code == "shutting_down"
    assert "Retry-After" in refused.value.headers
    with pytest.raises(GatewayError):
        await gateway.admit(await prepared(gateway, stream=False))  # no new admissions
    await drain  # the two running never ended: cut, then released
    assert [e.code for e in interrupted] == ["shutting_down"]
    assert_nothing_held(gateway)
    statuses = sorted((r["status"], r["error_code"]) for r in usage_rows(gateway))
    assert statuses == [(503, "shutting_down")] * 4
