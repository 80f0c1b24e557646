"""The end of a batch: expiring what its window left, handing each finished batch to exactly one
replica to finalize (a lease: another takes over if that one dies), and writing its output and
error files with its final status in one transaction. Part of BatchStore (db/batch_store.py);
the locking rules are db/batch_work.py's."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, func, or_, select, update

from laneway.db.batch_files import output_file_id, replace_file
from laneway.db.batch_records import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    EXPIRED,
    FAILED,
    FINAL_STATUSES,
    FINALIZING,
    IN_PROGRESS,
    ITEM_STATES,
    OPEN_STATUSES,
    PENDING,
    RUNNING,
    BatchInfo,
    OutputLine,
    at,
    is_postgres,
    load_batch,
)
from laneway.db.batch_tables import Batch, BatchItem
from laneway.db.batch_work import NO_SYNC, BatchWork, items_where

# The column each final status stamps.
STAMPS = {
    COMPLETED: Batch.completed_at,
    EXPIRED: Batch.expired_at,
    CANCELLED: Batch.cancelled_at,
    FAILED: Batch.failed_at,
}


def _items(*conditions: ColumnElement[bool]) -> ColumnElement[bool]:
    """Whether the batch (of the enclosing query) has an item meeting `conditions`."""
    return select(BatchItem.id).where(BatchItem.batch_id == Batch.id, *conditions).exists()


def ready_to_finalize(now: datetime) -> ColumnElement[bool]:
    """Batches with nothing left to run:
    - in progress, in their window, with no item pending or running (a running item with a
      dead lease is claimed again, so it is left to run);
    - cancelling, or in progress past their window, with no item running under a live lease:
      what is left (pending, or a dead replica's) is cancelled or expired as it is handed out;
    - finalizing under a lease that ran out: its finalizer died."""
    live = and_(BatchItem.state == RUNNING, BatchItem.lease_until >= now)
    return or_(
        and_(Batch.status == IN_PROGRESS, Batch.expires_at >= now, ~_items(BatchItem.state.in_([PENDING, RUNNING]))),
        and_(
            or_(Batch.status == CANCELLING, and_(Batch.status == IN_PROGRESS, Batch.expires_at < now)),
            ~_items(live),
        ),
        and_(Batch.status == FINALIZING, Batch.finalize_until < now),
    )


class BatchFinalize(BatchWork):
    async def any_open(self) -> bool:
        """Whether any batch has yet to reach a final status: with none, no replica's runner
        has anything to claim, expire or finalize (one indexed read, ix_batches_status)."""
        # By name, not "not final": an IN reads the status index.
        unfinished = select(Batch.id).where(Batch.status.in_(OPEN_STATUSES)).limit(1)
        async with self._sessions() as session:
            return (await session.execute(unfinished)).first() is not None

    async def expire_due(self) -> list[str]:
        """Batches in progress or cancelling past expires_at: their pending items become
        expired (running ones finish or are released; the batch's status is set at finalize).
        Their ids (on PostgreSQL, less those another replica holds at this moment)."""
        now = self._now()
        due = (
            select(Batch.id)
            .where(Batch.status.in_([IN_PROGRESS, CANCELLING]), Batch.expires_at < now)
            .order_by(Batch.id)
        )
        async with self._sessions() as session, session.begin():
            if is_postgres(session):
                due = due.with_for_update(skip_locked=True)
            ids = list((await session.execute(due)).scalars())
            if ids:
                left = and_(BatchItem.batch_id.in_(ids), BatchItem.state == PENDING)
                await session.execute(
                    update(BatchItem)
                    .where(items_where(session, left))
                    .values(state=EXPIRED, finished_at=now, not_before=None)
                    .execution_options(**NO_SYNC)
                )
            return ids

    async def to_finalize(self, owner: str, lease_s: float) -> list[str]:
        """Hands `owner` the batches ready to finalize (ready_to_finalize), each to exactly one
        replica: finalizing (finalizing_at kept from a first try), finalize_owner = owner,
        finalize_until = now + lease_s. A cancelling batch's leftovers become cancelled, an
        expired one's expired, in the same transaction. Their ids, oldest first."""
        now = self._now()
        ready = ready_to_finalize(now)
        pick = select(Batch.id).where(ready).order_by(Batch.created_at, Batch.id)
        async with self._sessions() as session, session.begin():
            if is_postgres(session):
                pick = pick.with_for_update(skip_locked=True, of=Batch)
            ids = list((await session.execute(pick)).scalars())
            if not ids:
                return []
            # Ready again in the UPDATE: on SQLite another replica may have taken one since.
            taken = await session.execute(
                update(Batch)
                .where(Batch.id.in_(ids), ready)
                .values(
                    status=FINALIZING,
                    finalizing_at=func.coalesce(Batch.finalizing_at, at(now)),
                    finalize_owner=owner,
                    finalize_until=now + timedelta(seconds=lease_s),
                )
                .returning(Batch.id, Batch.cancelling_at)
                .execution_options(**NO_SYNC)
            )
            rows = taken.all()
            cancelled = [row.id for row in rows if row.cancelling_at is not None]
            expired = [row.id for row in rows if row.cancelling_at is None]
            for state, batch_ids in ((CANCELLED, cancelled), (EXPIRED, expired)):
                if not batch_ids:
                    continue
                # Leftovers; in a batch that finished in its window there are none.
                left = and_(
                    BatchItem.batch_id.in_(batch_ids),
                    or_(BatchItem.state == PENDING, and_(BatchItem.state == RUNNING, BatchItem.lease_until < now)),
                )
                await session.execute(
                    update(BatchItem)
                    .where(items_where(session, left))
                    .values(state=state, finished_at=now, lease_owner=None, lease_until=None, not_before=None)
                    .execution_options(**NO_SYNC)
                )
            got = {row.id for row in rows}
            return [batch_id for batch_id in ids if batch_id in got]

    async def output_lines(self, batch_id: str) -> list[OutputLine]:
        """Every item of the batch by line: its state and result (None for an item that ended
        expired or cancelled: the runner writes those lines itself)."""
        async with self._sessions() as session:
            found = await session.execute(
                select(BatchItem.line, BatchItem.custom_id, BatchItem.state, BatchItem.result)
                .where(BatchItem.batch_id == batch_id)
                .order_by(BatchItem.line)
            )
            return [OutputLine(row.line, row.custom_id, row.state, row.result) for row in found.all()]

    async def complete(
        self, batch_id: str, owner: str, status: str, output: bytes | None, errors: bytes | None
    ) -> BatchInfo | None:
        """Ends a batch `owner` finalizes: writes its output and error files (ids derived from
        the batch id; an empty one: none, id None), sets `status` (completed, expired,
        cancelled or failed) and its timestamp. Done again by the same owner it replaces the
        files and status, never adds files. None when the batch is not `owner`'s to finalize
        (another replica took it over)."""
        if status not in FINAL_STATUSES:
            raise ValueError(f"a batch ends {', '.join(FINAL_STATUSES)}, not {status!r}")
        now = self._now()
        out_id, err_id = output_file_id(batch_id, "output"), output_file_id(batch_id, "error")
        stamps = {column.key: (now if final == status else None) for final, column in STAMPS.items()}
        async with self._sessions() as session, session.begin():
            # The UPDATE first: it decides whether the batch is ours (and on SQLite takes the write lock).
            ours = await session.execute(
                update(Batch)
                .where(
                    Batch.id == batch_id,
                    Batch.finalize_owner == owner,
                    Batch.status.in_([FINALIZING, *FINAL_STATUSES]),
                )
                .values(
                    status=status,
                    output_file_id=out_id if output else None,
                    error_file_id=err_id if errors else None,
                    finalize_until=None,
                    **stamps,
                )
                .returning(Batch.tenant_id)
                .execution_options(**NO_SYNC)
            )
            tenant_id = ours.scalar_one_or_none()
            if tenant_id is None:
                return None
            for file_id, kind, content in ((out_id, "output", output), (err_id, "error", errors)):
                await replace_file(
                    session,
                    file_id=file_id,
                    tenant_id=tenant_id,
                    filename=f"{batch_id}_{kind}.jsonl",
                    content=content,
                    now=now,
                )
            return await load_batch(session, batch_id)

    async def counts_by_state(self) -> dict[str, int]:
        """Items of all batches by state, every state present (0 when none): for the metrics."""
        async with self._sessions() as session:
            found = await session.execute(select(BatchItem.state, func.count()).group_by(BatchItem.state))
            counts = dict.fromkeys(ITEM_STATES, 0)
            for state, n in found.all():
                counts[state] = n
            return counts
