"""BatchStore (issue 25) on SQLite and PostgreSQL: files per tenant, a batch's items leased to
replicas and answered once, cancel and expiry, finalizing by exactly one replica. Time moves
by an injected clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from laneway.db.batch_store import BatchStore
from laneway.db.repositories import TenantRepository
from laneway.db.session import make_sessionmaker
from sqlalchemy.ext.asyncio import AsyncEngine

KEY = "k" * 64
START = datetime(2027, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Env:
    store: BatchStore
    clock: Clock
    acme: int
    other: int

    async def batch(self, n: int, *, window_s: float = 86400, tenant: int | None = None) -> str:
        items = [(f"req-{i}", json.dumps({"model": "m", "messages": [], "n": i})) for i in range(n)]
        created = await self.store.create_batch(
            self.acme if tenant is None else tenant,
            KEY,
            "/v1/chat/completions",
            "file-input",
            "24h",
            {"job": "nightly"},
            self.clock.now + timedelta(seconds=window_s),
            items,
        )
        return created.id

    async def state_counts(self, batch_id: str) -> tuple[int, int, int]:
        info = await self.store.get_batch(None, batch_id)
        assert info is not None
        return info.total, info.completed, info.failed


@pytest.fixture
async def env(db_engine: AsyncEngine) -> AsyncIterator[Env]:
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        acme = (await TenantRepository(s).create("acme")).id
        other = (await TenantRepository(s).create("other")).id
    clock = Clock()
    yield Env(BatchStore(sessions, clock=clock), clock, acme, other)


async def test_files_are_the_tenants_own(env: Env) -> None:
    store, clock = env.store, env.clock
    ids = []
    for i in range(3):
        ids.append((await store.create_file(env.acme, "batch", f"in{i}.jsonl", b"x" * (i + 1))).id)
        clock.advance(1)
    await store.create_file(env.other, "batch", "theirs.jsonl", b"secret")
    first = await store.get_file(env.acme, ids[0])
    assert first is not None and first.id.startswith("file-") and len(first.id) == 29
    assert (first.tenant_id, first.purpose, first.filename, first.bytes, first.created_at) == (
        env.acme,
        "batch",
        "in0.jsonl",
        1,
        START,
    )
    assert await store.file_content(env.acme, ids[2]) == b"xxx"

    # Another tenant sees nothing of acme's: not its metadata, content, listing, nor deletes it.
    assert await store.get_file(env.other, ids[0]) is None
    assert await store.file_content(env.other, ids[0]) is None
    assert await store.delete_file(env.other, ids[0]) is False
    assert [f.filename for f in await store.list_files(env.other)] == ["theirs.jsonl"]

    # Pages: newest first by default, `after` a file id; oldest first with order="asc".
    assert [f.id for f in await store.list_files(env.acme)] == ids[::-1]
    assert [f.id for f in await store.list_files(env.acme, limit=2)] == [ids[2], ids[1]]
    assert [f.id for f in await store.list_files(env.acme, after=ids[1])] == [ids[0]]
    assert [f.id for f in await store.list_files(env.acme, order="asc", after=ids[0])] == ids[1:]
    assert await store.list_files(env.acme, purpose="batch_output") == []
    assert await store.list_files(env.acme, after="file-unknown") == []

    assert await store.delete_file(env.acme, ids[0]) is True
    assert await store.delete_file(env.acme, ids[0]) is False
    assert await store.get_file(env.acme, ids[0]) is None
    assert [f.id for f in await store.list_files(env.acme)] == [ids[2], ids[1]]


async def test_a_batch_runs_to_completion_with_its_counts_and_files(env: Env) -> None:
    store, clock = env.store, env.clock
    batch_id = await env.batch(5)
    info = await store.get_batch(env.acme, batch_id)
    assert info is not None and info.id.startswith("batch_") and info.status == "in_progress"
    assert info.created_at == info.in_progress_at == START and info.expires_at == START + timedelta(days=1)
    assert info.metadata == {"job": "nightly"} and (info.total, info.completed, info.failed) == (5, 0, 0)
    assert await store.get_batch(env.other, batch_id) is None
    assert await store.active_batches() == [(batch_id, env.acme, "")]
    assert await store.to_finalize("r1", 60) == []  # lines left to run

    claimed = await store.claim(batch_id, "r1", 10, 30)
    assert [c.custom_id for c in claimed] == [f"req-{i}" for i in range(5)]
    assert {(c.batch_id, c.tenant_id, c.key_sha256, c.endpoint, c.attempts) for c in claimed} == {
        (batch_id, env.acme, KEY, "/v1/chat/completions", 1)
    }
    assert json.loads(claimed[3].body)["n"] == 3
    assert await store.claim(batch_id, "r2", 10, 30) == []
    assert await store.active_batches() == []
    assert (await store.counts_by_state())["running"] == 5

    for c in claimed:
        state = "failed" if c.custom_id == "req-1" else "succeeded"
        assert await store.finish(c.id, "r1", state, json.dumps({"custom_id": c.custom_id}))
    assert await env.state_counts(batch_id) == (5, 4, 1)
    assert await store.counts_by_state() == {
        "pending": 0,
        "running": 0,
        "succeeded": 4,
        "failed": 1,
        "expired": 0,
        "cancelled": 0,
    }
    lines = await store.output_lines(batch_id)
    assert [(o.line, o.custom_id, o.state) for o in lines][:2] == [(0, "req-0", "succeeded"), (1, "req-1", "failed")]
    assert json.loads(lines[4].result or "") == {"custom_id": "req-4"}

    clock.advance(5)
    assert await store.to_finalize("r1", 60) == [batch_id]
    finalizing = await store.get_batch(None, batch_id)
    assert finalizing is not None and finalizing.status == "finalizing" and finalizing.finalizing_at == clock.now
    assert await store.to_finalize("r2", 60) == []  # it is r1's

    done = await store.complete(batch_id, "r1", "completed", b"out\n", b"err\n")
    assert done is not None and done.status == "completed" and done.completed_at == clock.now
    assert (done.total, done.completed, done.failed) == (5, 4, 1)
    assert done.output_file_id and done.error_file_id and done.output_file_id != done.error_file_id
    assert await store.file_content(env.acme, done.output_file_id) == b"out\n"
    assert await store.file_content(env.acme, done.error_file_id) == b"err\n"
    out = await store.get_file(env.acme, done.output_file_id)
    assert out is not None and (out.purpose, out.filename, out.bytes) == ("batch_output", f"{batch_id}_output.jsonl", 4)
    assert await store.get_file(env.other, done.output_file_id) is None
    assert await store.to_finalize("r2", 60) == []


async def test_a_batch_without_errors_has_no_error_file(env: Env) -> None:
    batch_id = await env.batch(1)
    (item,) = await env.store.claim(batch_id, "r1", 5, 30)
    assert await env.store.finish(item.id, "r1", "succeeded", "{}")
    assert await env.store.to_finalize("r1", 60) == [batch_id]
    done = await env.store.complete(batch_id, "r1", "completed", b"{}\n", b"")
    assert done is not None and done.output_file_id is not None and done.error_file_id is None


async def test_batches_list_newest_first_by_cursor(env: Env) -> None:
    ids = []
    for _ in range(3):
        ids.append(await env.batch(1))
        env.clock.advance(1)
    other = await env.batch(1, tenant=env.other)
    assert [b.id for b in await env.store.list_batches(env.acme)] == ids[::-1]
    assert [b.id for b in await env.store.list_batches(env.acme, after=ids[2], limit=1)] == [ids[1]]
    assert [b.id for b in await env.store.list_batches(None)] == [other, *ids[::-1]]
    assert await env.store.list_batches(env.other, after=ids[0]) == []
    assert [b.total for b in await env.store.list_batches(env.acme)] == [1, 1, 1]


async def test_two_claimers_at_once_never_share_an_item(env: Env) -> None:
    batch_id = await env.batch(3000)
    first, second = await asyncio.gather(
        env.store.claim(batch_id, "r1", 2000, 30), env.store.claim(batch_id, "r2", 2000, 30)
    )
    mine, theirs = {c.id for c in first}, {c.id for c in second}
    assert not mine & theirs
    # Neither waited out the other and came back empty-handed: between them, every line.
    assert len(mine | theirs) == 3000 and {c.custom_id for c in [*first, *second]} == {f"req-{i}" for i in range(3000)}


async def test_an_expired_lease_is_claimed_again_and_the_first_answer_is_dropped(env: Env) -> None:
    store, clock = env.store, env.clock
    batch_id = await env.batch(2)
    first = await store.claim(batch_id, "r1", 1, 30)
    clock.advance(20)
    await store.renew("r1", [first[0].id], 30)  # now good until 50s
    clock.advance(25)
    assert [c.custom_id for c in await store.claim(batch_id, "r2", 5, 30)] == ["req-1"]  # req-0 still r1's
    clock.advance(10)  # r1's lease ran out at 50s
    assert await store.active_batches() == [(batch_id, env.acme, "")]
    again = await store.claim(batch_id, "r2", 5, 30)
    assert [(c.custom_id, c.attempts) for c in again] == [("req-0", 2)]
    await store.renew("r1", [first[0].id], 300)  # not r1's any more: no effect
    assert await store.finish(first[0].id, "r1", "succeeded", "late") is False
    assert await store.finish(again[0].id, "r2", "succeeded", "on time") is True
    lines = await store.output_lines(batch_id)
    assert (lines[0].state, lines[0].result) == ("succeeded", "on time")


async def test_a_claim_takes_a_dead_replicas_items_before_pending_ones(env: Env) -> None:
    store, clock = env.store, env.clock
    batch_id = await env.batch(6)
    await store.claim(batch_id, "r1", 2, 30)  # req-0, req-1
    await store.claim(batch_id, "r2", 2, 300)  # req-2, req-3
    clock.advance(31)  # r1 died
    taken = await store.claim(batch_id, "r3", 3, 30)
    assert [c.custom_id for c in taken] == ["req-0", "req-1", "req-4"]
    assert [c.custom_id for c in await store.claim(batch_id, "r3", 3, 30)] == ["req-5"]


async def test_an_item_is_answered_once(env: Env) -> None:
    batch_id = await env.batch(1)
    (item,) = await env.store.claim(batch_id, "r1", 1, 30)
    assert await env.store.finish(item.id, "r1", "succeeded", "first") is True
    assert await env.store.finish(item.id, "r1", "failed", "second") is False
    assert [(o.state, o.result) for o in await env.store.output_lines(batch_id)] == [("succeeded", "first")]
    with pytest.raises(ValueError):
        await env.store.finish(item.id, "r1", "expired", "x")


async def test_retry_later_waits_for_not_before(env: Env) -> None:
    store, clock = env.store, env.clock
    batch_id = await env.batch(1)
    (item,) = await store.claim(batch_id, "r1", 1, 30)
    await store.retry_later(item.id, "r2", clock.now)  # not r2's: unchanged
    assert await store.claim(batch_id, "r3", 1, 30) == []
    await store.retry_later(item.id, "r1", clock.now + timedelta(seconds=10))
    assert await store.finish(item.id, "r1", "succeeded", "x") is False  # handed back
    clock.advance(9)
    assert await store.active_batches() == [] and await store.claim(batch_id, "r1", 1, 30) == []
    assert await store.to_finalize("r1", 60) == []  # still to run
    clock.advance(1)
    assert await store.active_batches() == [(batch_id, env.acme, "")]
    assert [(c.id, c.attempts) for c in await store.claim(batch_id, "r2", 1, 30)] == [(item.id, 2)]


async def test_release_hands_an_owners_items_back(env: Env) -> None:
    store = env.store
    batch_id = await env.batch(4)
    await store.claim(batch_id, "r1", 3, 30)
    await store.claim(batch_id, "r2", 1, 30)
    assert await store.release("r1") == 3
    assert await store.release("r1") == 0
    again = await store.claim(batch_id, "r3", 10, 30)  # at once, without waiting out the leases
    assert [(c.custom_id, c.attempts) for c in again] == [(f"req-{i}", 1) for i in range(3)]
    assert (await store.counts_by_state())["running"] == 4


async def test_cancel_cancels_pending_items_and_running_ones_finish(env: Env) -> None:
    store, clock = env.store, env.clock
    batch_id = await env.batch(3)
    (running,) = await store.claim(batch_id, "r1", 1, 30)
    assert await store.cancel(env.other, batch_id) is None
    assert await store.cancel(env.acme, "batch_unknown") is None
    clock.advance(1)
    cancelling = await store.cancel(env.acme, batch_id)
    assert cancelling is not None and cancelling.status == "cancelling" and cancelling.cancelling_at == clock.now
    assert [o.state for o in await store.output_lines(batch_id)] == ["running", "cancelled", "cancelled"]
    assert await store.active_batches() == [] and await store.claim(batch_id, "r2", 5, 30) == []
    assert await store.to_finalize("r2", 60) == []  # its running item may still answer
    assert await store.finish(running.id, "r1", "succeeded", "x") is True
    again = await store.cancel(None, batch_id)
    assert again is not None and again.status == "cancelling" and again.cancelling_at == cancelling.cancelling_at
    assert await store.to_finalize("r2", 60) == [batch_id]
    done = await store.complete(batch_id, "r2", "cancelled", b"x\n", None)
    assert done is not None and (done.status, done.cancelled_at, done.error_file_id) == ("cancelled", clock.now, None)
    assert (done.total, done.completed, done.failed) == (3, 1, 0)  # cancelled lines count in neither
    unchanged = await store.cancel(env.acme, batch_id)
    assert unchanged is not None and unchanged.status == "cancelled"


async def test_a_cancelled_batchs_dead_lease_is_cancelled_at_finalize(env: Env) -> None:
    store, clock = env.store, env.clock
    batch_id = await env.batch(2)
    await store.claim(batch_id, "r1", 1, 30)
    await store.cancel(env.acme, batch_id)
    clock.advance(31)  # r1 died with its item
    assert await store.active_batches() == [] and await store.claim(batch_id, "r2", 5, 30) == []  # not run again
    assert await store.to_finalize("r2", 60) == [batch_id]
    assert [o.state for o in await store.output_lines(batch_id)] == ["cancelled", "cancelled"]


async def test_expire_due_expires_pending_items_past_the_window(env: Env) -> None:
    store, clock = env.store, env.clock
    batch_id = await env.batch(4, window_s=60)
    in_time = await env.batch(1, window_s=600)
    claimed = await store.claim(batch_id, "r1", 2, 120)
    assert await store.expire_due() == []
    clock.advance(61)
    assert await store.active_batches() == [(in_time, env.acme, "")]
    assert await store.claim(batch_id, "r2", 5, 30) == []  # past its window: nothing more starts
    assert await store.expire_due() == [batch_id]
    assert [o.state for o in await store.output_lines(batch_id)] == ["running", "running", "expired", "expired"]
    assert await store.to_finalize("r1", 60) == []  # two run under a live lease
    assert await store.finish(claimed[0].id, "r1", "succeeded", "x") is True
    clock.advance(60)  # the other's lease ran out: nothing will answer it
    assert await store.to_finalize("r1", 60) == [batch_id]
    assert [o.state for o in await store.output_lines(batch_id)] == ["succeeded", "expired", "expired", "expired"]
    done = await store.complete(batch_id, "r1", "expired", b"x\n", b"e\n")
    assert done is not None and (done.status, done.expired_at) == ("expired", clock.now)
    assert (done.total, done.completed, done.failed) == (4, 1, 3)


async def test_each_batch_is_finalized_by_exactly_one_replica(env: Env) -> None:
    store, clock = env.store, env.clock
    ids = [await env.batch(0) for _ in range(4)]
    got = await asyncio.gather(store.to_finalize("r1", 60), store.to_finalize("r2", 60))
    assert sorted([*got[0], *got[1]]) == sorted(ids)
    owner = {batch_id: ("r1" if batch_id in got[0] else "r2") for batch_id in ids}
    first = ids[0]
    started = await store.get_batch(None, first)
    assert started is not None and started.finalizing_at == START

    # Its finalizer dies: once its lease runs out another takes the batch over, and the first
    # one's late complete is refused.
    clock.advance(61)
    taker = "r3"
    assert sorted(await store.to_finalize(taker, 60)) == sorted(ids)
    again = await store.get_batch(None, first)
    assert again is not None and again.finalizing_at == START  # the first try's, kept
    assert await store.complete(first, owner[first], "completed", b"late\n", None) is None
    done = await store.complete(first, taker, "completed", b"x\n", None)
    assert done is not None and done.status == "completed"


async def test_completing_again_replaces_the_files(env: Env) -> None:
    store = env.store
    batch_id = await env.batch(1)
    (item,) = await store.claim(batch_id, "r1", 1, 30)
    assert await store.finish(item.id, "r1", "failed", "{}")
    assert await store.to_finalize("r1", 60) == [batch_id]
    first = await store.complete(batch_id, "r1", "completed", b"one\n", b"err one\n")
    second = await store.complete(batch_id, "r1", "failed", b"two\n", None)
    assert first is not None and second is not None
    assert second.output_file_id == first.output_file_id and second.error_file_id is None
    assert (second.status, second.failed_at, second.completed_at) == ("failed", env.clock.now, None)
    assert second.output_file_id is not None
    assert await store.file_content(env.acme, second.output_file_id) == b"two\n"
    outputs = await store.list_files(env.acme, purpose="batch_output")
    assert [f.id for f in outputs] == [second.output_file_id]
    with pytest.raises(ValueError):
        await store.complete(batch_id, "r1", "finalizing", None, None)
