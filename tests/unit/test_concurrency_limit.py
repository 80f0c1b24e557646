"""A replica's running limit learned against the lanes' TPOT targets (core/latency/limit.py),
and the fairness rule that bends a lane's cap for a tenant under its share (core/scheduler.py).

The limit is driven through the replica's latency model the way the gateway drives it: rounds
of as many requests as the limit allows, dispatched together, each decoding at the step time
the replica's curve gives for the batch it ran in, on an exact clock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from laneway.core.latency import ConcurrencyLimit, ReplicaLatencyModel
from laneway.core.pipeline import Gateway, GenerationIntent
from laneway.core.policy import LanePolicy, PolicySnapshot, PolicyStore
from laneway.core.scheduler import DeploymentScheduler, Ticket
from laneway.engines.registry import EngineRegistry
from laneway.types import DeploymentSpec, TenantSnapshot
from support.specs import sim_replica

TARGET_S = 0.110  # the lane's TPOT target
TOKENS = 20


def run_rounds(
    model: ReplicaLatencyModel, step_s: Callable[[int], float], rounds: int, target_s: float | None = TARGET_S
) -> list[int]:
    """Each round: as many requests as the limit allows dispatched at once, each decoding
    TOKENS tokens at step_s(batch); returns the limit after each round."""
    assert model.limit is not None
    now, seen = CLOCK[model], []
    for _ in range(rounds):
        batch = model.limit.value
        attempts = [model.begin(now, prompt_tokens=50, tpot_target_s=target_s) for _ in range(batch)]
        now += 0.010
        for a in attempts:
            a.first_token(now)
        now += (TOKENS - 1) * step_s(batch)
        for a in attempts:
            a.end(50, TOKENS, finished=True, now=now)
        now += 0.001
        seen.append(model.limit.value)
    CLOCK[model] = now
    return seen


CLOCK: dict[ReplicaLatencyModel, float] = {}  # each model's time, rounds after rounds


def limited(hard: int, initial: int | None = None) -> ReplicaLatencyModel:
    model = ReplicaLatencyModel()
    model.limit = ConcurrencyLimit(hard, initial)
    CLOCK[model] = 0.0
    return model


def test_the_limit_grows_to_the_engines_own_on_an_engine_that_stays_fast() -> None:
    model = limited(hard=16, initial=2)
    seen = run_rounds(model, lambda n: 0.010 + 0.0001 * n, rounds=30)  # flat: 11.6 ms at 16
    assert seen[0] == 3 and seen[5] > seen[0]  # one more per round while the target holds
    assert seen[-1] == 16 and max(seen) == 16  # and never past the engine's limit


def test_the_limit_backs_off_where_the_step_time_breaks_the_target_and_holds_there() -> None:
    model = limited(hard=16)  # starts at the engine's limit, as laneway ran before
    seen = run_rounds(model, lambda n: 0.010 + 0.030 * n, rounds=40)  # 100 ms at 3, 130 ms at 4
    assert seen[0] < 16  # the first round's streams decoded at 490 ms a token: backed off
    assert seen[-10:] == [3] * 10  # the most sequences that hold 110 ms a token, and it stays


def test_the_limit_comes_back_up_when_the_replica_gets_faster() -> None:
    model = limited(hard=16)
    run_rounds(model, lambda n: 0.010 + 0.030 * n, rounds=30)
    assert model.limit is not None and model.limit.value == 3
    seen = run_rounds(model, lambda n: 0.010 + 0.001 * n, rounds=60)  # a 30x flatter replica
    assert seen[-1] == 16


def test_one_stream_stretched_by_a_slow_reader_does_not_back_it_off() -> None:
    model = limited(hard=8)
    run_rounds(model, lambda n: 0.010 + 0.001 * n, rounds=10)  # a fast replica, its curve learned
    now = CLOCK[model] + 1.0
    slow = model.begin(now, prompt_tokens=50, tpot_target_s=TARGET_S)
    slow.first_token(now + 0.01)
    slow.end(50, TOKENS, finished=True, now=now + 0.01 + TOKENS * 0.5)  # 500 ms a token: its client's pace
    assert model.limit is not None and model.limit.value == 8


def test_requests_without_a_target_never_back_it_off() -> None:
    model = limited(hard=8)
    seen = run_rounds(model, lambda n: 0.010 + 0.030 * n, rounds=10, target_s=None)
    assert seen == [8] * 10


def test_only_requests_dispatched_after_a_change_change_it_again() -> None:
    limit = ConcurrencyLimit(16)
    for _ in range(8):  # eight slow requests of the same round: one back-off, not eight
        limit.observe(dispatched=0.0, now=1.0, gap_s=0.5, target_s=0.1, batch=16, predict_step=lambda n: None)
    assert limit.value == 12
    limit.observe(dispatched=1.5, now=2.0, gap_s=0.5, target_s=0.1, batch=12, predict_step=lambda n: None)
    assert limit.value == 9


def test_a_changed_engine_limit_moves_it_at_once_unless_it_was_learned_lower() -> None:
    limit = ConcurrencyLimit(16)
    told: list[int] = []
    limit.changed = told.append
    limit.bound(6)
    limit.bound(12)  # it was at the engine's limit: it follows it up
    assert limit.value == 12 and told == [6, 12]
    learned = ConcurrencyLimit(16, initial=5)
    learned.bound(32)
    assert learned.value == 5


# ---- the fairness rule: a lane's cap bends for a tenant under its share ----

INTERACTIVE = LanePolicy("interactive", priority=0, max_concurrency=4, queue_timeout_s=30)
F, B = 1, 2


async def test_a_tenant_under_its_share_is_dispatched_while_the_hog_holds_the_lanes_cap() -> None:
    """The noisy neighbour in miniature: F keeps 100 streams in the interactive lane (cap 4) of
    an 8-sequence deployment; B's one stream is dispatched while all four of F's still run,
    and F gets no more than its cap however many it has queued."""
    s = DeploymentScheduler(8, headroom=0)
    tasks: list[asyncio.Task[None]] = []

    def enqueue(tenant: int, n: int) -> list[Ticket]:
        tickets = [Ticket(f"{tenant}-{i}", tenant, 1.0, 100, INTERACTIVE) for i in range(n)]
        tasks.extend(asyncio.create_task(s.acquire(t)) for t in tickets)
        return tickets

    try:
        hog = enqueue(F, 100)
        await asyncio.sleep(0)
        assert [t for t in hog if t.granted is not None] == hog[:4] and s.depth("interactive") == 96
        (b,) = enqueue(B, 1)
        await asyncio.sleep(0)
        assert b.granted is not None  # bound while F's four streams are all still running
        assert all(t.granted is not None for t in hog[:4]) and s.running == {"interactive": 5}
        s.release(hog[0])  # one of F's ends: F takes its place, no more
        await asyncio.sleep(0)
        assert s.running == {"interactive": 5} and sum(t.granted is not None for t in hog) == 4
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_tenant_that_fills_the_cap_itself_is_not_bent_for() -> None:
    s = DeploymentScheduler(8, headroom=0)
    tickets = [Ticket(f"b-{i}", B, 1.0, 100, INTERACTIVE) for i in range(6)]
    tasks = [asyncio.create_task(s.acquire(t)) for t in tickets]
    other = LanePolicy("standard", priority=1, max_concurrency=4, queue_timeout_s=30)
    f = Ticket("f", F, 1.0, 100, other)
    tasks.append(asyncio.create_task(s.acquire(f)))
    try:
        await asyncio.sleep(0)
        # B is under its share of 8 with F running one, but B's own streams fill its lane's cap
        assert s.running == {"interactive": 4, "standard": 1}
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_behind_an_alias_a_tenant_under_its_share_is_bound_while_the_hog_holds_the_lanes_caps() -> None:
    """Two replicas of 4 sequences, a lane capped at 1 per replica: the hog runs 2 and queues
    the rest; another tenant's request is bound at once (6 sequences are free), not after one
    of the hog's ends."""

    def spec(i: int) -> DeploymentSpec:
        return sim_replica(i, decode_ms_base=2.0, prefill_ms_per_token=0.0, max_concurrency=4)

    def chat(prompt: str) -> GenerationIntent:
        return GenerationIntent(endpoint="completions", alias="m", stream=False, prompt=prompt, max_tokens=2)

    hog, newcomer = TenantSnapshot(id=1, name="hog", api_key_id=11), TenantSnapshot(id=2, name="b", api_key_id=22)
    lane = LanePolicy("standard", max_queue_depth=100, max_concurrency=1, queue_timeout_s=30)
    registry = EngineRegistry()
    await registry.load([spec(0), spec(1)])
    gw = Gateway(registry, PolicyStore(None, PolicySnapshot(lanes=(lane,))))  # type: ignore[arg-type]
    waiting = []
    try:
        for i in range(10):
            lease = gw.lease(await gw.prepare(hog, chat(f"flood {i}")))
            waiting.append((lease, asyncio.ensure_future(gw.acquire(lease))))
        await asyncio.sleep(0.01)
        assert sum(task.done() for _, task in waiting) == 2  # its lane's cap on each replica
        lease = gw.lease(await gw.prepare(newcomer, chat("hello")))
        waiting.append((lease, asyncio.ensure_future(gw.acquire(lease))))
        await asyncio.wait_for(waiting[-1][1], 1)  # bound while the hog's two still run
        assert sum(task.done() for _, task in waiting[:10]) == 2
    finally:
        for lease, task in waiting:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            lease.release()
        await registry.close()
