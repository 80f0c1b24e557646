"""Background lanes (batch work): they take an engine slot only when no foreground request could
start, keep `background_reserve` slots free while foreground traffic is recent, fill the engine
when none is, never ride the starvation share, and are never counted ahead of a foreground
request at admission; on one deployment's scheduler and across an alias's replicas alike."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from laneway.admin.forms import policy_input
from laneway.admin.policies import LaneIn, TaskIn
from laneway.bootstrap import import_policies
from laneway.core import admission
from laneway.core.pipeline import Gateway, GenerationIntent
from laneway.core.pipeline.lease import Lease
from laneway.core.policy import LanePolicy, PolicySnapshot, PolicyStore
from laneway.core.scheduler import DeploymentScheduler, Ticket
from laneway.db import migrate
from laneway.db.repositories import PolicyRepository
from laneway.db.session import make_engine, make_sessionmaker
from laneway.engines.registry import EngineRegistry
from laneway.types import DeploymentSpec, TenantSnapshot
from support.specs import sim_replica

INTERACTIVE = LanePolicy("interactive", priority=0, max_concurrency=8, queue_timeout_s=30)
STANDARD = LanePolicy("standard", priority=1, max_concurrency=8, queue_timeout_s=30)
BATCH = LanePolicy(
    "batch", priority=2, max_concurrency=64, queue_timeout_s=30, match_tasks=frozenset({"batch"}), background=True
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Bench:
    """A scheduler on a hand-wound clock, its waiters as tasks, released one by one."""

    def __init__(self, capacity: int, **kw: float) -> None:
        self.clock = Clock()
        self.s = DeploymentScheduler(capacity, clock=self.clock, **kw)  # type: ignore[arg-type]
        self.tasks: list[asyncio.Task[None]] = []
        self.granted: list[Ticket] = []  # in the order the slots were given

    async def enqueue(self, lane: LanePolicy, n: int = 1, tenant: int = 1) -> list[Ticket]:
        tickets = [Ticket(f"{lane.name}-{len(self.tasks) + i}", tenant, 1.0, 100, lane) for i in range(n)]
        for t in tickets:

            async def go(t: Ticket = t) -> None:
                await self.s.acquire(t)
                self.granted.append(t)

            self.tasks.append(asyncio.create_task(go()))
        await asyncio.sleep(0)  # every waiter queued (and granted, where a slot was free)
        await asyncio.sleep(0)
        return tickets

    def running(self) -> list[Ticket]:
        return [t for t in self.granted if t.granted is not None]

    async def release(self, t: Ticket) -> None:
        self.s.release(t)
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_background_fills_every_slot_when_no_foreground_was_seen() -> None:
    b = Bench(4)
    await b.enqueue(BATCH, 6)
    assert len(b.running()) == 4 and b.s.depth("batch") == 2
    await b.close()


async def test_a_foreground_request_takes_the_next_slot_background_hands_back() -> None:
    # starvation_share 1: every pass over a waiting lower lane would lift it, were it counted.
    b = Bench(4, starvation_share=1.0)
    held = await b.enqueue(BATCH, 4)
    await b.enqueue(BATCH, 10)
    b.clock.now += 60  # long after: the foreground arrives to an engine full of batch work
    fg = [*await b.enqueue(INTERACTIVE, 2, tenant=2), *await b.enqueue(STANDARD, 2, tenant=2)]
    assert not any(t.granted for t in fg)
    for i, t in enumerate(held):  # each slot a batch item hands back goes to the foreground
        await b.release(t)
        assert sum(1 for x in fg if x.granted is not None) == i + 1
        assert b.s.running.get("batch") == 3 - i
    # The engine now runs foreground only; batch waits while the slot that frees is the reserve.
    await b.release(fg[0])
    assert b.s.running == {"batch": 0, "interactive": 1, "standard": 2} and b.s.depth("batch") == 10
    await b.release(fg[1])
    assert b.s.running["batch"] == 1 and b.s.free_slots() == 1  # one slot stays free for a newcomer
    await b.close()


async def test_recent_foreground_traffic_keeps_one_slot_free_until_it_goes_quiet() -> None:
    b = Bench(4)
    [fg] = await b.enqueue(INTERACTIVE, tenant=2)
    await b.release(fg)  # it ran and ended just now
    batch = await b.enqueue(BATCH, 6)
    assert len(b.running()) == 3 and b.s.free_slots() == 1
    late = await b.enqueue(INTERACTIVE, tenant=2)
    assert late[0].granted is not None  # the reserve: no wait for a batch item to end
    await b.release(late[0])
    b.clock.now += 9.9  # still within the window
    await b.release(batch[0])
    assert len(b.running()) == 3
    b.clock.now += 0.2  # quiet for the whole window: the batch may fill the engine
    await b.release(batch[1])
    assert len(b.running()) == 4 and b.s.free_slots() == 0
    await b.close()


async def test_a_running_foreground_request_keeps_its_traffic_recent() -> None:
    b = Bench(4)
    await b.enqueue(INTERACTIVE, tenant=2)
    b.clock.now += 600  # a long stream, started long ago and still running
    await b.enqueue(BATCH, 5)
    assert b.s.running == {"interactive": 1, "batch": 2}
    await b.close()


async def test_the_starvation_share_never_lifts_a_background_lane_nor_counts_passes_over_it() -> None:
    b = Bench(1, starvation_share=0.5)  # every 2nd pass over a waiting lower foreground lane lifts it
    [holder] = await b.enqueue(INTERACTIVE)
    b.clock.now += 60
    await b.enqueue(BATCH, 3)  # the oldest heads of all
    b.clock.now += 60
    await b.enqueue(INTERACTIVE, 3)
    await b.release(holder)  # passes over batch only: not counted
    [s1] = await b.enqueue(STANDARD)
    while len(b.granted) < 8:
        await b.release(b.running()[0])
    lanes = [t.lane.name for t in b.granted[1:]]
    # standard is lifted on the 2nd pass over it, not the 1st (a pass over batch counted would do that)
    assert lanes == ["interactive", "interactive", "standard", "interactive", "batch", "batch", "batch"]
    assert b.granted[3] is s1
    await b.close()


async def test_background_reserve_is_zero_on_a_one_slot_engine() -> None:
    b = Bench(1)
    [fg] = await b.enqueue(INTERACTIVE, tenant=2)
    await b.release(fg)
    [item] = await b.enqueue(BATCH)
    assert item.granted is not None  # a reserve of 1 would keep it out of its only slot for good
    await b.close()


async def test_a_reserve_of_zero_lets_background_take_every_slot_despite_recent_foreground() -> None:
    b = Bench(4, background_reserve=0)
    [fg] = await b.enqueue(INTERACTIVE, tenant=2)
    await b.release(fg)
    await b.enqueue(BATCH, 5)
    assert len(b.running()) == 4
    await b.close()


async def test_slots_a_foreground_lane_cannot_use_for_its_cap_go_to_background() -> None:
    capped = LanePolicy("interactive", priority=0, max_concurrency=1, queue_timeout_s=30)
    b = Bench(4)
    await b.enqueue(capped, 3, tenant=2)  # one runs; its lane cap keeps the others out
    await b.enqueue(BATCH, 5)
    assert b.s.running == {"interactive": 1, "batch": 2}  # the idle slots, less the reserve
    await b.close()


async def test_admission_never_counts_queued_background_work_ahead_of_a_foreground_request() -> None:
    urgent_batch = LanePolicy("batch", priority=-1, max_concurrency=64, queue_timeout_s=300, background=True)
    fast = LanePolicy("interactive", priority=0, max_concurrency=8, queue_timeout_s=2.0)
    b = Bench(1)
    [fg] = await b.enqueue(fast, tenant=2)
    b.clock.now += 1.0
    await b.release(fg)  # the lane's service time: 1 s
    b.clock.now += 60
    [holder] = await b.enqueue(fast, tenant=2)  # just started: its slot frees in a service time
    await b.enqueue(urgent_batch, 50)
    assert b.s.ahead_of(fast, 3) == 0 and b.s.predicted_wait(fast, 3) == pytest.approx(1.0)
    admission.admit(b.s, fast, 3)  # 50 batch items ahead (at 1 s each) would refuse it
    [queued] = await b.enqueue(fast, tenant=3)
    assert b.s.ahead_of(urgent_batch) == 51  # every foreground request is ahead of batch work
    await b.release(holder)
    assert queued.granted is not None
    await b.close()


# ---- across an alias's replicas (late binding) ----
ACME = TenantSnapshot(id=1, name="acme", api_key_id=11)
BETA = TenantSnapshot(id=2, name="beta", api_key_id=22)


def spec(i: int) -> DeploymentSpec:
    return sim_replica(i, decode_ms_base=2.0, prefill_ms_per_token=0.0, max_concurrency=2)


@pytest.fixture
async def two_replicas() -> AsyncIterator[EngineRegistry]:
    registry = EngineRegistry()
    await registry.load([spec(0), spec(1)])
    yield registry
    await registry.close()


def chat(prompt: str, task: str | None = None) -> GenerationIntent:
    return GenerationIntent(endpoint="completions", alias="m", stream=False, prompt=prompt, max_tokens=2, task=task)


class AliasBench:
    def __init__(self, registry: EngineRegistry) -> None:
        self.registry = registry
        lanes = (LanePolicy("standard", max_concurrency=8, queue_timeout_s=30, match_tasks=frozenset({"chat"})), BATCH)
        self.gw = Gateway(registry, PolicyStore(None, PolicySnapshot(lanes=lanes)))
        self.waiting: list[tuple[Lease, asyncio.Future[None]]] = []

    async def send(self, tenant: TenantSnapshot, prompt: str, task: str) -> tuple[Lease, asyncio.Future[None]]:
        lease = self.gw.lease(await self.gw.prepare(tenant, chat(prompt, task)))
        assert lease.late  # waits in the alias's queue
        entry = (lease, asyncio.ensure_future(self.gw.acquire(lease)))
        self.waiting.append(entry)
        await asyncio.sleep(0.01)
        return entry

    def outstanding(self) -> list[int]:
        return [d.outstanding for d in self.registry.deployments()]

    async def close(self) -> None:
        for lease, task in self.waiting:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            lease.release()
        assert self.outstanding() == [0, 0]


async def test_across_replicas_background_fills_them_then_yields_each_freed_slot(two_replicas: EngineRegistry) -> None:
    a = AliasBench(two_replicas)
    batch = [await a.send(ACME, f"item {i}", "batch") for i in range(6)]
    assert [task.done() for _, task in batch] == [True] * 4 + [False] * 2 and a.outstanding() == [2, 2]
    fg = await a.send(BETA, "hello", "chat")
    assert not fg[1].done()
    freed = batch[0][0]
    freed.release()
    await asyncio.wait_for(fg[1], 1)  # the slot batch handed back, not the next batch item's
    assert fg[0].call.deployment is freed.call.deployment
    assert not batch[4][1].done() and not batch[5][1].done()
    batch[1][0].release()  # foreground is recent: this slot stays free for the next newcomer
    await asyncio.sleep(0.01)
    assert not batch[4][1].done() and sum(a.outstanding()) == 3
    late = await a.send(BETA, "another", "chat")
    assert late[1].done()
    await a.close()


async def test_across_replicas_recent_foreground_keeps_one_slot_free(two_replicas: EngineRegistry) -> None:
    a = AliasBench(two_replicas)
    fg, task = await a.send(BETA, "hello", "chat")
    assert task.done()
    fg.release()
    batch = [await a.send(ACME, f"item {i}", "batch") for i in range(5)]
    assert sum(task.done() for _, task in batch) == 3 and sum(a.outstanding()) == 3
    await a.close()


async def test_background_counts_the_free_slots_of_the_replicas_not_the_alias_grants(
    two_replicas: EngineRegistry,
) -> None:
    a = AliasBench(two_replicas)
    batch = [await a.send(ACME, f"item {i}", "batch") for i in range(5)]
    draining = batch[0][0].call.deployment
    two_replicas.set_draining(draining.spec.name, True)  # its two items run on; it takes no new one
    other = next(lease for lease, _ in batch if lease.call.deployment is not draining)
    other.release()  # one slot free on the other replica, though the alias granted 3 of its 2 usable slots
    await asyncio.wait_for(batch[4][1], 1)
    assert batch[4][0].call.deployment is other.call.deployment
    await a.close()


async def test_background_is_never_queued_on_a_full_replica_its_prefix_draws_it_to(
    two_replicas: EngineRegistry,
) -> None:
    a = AliasBench(two_replicas)
    system = "You are a careful assistant for the billing team. " * 40  # several prefix blocks
    warm, _ = await a.send(ACME, system + "warm", "batch")
    home = warm.call.deployment
    warm.release()
    # The hot prefix would put the 4th item on its full replica while it is one slot busier
    # than the other: it would wait there and take the slot that frees ahead of the foreground.
    batch = [await a.send(ACME, system + f"item {i}", "batch") for i in range(5)]
    assert [lease.call.deployment is home for lease, _ in batch[:2]] == [True, True]
    assert a.outstanding() == [2, 2] and not batch[4][1].done()
    fg = await a.send(BETA, "hello", "chat")
    freed = next(lease for lease, _ in batch if lease.call.deployment is home)
    freed.release()
    await asyncio.wait_for(fg[1], 1)
    assert fg[0].call.deployment is home and not batch[4][1].done()
    await a.close()


async def test_the_replicas_behind_an_alias_hold_no_reserve_of_their_own(two_replicas: EngineRegistry) -> None:
    a = AliasBench(two_replicas)
    _, running = await a.send(BETA, "a long answer", "chat")
    assert running.done()  # and it runs on
    batch = [await a.send(ACME, f"item {i}", "batch") for i in range(4)]
    # The alias keeps one of its 4 slots free; a replica's own reserve would keep another.
    assert sum(task.done() for _, task in batch) == 2 and sum(a.outstanding()) == 3
    assert all(a.gw.scheduler(d).background_reserve == 0 for d in two_replicas.deployments())
    assert a.gw.waiting.dispatch.alias_scheduler("m").background_reserve == 1
    await a.close()


# ---- policy rows ----
async def test_a_lanes_background_flag_goes_from_its_row_to_the_policy(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'policies.db'}")
    try:
        await migrate.upgrade(engine)
        sessions = make_sessionmaker(engine)
        await import_policies(sessions)  # the packaged lanes.yaml
        store = PolicyStore(sessions)
        seeded = await store.reload()
        assert {lane.name: lane.background for lane in seeded.lanes} == {
            "batch": True,
            "interactive": False,
            "standard": False,
        }
        assert seeded.lane("batch").max_concurrency is None  # type: ignore[union-attr]  # no cap: the learned limit
        async with sessions() as s, s.begin():
            await PolicyRepository(s).upsert_lane("standard", background=True)
            await PolicyRepository(s).upsert_lane("fresh")  # a new row: foreground by default
        edited = await store.reload()
        assert edited.lane("standard").background and not edited.lane("fresh").background  # type: ignore[union-attr]
    finally:
        await engine.dispose()


def test_the_lane_forms_background_box_sets_and_clears_the_flag() -> None:
    edit = {"csrf_token": "t", "priority": "2"}
    data, sent = policy_input({**edit, "background": "true"}, LaneIn)
    assert data.background is True and "background" in sent
    data, sent = policy_input(edit, LaneIn)  # unticked: the box sends nothing, the lane turns foreground
    assert data.background is False and "background" in sent
    data, sent = policy_input({**edit, "name": "new"}, LaneIn)  # the add form: the column's default
    assert "background" not in sent
    data, sent = policy_input({"csrf_token": "t", "max_tokens": "9"}, TaskIn)  # a task has no such box
    assert "background" not in sent


async def test_a_foreground_request_with_no_slot_preempts_the_youngest_background_one() -> None:
    """Batch work holding every slot: each foreground arrival takes back the slot of the batch
    line that started last (the least work lost), at once, not after a line ends."""
    b = Bench(4)
    held = await b.enqueue(BATCH, 4)
    preempted: list[Ticket] = []
    for t in held:
        b.clock.now += 1.0  # started one after another
        t.granted = b.clock.now

        def give_back(t: Ticket = t) -> None:
            preempted.append(t)
            b.s.release(t)  # what an interrupted request's lease does

        t.preempt = give_back
    b.clock.now += 60
    [first] = await b.enqueue(INTERACTIVE, tenant=2)
    assert preempted == [held[3]] and first.granted is not None
    lane_capped = LanePolicy("capped", priority=0, max_concurrency=1, queue_timeout_s=30)
    await b.enqueue(lane_capped, tenant=2)
    [waits] = await b.enqueue(lane_capped, tenant=2)  # its own lane's cap holds it, not batch work
    assert preempted == [held[3], held[2]] and waits.granted is None
    await b.enqueue(STANDARD, 2, tenant=3)
    assert preempted == [held[3], held[2], held[1], held[0]]
    assert b.s.running.get("batch") == 0
    await b.close()
