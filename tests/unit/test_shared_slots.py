"""Engine slots shared by replicas through real Redis: two SharedSlots in one process stand for
two gateway replicas. Never more than the engine's capacity in flight together, one fair
order across replicas (lanes first, then tenants by weight), a dead replica's slots back by
lease expiry, and the local fallback share when Redis is gone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from laneway.contracts.errors import GatewayError
from laneway.core.policy import LanePolicy
from laneway.core.scheduler import Ticket
from laneway.core.shared_slots import SharedScheduler, SharedSlots, fallback_share
from support import REDIS_URL, PrivateRedis, require_service, until

FAST = LanePolicy(name="interactive", priority=0, max_concurrency=8, max_queue_depth=100, queue_timeout_s=10)
SLOW = LanePolicy(name="standard", priority=1, max_concurrency=8, max_queue_depth=100, queue_timeout_s=10)


@pytest.fixture
async def replicas(request: pytest.FixtureRequest) -> AsyncIterator[list[SharedSlots]]:
    require_service("Redis", "127.0.0.1", 6379)
    prefix = f"lwtest:{uuid.uuid4().hex}:"
    slots = [SharedSlots(REDIS_URL, prefix, replica_id=f"r{i}", lease_ttl_s=1.0) for i in range(2)]
    for s in slots:
        await s.start()
    yield slots
    for s in slots:
        await s.close()


def ticket(n: int, tenant: int = 1, lane: LanePolicy = FAST, weight: float = 1.0) -> Ticket:
    return Ticket(f"t{n}-{uuid.uuid4().hex[:6]}", tenant, weight, 10, lane)


async def test_two_replicas_never_exceed_the_engines_capacity(replicas: list[SharedSlots]) -> None:
    schedulers = [r.scheduler("engine-a", 3) for r in replicas]
    running = 0
    peak = 0

    async def one(s: SharedScheduler, n: int) -> None:
        nonlocal running, peak
        t = ticket(n)
        await s.acquire(t)
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        s.release(t)

    await asyncio.gather(*(one(schedulers[n % 2], n) for n in range(40)))
    assert peak == 3


async def test_one_fair_order_across_replicas(replicas: list[SharedSlots]) -> None:
    """Replica 0 holds the only slot and queues a flood of tenant 1; tenant 2's single request
    arrives on replica 1 later, and the fair order serves it within a round."""
    a, b = (r.scheduler("engine-b", 1) for r in replicas)
    holder = ticket(0)
    await a.acquire(holder)
    order: list[int] = []

    async def one(s: SharedScheduler, t: Ticket) -> None:
        await s.acquire(t)
        order.append(t.tenant_id)
        await asyncio.sleep(0.005)
        s.release(t)

    flood = [asyncio.create_task(one(a, ticket(n, tenant=1))) for n in range(10)]
    await until(lambda: len(a.members()[1]) == 10, what="the flood queued in Redis")
    victim = asyncio.create_task(one(b, ticket(99, tenant=2)))
    await until(lambda: len(b.members()[1]) == 1, what="tenant 2 queued in Redis")
    a.release(holder)
    await asyncio.gather(*flood, victim)
    assert order.index(2) <= 1, order  # FIFO across replicas would serve it 11th


async def test_a_more_urgent_lane_on_another_replica_gets_the_next_slot(replicas: list[SharedSlots]) -> None:
    a, b = (r.scheduler("engine-c", 1) for r in replicas)
    holder = ticket(0, lane=SLOW)
    await a.acquire(holder)
    order: list[str] = []

    async def one(s: SharedScheduler, t: Ticket) -> None:
        await s.acquire(t)
        order.append(t.lane.name)
        s.release(t)

    slow = [asyncio.create_task(one(a, ticket(n, lane=SLOW))) for n in range(5)]
    await until(lambda: len(a.members()[1]) == 5, what="the slow lane queued in Redis")
    fast = asyncio.create_task(one(b, ticket(9, tenant=2, lane=FAST)))
    await until(lambda: len(b.members()[1]) == 1, what="the fast one queued in Redis")
    a.release(holder)
    await asyncio.gather(*slow, fast)
    assert order[0] == "interactive", order


async def test_global_admission_refuses_a_tenant_over_its_share(replicas: list[SharedSlots]) -> None:
    lane = LanePolicy(name="interactive", max_concurrency=1, max_queue_depth=4, queue_timeout_s=10)
    a, b = (r.scheduler("engine-d", 1) for r in replicas)
    await a.acquire(ticket(0, lane=lane))
    queued = [asyncio.create_task(a.acquire(ticket(n, tenant=1, lane=lane))) for n in range(4)]
    await until(lambda: len(a.members()[1]) == 4, what="four queued in Redis")
    with pytest.raises(GatewayError) as info:  # tenant 1 alone filled the lane: full
        await b.acquire(ticket(5, tenant=1, lane=lane))
    assert info.value.code == "queue_full"
    for t in queued:
        t.cancel()
    await asyncio.gather(*queued, return_exceptions=True)


async def test_a_dead_replicas_slots_come_back_when_its_leases_expire(replicas: list[SharedSlots]) -> None:
    a, b = (r.scheduler("engine-e", 2) for r in replicas)
    for n in range(2):
        await a.acquire(ticket(n))  # held, never released: replica 0 is about to die
    for task in replicas[0]._tasks:  # it stops renewing (as if SIGKILLed)
        task.cancel()
    loop = asyncio.get_running_loop()
    started = loop.time()
    survivor = ticket(9)
    await b.acquire(survivor)
    assert loop.time() - started < 1.0 + 1.0  # within the lease TTL (1 s) and a heartbeat
    b.release(survivor)


async def test_a_second_notice_of_a_grant_does_not_give_the_running_slot_back(replicas: list[SharedSlots]) -> None:
    """Redis grants a waiter; pub/sub says so, and so does the heartbeat that ran just after.
    The second notice finds the request running: its lease must stay, or the engine gets one
    request more than its capacity (seen: 5 in flight on a 4-slot engine)."""
    a, b = (r.scheduler("engine-g", 1) for r in replicas)
    first, waiter = ticket(1), ticket(2)
    await a.acquire(first)
    waiting = asyncio.ensure_future(b.acquire(waiter))
    await until(lambda: len(b.members()[1]) == 1, what="the waiter queued in Redis")
    a.release(first)
    await asyncio.wait_for(waiting, 5)  # granted through pub/sub
    replicas[1]._route_grant("engine-g", b._member(waiter))  # ... and again, as a heartbeat reports it
    third = ticket(3)
    with pytest.raises(TimeoutError):  # not granted: the one slot is still the waiter's
        await asyncio.wait_for(a.acquire(third), 1.5)
    b.release(waiter)


async def test_a_waiter_cancelled_at_every_await_leaves_nothing_behind(replicas: list[SharedSlots]) -> None:
    """A client gone while its enqueue is in flight, while it waits, or just as the slot is
    granted: each time Redis holds no lease and no queue entry for it well before a lease
    would expire (1 s), and neither replica remembers it."""
    import redis.asyncio as aioredis

    a, b = (r.scheduler("engine-k", 1) for r in replicas)
    held, wait = replicas[0].keys("engine-k")[:2]
    client = aioredis.from_url(REDIS_URL)
    try:
        for k in range(40):
            holder, waiter = ticket(100 + k), ticket(k)
            await a.acquire(holder)
            task = asyncio.ensure_future(b.acquire(waiter))
            for i in range(k):
                await asyncio.sleep(0)
                if i == 20:  # from here on the grant races the cancel
                    a.release(holder)
            task.cancel()
            outcome = (await asyncio.gather(task, return_exceptions=True))[0]
            if k <= 20:
                a.release(holder)
            if outcome is None:  # granted before the cancel landed: the client releases it
                b.release(waiter)

            async def gone() -> bool:
                return not (await client.zcard(held) or await client.zcard(wait))

            await until(gone, within=0.5, what=f"k={k}: nothing left in Redis")
            assert not (b._waiting or b._held or b._queued or replicas[1].owners), f"k={k}"
    finally:
        await client.aclose()


async def test_a_release_made_while_a_heartbeat_is_on_its_way_is_not_undone_by_it(
    replicas: list[SharedSlots],
) -> None:
    """A heartbeat lists the leases it renews (and re-adds one that expired during a pause);
    a release made after it listed them must still end the lease, not be renewed after it."""
    import redis.asyncio as aioredis

    s = replicas[0].scheduler("engine-h", 2)
    held = replicas[0].keys("engine-h")[0]
    client = aioredis.from_url(REDIS_URL)
    try:
        for _ in range(5):
            t = ticket(1)
            await s.acquire(t)
            beat = asyncio.ensure_future(replicas[0].heartbeat())
            await asyncio.sleep(0)  # the heartbeat has listed the lease and is on its way ...
            s.release(t)  # ... and the leave follows it
            await beat

            async def ended() -> bool:
                return await client.zcard(held) == 0

            # well before the lease (1 s) would expire by itself
            await until(ended, within=0.5, what="the released lease gone (not renewed by the heartbeat)")
    finally:
        await client.aclose()


async def test_without_redis_each_replica_uses_its_share_and_comes_back() -> None:
    redis = PrivateRedis().start()
    slots = [SharedSlots(redis.url, "lw:", replica_id=f"r{i}", lease_ttl_s=1.0) for i in range(2)]
    try:
        for s in slots:
            await s.start()
        schedulers = [s.scheduler("engine-f", 5) for s in slots]
        for s in slots:
            await s.heartbeat()
        await asyncio.sleep(0.05)
        for s in slots:
            await s.heartbeat()  # both see two live replicas
        assert {s.replicas for s in slots} == {2}
        redis.kill()
        held: list[tuple[SharedScheduler, Any]] = []
        for s in schedulers:
            for n in range(5):
                t = ticket(n)
                try:
                    await asyncio.wait_for(s.acquire(t), 0.5)
                    held.append((s, t))
                except (TimeoutError, GatewayError):
                    pass
        shares = [sum(1 for s, _ in held if s is sch) for sch in schedulers]
        assert sorted(shares) == [2, 3] and sum(shares) == 5  # 5 / 2 replicas, never more in all
        for s, t in held:
            s.release(t)
        redis.start()
        for s in slots:
            await s.heartbeat()
        assert all(s.healthy for s in slots)
        t = ticket(7)
        await schedulers[0].acquire(t)  # through Redis again
        assert t.request_id in "".join(schedulers[0]._held)
        schedulers[0].release(t)
    finally:
        for s in slots:
            await s.close()
        redis.stop()


def test_fallback_shares_add_up_to_the_capacity() -> None:
    for capacity in range(1, 20):
        for replicas in range(1, 7):
            assert sum(fallback_share(capacity, replicas, r) for r in range(replicas)) == capacity
