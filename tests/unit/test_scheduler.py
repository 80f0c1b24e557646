"""The scheduler without HTTP or engines: who gets the next free slot, and when one waits too long."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from laneway.contracts.errors import GatewayError
from laneway.core import admission
from laneway.core.policy import LanePolicy
from laneway.core.scheduler import DeploymentScheduler, Ticket

FAST = LanePolicy(name="interactive", priority=0, max_concurrency=8, queue_timeout_s=30)
SLOW = LanePolicy(name="standard", priority=1, max_concurrency=8, queue_timeout_s=30)


class Harness:
    """Queue tickets behind one held slot, then release slots one at a time and record the order."""

    def __init__(self, capacity: int = 1, **kw: float) -> None:
        self.s = DeploymentScheduler(capacity, **kw)  # type: ignore[arg-type]
        self.order: list[Ticket] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def hold(self, lane: LanePolicy = FAST) -> Ticket:
        t = Ticket("holder", 0, 1.0, 1, lane)
        await self.s.acquire(t)
        return t

    def enqueue(self, tenant: int, lane: LanePolicy = FAST, cost: int = 100, weight: float = 1.0) -> Ticket:
        t = Ticket(f"{tenant}-{len(self.tasks)}", tenant, weight, cost, lane)

        async def go() -> None:
            await self.s.acquire(t)
            self.order.append(t)

        self.tasks.append(asyncio.create_task(go()))
        return t

    async def drain(self, holder: Ticket) -> list[Ticket]:
        await asyncio.sleep(0)  # let every waiter enqueue
        self.s.release(holder)
        while len(self.order) < len(self.tasks):
            await asyncio.sleep(0)
            for t in self.order:
                if t.granted is not None:
                    self.s.release(t)
        return self.order


async def test_a_flooding_tenant_does_not_starve_another() -> None:
    h = Harness()
    holder = await h.hold()
    for _ in range(50):
        h.enqueue(tenant=1)  # the noisy tenant floods first
    for _ in range(5):
        h.enqueue(tenant=2)
    order = [t.tenant_id for t in await h.drain(holder)]
    # Equal weights, equal costs: they alternate, so tenant 2 is done within the first 10.
    assert order[:10].count(2) == 5


async def test_weights_share_tokens_not_requests() -> None:
    h = Harness()
    holder = await h.hold()
    for _ in range(60):
        h.enqueue(tenant=1, weight=2.0)
        h.enqueue(tenant=2, weight=1.0)
    first = Counter(t.tenant_id for t in (await h.drain(holder))[:30])
    assert first[1] == 20 and first[2] == 10
    # Costs: a tenant sending 4x bigger requests gets a quarter of the requests.
    h = Harness()
    holder = await h.hold()
    for _ in range(40):
        h.enqueue(tenant=1, cost=400)
        h.enqueue(tenant=2, cost=100)
    first = Counter(t.tenant_id for t in (await h.drain(holder))[:25])
    assert first[2] == 4 * first[1]


async def test_strict_lane_priority_with_an_anti_starvation_share() -> None:
    h = Harness(starvation_share=0.25)
    holder = await h.hold()
    for _ in range(12):
        h.enqueue(tenant=1, lane=SLOW)
    for _ in range(12):
        h.enqueue(tenant=2, lane=FAST)
    lanes = [t.lane.name for t in (await h.drain(holder))[:16]]
    assert lanes.count("standard") == 4  # 1 in 4 while the fast lane has work
    assert lanes[:3] == ["interactive"] * 3


async def test_strict_priority_without_share() -> None:
    h = Harness(starvation_share=0)
    holder = await h.hold()
    for _ in range(3):
        h.enqueue(tenant=1, lane=SLOW)
    for _ in range(3):
        h.enqueue(tenant=2, lane=FAST)
    assert [t.lane.name for t in await h.drain(holder)] == ["interactive"] * 3 + ["standard"] * 3


async def test_lane_concurrency_cap_on_a_shared_deployment() -> None:
    s = DeploymentScheduler(4)
    narrow = LanePolicy(name="batch", priority=2, max_concurrency=1, queue_timeout_s=0.05)
    await s.acquire(Ticket("a", 1, 1.0, 1, narrow))
    with pytest.raises(GatewayError):  # the deployment has free slots, the lane does not
        await s.acquire(Ticket("b", 1, 1.0, 1, narrow))
    await s.acquire(Ticket("c", 1, 1.0, 1, FAST))
    assert s.running == {"batch": 1, "interactive": 1}


async def test_queue_timeout_is_a_503_with_the_lanes_retry_after() -> None:
    s = DeploymentScheduler(1)
    lane = LanePolicy(name="interactive", queue_timeout_s=0.05, retry_after_s=3)
    await s.acquire(Ticket("a", 1, 1.0, 1, lane))
    with pytest.raises(GatewayError) as info:
        await s.acquire(Ticket("b", 1, 1.0, 1, lane))
    assert info.value.status == 503 and info.value.code == "queue_timeout"
    assert info.value.headers["Retry-After"] == "3"
    assert s.depth("interactive") == 0


async def test_a_cancelled_waiter_is_removed_and_never_granted() -> None:
    s = DeploymentScheduler(1)
    holder = Ticket("a", 1, 1.0, 1, FAST)
    await s.acquire(holder)
    waiter = Ticket("b", 2, 1.0, 1, FAST)
    task = asyncio.create_task(s.acquire(waiter))
    await asyncio.sleep(0)
    assert s.depth("interactive") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert s.depth("interactive") == 0
    s.release(holder)
    assert waiter.granted is None and s.running_total == 0


async def test_admission_refuses_a_full_queue_and_a_hopeless_wait() -> None:
    s = DeploymentScheduler(1)
    lane = LanePolicy(name="interactive", max_queue_depth=2, queue_timeout_s=1.0, max_concurrency=1, retry_after_s=2)
    holder = Ticket("h", 1, 1.0, 1, lane)
    await s.acquire(holder)
    admission.admit(s, lane, 1)  # nothing measured yet: admitted
    waiters = [asyncio.create_task(s.acquire(Ticket(f"w{i}", 1, 1.0, 1, lane))) for i in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(GatewayError) as info:
        admission.admit(s, lane, 1)
    assert info.value.code == "queue_full" and info.value.headers["Retry-After"] == "2"
    # Teach it that a request holds the slot ~0.6 s: with 2 ahead, a newcomer would wait ~1.8 s > 1 s.
    s._service_s["interactive"] = 0.6
    lane_deep = LanePolicy(name="interactive", max_queue_depth=10, queue_timeout_s=1.0, max_concurrency=1)
    with pytest.raises(GatewayError) as info:
        admission.admit(s, lane_deep, 1)
    assert info.value.code == "predicted_wait_exceeded" and info.value.status == 503
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


async def test_service_time_is_learned_from_released_slots() -> None:
    now = [0.0]
    s = DeploymentScheduler(1, clock=lambda: now[0])
    t = Ticket("a", 1, 1.0, 1, FAST)
    await s.acquire(t)
    now[0] = 0.5
    s.release(t)
    assert s.predicted_wait(FAST) == 0.0  # the slot is free
    await s.acquire(Ticket("b", 1, 1.0, 1, FAST))
    waiters = [asyncio.create_task(s.acquire(Ticket(f"w{i}", 1, 1.0, 1, FAST))) for i in range(2)]
    await asyncio.sleep(0)
    assert s.predicted_wait(FAST) == pytest.approx(3 * 0.5)  # two ahead, then itself, one slot
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


async def test_huge_requests_are_scheduled_without_spinning_and_stay_fair() -> None:
    h = Harness(quantum=1)  # 4000-token requests against a 1-token quantum
    holder = await h.hold()
    for _ in range(4):
        h.enqueue(tenant=1, cost=4000)
        h.enqueue(tenant=2, cost=4000)
    order = [t.tenant_id for t in await h.drain(holder)]
    assert sorted(order[:2]) == [1, 2] and sorted(order[2:4]) == [1, 2]


async def test_a_flood_gets_the_refusals_and_a_newcomer_is_admitted() -> None:
    """Tenant 1 floods the lane to its depth limit; tenant 2 arrives with one request."""
    s = DeploymentScheduler(1)
    lane = LanePolicy(name="interactive", max_queue_depth=10, queue_timeout_s=1.0, max_concurrency=1)
    await s.acquire(Ticket("h", 1, 1.0, 1, lane))
    flood = []
    for i in range(10):
        admission.admit(s, lane, 1)  # alone, the flood may use the whole lane
        flood.append(asyncio.create_task(s.acquire(Ticket(f"f{i}", 1, 1.0, 1, lane))))
    await asyncio.sleep(0)
    s._service_s["interactive"] = 0.3  # a request holds the slot 0.3 s: 10 ahead would be 3 s
    with pytest.raises(GatewayError) as info:
        admission.admit(s, lane, 1)
    assert info.value.code == "queue_full"
    # The newcomer runs less than its share (the flood runs all of its): dispatch serves it
    # before the flood's queued turns, so none of them is ahead of it.
    assert s.ahead_of(lane, 2) == 0 and s.predicted_wait(lane, 2) < 1.0 < s.predicted_wait(lane, 1)
    admission.admit(s, lane, 2)  # the lane is full: the flood's newest request makes way
    await asyncio.sleep(0)
    evicted = [t for t in flood if t.done()]
    assert len(evicted) == 1 and isinstance(evicted[0].exception(), GatewayError)
    assert evicted[0].exception().code == "tenant_queue_share"  # type: ignore[union-attr]
    newcomer = asyncio.create_task(s.acquire(Ticket("b", 2, 1.0, 1, lane)))
    await asyncio.sleep(0)
    with pytest.raises(GatewayError) as info:  # now contended: the flood is over its share of 5
        admission.admit(s, lane, 1)
    assert info.value.code == "tenant_queue_share" and info.value.status == 503
    for t in [*flood, newcomer]:
        t.cancel()
    await asyncio.gather(*flood, newcomer, return_exceptions=True)


async def test_shares_follow_weights() -> None:
    s = DeploymentScheduler(1)
    lane = LanePolicy(name="interactive", max_queue_depth=9, queue_timeout_s=30, max_concurrency=1)
    await s.acquire(Ticket("h", 1, 1.0, 1, lane))
    tasks = [asyncio.create_task(s.acquire(Ticket("b0", 2, 2.0, 1, lane)))]
    admitted = 0
    for i in range(9):
        try:
            admission.admit(s, lane, 1, 1.0)
        except GatewayError:
            break
        tasks.append(asyncio.create_task(s.acquire(Ticket(f"f{i}", 1, 1.0, 1, lane))))
        admitted += 1
        await asyncio.sleep(0)
    assert admitted == 3  # weight 1 against weight 2: a third of the 9 places
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_slot_is_kept_for_a_newcomer_while_several_tenants_are_active() -> None:
    lane = LanePolicy(name="interactive", max_concurrency=8, max_queue_depth=100, queue_timeout_s=30)
    s = DeploymentScheduler(4)
    alone = [asyncio.create_task(s.acquire(Ticket(f"a{i}", 1, 1.0, 1, lane))) for i in range(6)]
    await asyncio.sleep(0)
    assert s.running_total == 4  # a lone tenant may use every slot
    for t in alone:
        t.cancel()
    await asyncio.gather(*alone, return_exceptions=True)
    for ticket in s.running_tickets():
        s.release(ticket)
    # Tenant 2 was seen a moment ago: tenant 1's flood leaves the last slot free ...
    await s.acquire(b := Ticket("b0", 2, 1.0, 1, lane))
    s.release(b)
    flood = [asyncio.create_task(s.acquire(Ticket(f"f{i}", 1, 1.0, 1, lane))) for i in range(8)]
    await asyncio.sleep(0)
    assert s.running_total == 3 and s.depth("interactive") == 5
    # ... so tenant 2's next request starts at once, without waiting for a flood stream to end.
    await asyncio.wait_for(s.acquire(Ticket("b1", 2, 1.0, 1, lane)), timeout=0.1)
    assert s.running_total == 4
    for t in flood:
        t.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
