"""BatchStore: the storage of the Files and Batches API (issue 25), on SQLite or PostgreSQL.

One object in three parts, one module each: the files (db/batch_files.py), the runner's work on
items (db/batch_work.py) and finalizing (db/batch_finalize.py); here, what the API does with
batches: create, read, list, cancel. Records out are plain frozen dataclasses
(db/batch_records.py), re-exported here for the API and the runner."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.db.batch_finalize import BatchFinalize
from laneway.db.batch_records import (
    CANCELLED,
    CANCELLING,
    IN_PROGRESS,
    PENDING,
    VALIDATING,
    BatchInfo,
    batch_infos,
    load_batch,
)
from laneway.db.batch_records import ClaimedItem as ClaimedItem
from laneway.db.batch_records import FileInfo as FileInfo
from laneway.db.batch_records import OutputLine as OutputLine
from laneway.db.batch_tables import Batch, BatchItem
from laneway.db.batch_work import NO_SYNC, items_where

ITEMS_PER_INSERT = 1000  # one executemany per chunk: a 50,000-line batch is 50 round trips

# Runs in cancel's transaction once the batch has moved: an admin's audit row is written with
# the change or not at all.
OnCancelled = Callable[[AsyncSession, BatchInfo], Awaitable[None]]


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


class BatchStore(BatchFinalize):
    """BatchStore(sessions, *, clock=lambda: datetime.now(UTC)). Each method is one transaction.

    A `tenant_id` of None (get_batch, list_batches, cancel) is an admin's: any tenant's batch."""

    async def create_batch(
        self,
        tenant_id: int,
        key_sha256: str,
        endpoint: str,
        input_file_id: str,
        completion_window: str,
        metadata: dict[str, Any] | None,
        expires_at: datetime,
        items: Sequence[tuple[str, str]],
        *,
        model: str = "",
    ) -> BatchInfo:
        """A batch of `items` ((custom_id, body as JSON text), in file order), in progress at
        once, every item pending. The caller has checked the lines: a custom_id twice in one
        batch breaks the unique constraint (IntegrityError, nothing written)."""
        now = self._now()
        batch_id = new_batch_id()
        async with self._sessions() as session, session.begin():
            await session.execute(
                insert(Batch).values(
                    id=batch_id,
                    tenant_id=tenant_id,
                    key_sha256=key_sha256,
                    endpoint=endpoint,
                    model=model,
                    input_file_id=input_file_id,
                    completion_window=completion_window,
                    metadata_=metadata,
                    status=IN_PROGRESS,
                    created_at=now,
                    in_progress_at=now,
                    expires_at=expires_at,
                )
            )
            rows = [
                {
                    "batch_id": batch_id,
                    "line": line,
                    "custom_id": custom_id,
                    "tenant_id": tenant_id,
                    "body": body,
                    "state": PENDING,
                    "attempts": 0,
                }
                for line, (custom_id, body) in enumerate(items)
            ]
            for start in range(0, len(rows), ITEMS_PER_INSERT):
                await session.execute(insert(BatchItem), rows[start : start + ITEMS_PER_INSERT])
            created = await load_batch(session, batch_id)
        assert created is not None  # written just above, in this transaction
        return created

    async def get_batch(self, tenant_id: int | None, batch_id: str) -> BatchInfo | None:
        """The batch; None when there is none of that id, or it is another tenant's."""
        async with self._sessions() as session:
            return await load_batch(session, batch_id, tenant_id)

    async def list_batches(
        self, tenant_id: int | None, *, after: str | None = None, limit: int = 20
    ) -> list[BatchInfo]:
        """A page of batches, newest first; `after` is the last batch id of the page before (an
        id that is not one of the tenant's: an empty page)."""
        async with self._sessions() as session:
            query = select(Batch)
            if tenant_id is not None:
                query = query.where(Batch.tenant_id == tenant_id)
            if after is not None:
                cursor = (await session.execute(query.where(Batch.id == after))).scalar_one_or_none()
                if cursor is None:
                    return []
                query = query.where(
                    or_(
                        Batch.created_at < cursor.created_at,
                        and_(Batch.created_at == cursor.created_at, Batch.id < cursor.id),
                    )
                )
            query = query.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(limit)
            rows = (await session.execute(query)).scalars().all()
            return await batch_infos(session, rows)

    async def cancel(
        self, tenant_id: int | None, batch_id: str, *, on_cancelled: OnCancelled | None = None
    ) -> BatchInfo | None:
        """Cancels a batch that is validating or in progress: cancelling (cancelling_at = now),
        its pending items cancelled at once; running ones finish, and the batch becomes
        cancelled at finalize. A batch in any other status comes back unchanged. None when
        there is no such batch, or it is another tenant's. `on_cancelled(session, batch)` runs
        in the same transaction when this call moved the batch (what it raises undoes it)."""
        now = self._now()
        movable = [Batch.id == batch_id, Batch.status.in_([VALIDATING, IN_PROGRESS])]
        if tenant_id is not None:
            movable.append(Batch.tenant_id == tenant_id)
        async with self._sessions() as session, session.begin():
            moved = await session.execute(
                update(Batch)
                .where(*movable)
                .values(status=CANCELLING, cancelling_at=now)
                .returning(Batch.id)
                .execution_options(**NO_SYNC)
            )
            was_moved = moved.first() is not None
            if was_moved:
                left = and_(BatchItem.batch_id == batch_id, BatchItem.state == PENDING)
                await session.execute(
                    update(BatchItem)
                    .where(items_where(session, left))
                    .values(state=CANCELLED, finished_at=now, not_before=None)
                    .execution_options(**NO_SYNC)
                )
            found = await load_batch(session, batch_id, tenant_id)
            if was_moved and found is not None and on_cancelled is not None:
                await on_cancelled(session, found)
            return found
