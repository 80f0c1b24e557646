"""What the batch store hands out: plain frozen records, never ORM rows (a row outlives its
session badly, and the API and the runner need none of its machinery), and the reads that
build them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, DateTime, func, literal, select
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.db.batch_tables import Batch, BatchItem, StoredFile

Clock = Callable[[], datetime]

# Item states: waiting or leased, and the four an item ends in.
PENDING, RUNNING = "pending", "running"
SUCCEEDED, FAILED, EXPIRED, CANCELLED = "succeeded", "failed", "expired", "cancelled"
ITEM_STATES = (PENDING, RUNNING, SUCCEEDED, FAILED, EXPIRED, CANCELLED)

# Batch statuses the store moves through (validating is OpenAI's; create_batch starts at in_progress).
VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING = "validating", "in_progress", "finalizing", "cancelling"
COMPLETED = "completed"
FINAL_STATUSES = (COMPLETED, FAILED, EXPIRED, CANCELLED)
OPEN_STATUSES = (VALIDATING, IN_PROGRESS, CANCELLING, FINALIZING)  # the rest: work may remain


@dataclass(frozen=True, slots=True)
class FileInfo:
    id: str
    tenant_id: int
    purpose: str
    filename: str
    bytes: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """A batch as OpenAI shows it; total/completed/failed are its request_counts (completed:
    succeeded items; failed: failed and expired ones; cancelled items count in neither)."""

    id: str
    tenant_id: int
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, Any] | None
    status: str
    output_file_id: str | None
    error_file_id: str | None
    errors: dict[str, Any] | None
    created_at: datetime
    in_progress_at: datetime | None
    finalizing_at: datetime | None
    completed_at: datetime | None
    failed_at: datetime | None
    expired_at: datetime | None
    cancelling_at: datetime | None
    cancelled_at: datetime | None
    expires_at: datetime
    total: int
    completed: int
    failed: int
    model: str = ""  # the model every line names


@dataclass(frozen=True, slots=True)
class ClaimedItem:
    """A line leased to a runner, with what it needs to run it as its batch's API key."""

    id: int
    batch_id: str
    tenant_id: int
    key_sha256: str
    endpoint: str
    custom_id: str
    body: str
    attempts: int


@dataclass(frozen=True, slots=True)
class OutputLine:
    line: int
    custom_id: str
    state: str
    result: str | None


def utc(value: datetime) -> datetime:
    """SQLite hands datetimes back without their zone; every one stored here is UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def maybe_utc(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value)


def at(value: datetime) -> ColumnElement[datetime]:
    """A time as a bound value of the columns' type: a bare datetime in coalesce() would be
    bound as a zoneless timestamp, which asyncpg refuses for an aware one."""
    return literal(value, DateTime(timezone=True))


def is_postgres(session: AsyncSession) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def file_info(row: StoredFile) -> FileInfo:
    return FileInfo(row.id, row.tenant_id, row.purpose, row.filename, row.size, utc(row.created_at))


async def batch_infos(session: AsyncSession, rows: Sequence[Batch]) -> list[BatchInfo]:
    """The batches as records, their item counts read in one grouped query."""
    if not rows:
        return []
    counted = await session.execute(
        select(BatchItem.batch_id, BatchItem.state, func.count())
        .where(BatchItem.batch_id.in_([row.id for row in rows]))
        .group_by(BatchItem.batch_id, BatchItem.state)
    )
    counts: dict[str, dict[str, int]] = {}
    for batch_id, state, n in counted.all():
        counts.setdefault(batch_id, {})[state] = n
    return [_batch_info(row, counts.get(row.id, {})) for row in rows]


def _batch_info(row: Batch, counts: dict[str, int]) -> BatchInfo:
    return BatchInfo(
        id=row.id,
        tenant_id=row.tenant_id,
        endpoint=row.endpoint,
        input_file_id=row.input_file_id,
        completion_window=row.completion_window,
        metadata=row.metadata_,
        status=row.status,
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        errors=row.errors,
        created_at=utc(row.created_at),
        in_progress_at=maybe_utc(row.in_progress_at),
        finalizing_at=maybe_utc(row.finalizing_at),
        completed_at=maybe_utc(row.completed_at),
        failed_at=maybe_utc(row.failed_at),
        expired_at=maybe_utc(row.expired_at),
        cancelling_at=maybe_utc(row.cancelling_at),
        cancelled_at=maybe_utc(row.cancelled_at),
        expires_at=utc(row.expires_at),
        total=sum(counts.values()),
        completed=counts.get(SUCCEEDED, 0),
        failed=counts.get(FAILED, 0) + counts.get(EXPIRED, 0),
        model=row.model,
    )


async def load_batch(session: AsyncSession, batch_id: str, tenant_id: int | None = None) -> BatchInfo | None:
    """One batch (None: not found, or not `tenant_id`'s when one is given), read afresh."""
    query = select(Batch).where(Batch.id == batch_id).execution_options(populate_existing=True)
    if tenant_id is not None:
        query = query.where(Batch.tenant_id == tenant_id)
    row = (await session.execute(query)).scalar_one_or_none()
    return None if row is None else (await batch_infos(session, [row]))[0]
