"""The batch runner's side of BatchStore: leasing a batch's lines to replicas, recording each
answer once, handing work back. Finalizing is db/batch_finalize.py.

Any replica works on any batch. An item is leased (state running, lease_owner, lease_until);
a lease that runs out makes the item claimable again, so a dead replica's lines are run by
another. Every write that decides who owns a row is one conditional UPDATE (its WHERE says
"still pending", "still ours"), so two replicas never both win a row:

- PostgreSQL: rows a claim picks are locked FOR UPDATE SKIP LOCKED first, so two claimers at
  once skip each other's rows instead of waiting or colliding. Updates of many rows lock them
  in id order, so two of them never deadlock.
- SQLite: one writer at a time. A statement that writes takes the write lock before it reads,
  so a single UPDATE ... WHERE id IN (SELECT ... LIMIT n) is atomic; each multi-statement
  transaction here starts with its write for the same reason."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.db.batch_files import FileStore
from laneway.db.batch_records import (
    FAILED,
    IN_PROGRESS,
    PENDING,
    RUNNING,
    SUCCEEDED,
    ClaimedItem,
    is_postgres,
)
from laneway.db.batch_tables import Batch, BatchItem

NO_SYNC: dict[str, Any] = {"synchronize_session": False}  # bulk updates: no ORM objects to refresh


def lease_ran_out(now: datetime) -> ColumnElement[bool]:
    """Items running under a lease that ran out (a dead replica's): claimable again."""
    return and_(BatchItem.state == RUNNING, BatchItem.lease_until < now)


def waiting(now: datetime) -> ColumnElement[bool]:
    """Pending items past any retry wait."""
    return and_(BatchItem.state == PENDING, or_(BatchItem.not_before.is_(None), BatchItem.not_before <= now))


def claimable(now: datetime) -> ColumnElement[bool]:
    """Items a runner may take now."""
    return or_(waiting(now), lease_ran_out(now))


def runnable_batch(now: datetime) -> ColumnElement[bool]:
    """Batches whose items are still run: in progress and not past their window (an expired
    batch's leftovers are expired, a cancelling one's cancelled, at finalize)."""
    return and_(Batch.status == IN_PROGRESS, Batch.expires_at >= now)


def items_where(session: AsyncSession, condition: ColumnElement[bool]) -> ColumnElement[bool]:
    """`condition` for an UPDATE of many items. On PostgreSQL the rows are locked in id order
    first: two such updates then wait for each other in one order, never in a circle."""
    if not is_postgres(session):
        return condition
    locked = select(BatchItem.id).where(condition).order_by(BatchItem.id).with_for_update()
    return and_(BatchItem.id.in_(locked), condition)


class BatchWork(FileStore):
    def _lease_until(self, lease_s: float) -> tuple[datetime, datetime]:
        now = self._now()
        return now, now + timedelta(seconds=lease_s)

    async def active_batches(self) -> list[tuple[str, int, str]]:
        """(batch id, tenant id, model) of the batches with an item to claim now, oldest first."""
        now = self._now()
        work = select(BatchItem.id).where(BatchItem.batch_id == Batch.id, claimable(now)).exists()
        async with self._sessions() as session:
            found = await session.execute(
                select(Batch.id, Batch.tenant_id, Batch.model)
                .where(runnable_batch(now), work)
                .order_by(Batch.created_at, Batch.id)
            )
            return [(batch_id, tenant_id, model) for batch_id, tenant_id, model in found.all()]

    async def claim(self, batch_id: str, owner: str, limit: int, lease_s: float) -> list[ClaimedItem]:
        """Leases up to `limit` of the batch's claimable items to `owner`: running, lease_until
        = now + lease_s, attempts + 1. Items whose lease ran out come first, then pending ones,
        each by line; the list is in line order. Two claimers never get one item."""
        if limit <= 0:
            return []
        now, until = self._lease_until(lease_s)
        taken: list[Row[int, int, int, str, str, int]] = []
        async with self._sessions() as session, session.begin():
            # Two picks, not one with an OR: each is then a range of the (batch_id, state, line)
            # index read in order that stops at `limit`, not a sort of the whole batch.
            for kind in (lease_ran_out(now), waiting(now)):
                if len(taken) < limit:
                    taken += await self._take(session, batch_id, kind, limit - len(taken), owner, now, until)
            if not taken:
                return []
            batch = (await session.execute(select(Batch.key_sha256, Batch.endpoint).where(Batch.id == batch_id))).one()
            return [
                ClaimedItem(
                    id=row.id,
                    batch_id=batch_id,
                    tenant_id=row.tenant_id,
                    key_sha256=batch.key_sha256,
                    endpoint=batch.endpoint,
                    custom_id=row.custom_id,
                    body=row.body,
                    attempts=row.attempts,
                )
                for row in sorted(taken, key=lambda row: row.line)
            ]

    @staticmethod
    async def _take(
        session: AsyncSession,
        batch_id: str,
        kind: ColumnElement[bool],
        limit: int,
        owner: str,
        now: datetime,
        until: datetime,
    ) -> Sequence[Row[int, int, int, str, str, int]]:
        """Leases up to `limit` of the batch's items of `kind`, first lines first."""
        wanted = and_(
            BatchItem.batch_id == batch_id,
            kind,
            select(Batch.id).where(Batch.id == batch_id, runnable_batch(now)).exists(),
        )
        pick = select(BatchItem.id).where(wanted).order_by(BatchItem.line).limit(limit)
        if is_postgres(session):
            # Its own statement: the rows locked are then exactly those updated (a LIMIT
            # subquery inside the UPDATE may be run again and pick others). Locked, they stay
            # `wanted` until this transaction ends.
            ids = list((await session.execute(pick.with_for_update(skip_locked=True, of=BatchItem))).scalars())
            if not ids:
                return []
            chosen = BatchItem.id.in_(ids)
        else:
            # One statement: SQLite runs it under the write lock, so what it picks is still
            # `wanted` when it writes.
            chosen = BatchItem.id.in_(pick)
        claimed = await session.execute(
            update(BatchItem)
            .where(chosen)
            .values(
                state=RUNNING, lease_owner=owner, lease_until=until, not_before=None, attempts=BatchItem.attempts + 1
            )
            .returning(
                BatchItem.id,
                BatchItem.line,
                BatchItem.tenant_id,
                BatchItem.custom_id,
                BatchItem.body,
                BatchItem.attempts,
            )
            .execution_options(**NO_SYNC)
        )
        return claimed.all()

    async def renew(self, owner: str, item_ids: Sequence[int], lease_s: float) -> None:
        """Pushes the lease of those of `item_ids` still running under `owner` to now + lease_s."""
        if not item_ids:
            return
        _, until = self._lease_until(lease_s)
        ours = and_(BatchItem.id.in_(list(item_ids)), BatchItem.state == RUNNING, BatchItem.lease_owner == owner)
        async with self._sessions() as session, session.begin():
            await session.execute(
                update(BatchItem)
                .where(items_where(session, ours))
                .values(lease_until=until)
                .execution_options(**NO_SYNC)
            )

    async def finish(self, item_id: int, owner: str, state: str, result: str) -> bool:
        """Records an item's answer (`state` succeeded or failed; `result` its output or error
        file line) if it is still running under `owner`. False: it is not ours any more (its
        lease ran out and another replica has it, or it was cancelled or expired), and the
        result is dropped: each item's line is written once."""
        if state not in (SUCCEEDED, FAILED):
            raise ValueError(f"an item finishes succeeded or failed, not {state!r}")
        now = self._now()
        async with self._sessions() as session, session.begin():
            done = await session.execute(
                update(BatchItem)
                .where(BatchItem.id == item_id, BatchItem.state == RUNNING, BatchItem.lease_owner == owner)
                .values(state=state, result=result, finished_at=now, lease_owner=None, lease_until=None)
                .returning(BatchItem.id)
                .execution_options(**NO_SYNC)
            )
            return done.first() is not None

    async def retry_later(self, item_id: int, owner: str, not_before: datetime) -> None:
        """Hands a running item of ours back to wait until `not_before` (rate limited, engine
        busy); attempts unchanged (the next claim counts one more)."""
        async with self._sessions() as session, session.begin():
            await session.execute(
                update(BatchItem)
                .where(BatchItem.id == item_id, BatchItem.state == RUNNING, BatchItem.lease_owner == owner)
                .values(state=PENDING, lease_owner=None, lease_until=None, not_before=not_before)
                .execution_options(**NO_SYNC)
            )

    async def release(self, owner: str) -> int:
        """Hands every item running under `owner` back (a replica shutting down): pending at
        once, and their attempt uncounted, since handing work back is not a failure of the
        line. How many."""
        ours = and_(BatchItem.state == RUNNING, BatchItem.lease_owner == owner)
        async with self._sessions() as session, session.begin():
            handed = await session.execute(
                update(BatchItem)
                .where(items_where(session, ours))
                .values(state=PENDING, lease_owner=None, lease_until=None, attempts=BatchItem.attempts - 1)
                .returning(BatchItem.id)
                .execution_options(**NO_SYNC)
            )
            return len(handed.all())
