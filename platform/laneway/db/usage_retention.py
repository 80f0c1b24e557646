"""Usage that expires, and the days created ahead.

PostgreSQL (usage_records partitioned by day since migration 0016):
- `ensure_partitions` creates the partitions of today and the next `ahead_days`; a day whose
  rows already landed in the DEFAULT partition (laneway was down past the days made ahead)
  has them moved into its new partition in the same transaction, none lost;
- `drop_expired` drops the partitions of days wholly before the retention cut: a DROP TABLE per
  day, never a DELETE that scans; only the DEFAULT partition's few stragglers are deleted.
SQLite (the embedded default): one table, a plain DELETE of rows before the cut.

Rollups outlive the raw rows: minute buckets are kept as long as the raw rows, hour and day
buckets `rollup_days` (default two years).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, text
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.db.models import UsageRecord
from laneway.db.rollups import DAY, HOUR, MINUTE, epoch_s, totals_tier, usage_rollups

PARTITION = re.compile(r"^usage_records_p(\d{8})$")
DEFAULT_PARTITION = "usage_records_pdefault"


@dataclass
class RetentionResult:
    dropped_partitions: list[str]
    deleted_rows: int  # SQLite's DELETE, or PostgreSQL's default-partition stragglers
    deleted_rollups: int


def _day(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


async def is_partitioned(session: AsyncSession) -> bool:
    if _dialect(session) != "postgresql":
        return False
    found = await session.execute(
        text(
            "SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
            "WHERE c.oid = to_regclass('usage_records')"
        )
    )
    return found.first() is not None


async def partitions(session: AsyncSession) -> list[str]:
    """The names of usage_records' partitions (the DEFAULT one included)."""
    rows = await session.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass('usage_records') ORDER BY 1"
        )
    )
    return [str(name) for (name,) in rows.all()]


async def ensure_partitions(session: AsyncSession, *, now: datetime | None = None, ahead_days: int = 7) -> list[str]:
    """Create the missing day partitions from today to `ahead_days` ahead; their names."""
    if not await is_partitioned(session):
        return []
    have = set(await partitions(session))
    today = _day(now or datetime.now(UTC))
    made = []
    for n in range(ahead_days + 1):
        day = today + timedelta(days=n)
        name = f"usage_records_p{day:%Y%m%d}"
        if name in have:
            continue
        lo, hi = f"{day:%Y-%m-%d} 00:00:00+00", f"{day + timedelta(days=1):%Y-%m-%d} 00:00:00+00"
        strays = await session.execute(
            text(f"SELECT 1 FROM {DEFAULT_PARTITION} WHERE created_at >= :lo AND created_at < :hi LIMIT 1"),
            {"lo": day, "hi": day + timedelta(days=1)},
        )
        if strays.first() is None:
            await session.execute(
                text(f"CREATE TABLE {name} PARTITION OF usage_records FOR VALUES FROM ('{lo}') TO ('{hi}')")
            )
        else:  # rows of that day wait in the default partition: move them into the new day
            await session.execute(text(f"CREATE TABLE {name} (LIKE usage_records INCLUDING DEFAULTS)"))
            await session.execute(
                text(
                    f"WITH moved AS (DELETE FROM {DEFAULT_PARTITION} WHERE created_at >= :lo AND created_at < :hi "
                    f"RETURNING *) INSERT INTO {name} SELECT * FROM moved"
                ),
                {"lo": day, "hi": day + timedelta(days=1)},
            )
            await session.execute(
                text(f"ALTER TABLE usage_records ATTACH PARTITION {name} FOR VALUES FROM ('{lo}') TO ('{hi}')")
            )
        made.append(name)
    return made


async def drop_expired(
    session: AsyncSession, *, raw_days: int = 90, rollup_days: int = 730, now: datetime | None = None
) -> RetentionResult:
    """Raw rows created before `raw_days` ago (whole days on PostgreSQL) and rollups past theirs."""
    now = now or datetime.now(UTC)
    raw_cut = _day(now - timedelta(days=raw_days))
    dropped: list[str] = []
    deleted = 0
    if await is_partitioned(session):
        for name in await partitions(session):
            match = PARTITION.match(name)
            if match and datetime.strptime(match.group(1), "%Y%m%d").replace(tzinfo=UTC) + timedelta(days=1) <= raw_cut:
                await session.execute(text(f"DROP TABLE {name}"))
                dropped.append(name)
        gone = await session.execute(text(f"DELETE FROM {DEFAULT_PARTITION} WHERE created_at < :cut"), {"cut": raw_cut})
        deleted = int(gone.rowcount or 0)  # type: ignore[attr-defined]
    else:
        gone = await session.execute(delete(UsageRecord).where(UsageRecord.created_at < raw_cut))
        deleted = int(gone.rowcount or 0)  # type: ignore[attr-defined]
    rollup_cut = epoch_s(_day(now - timedelta(days=rollup_days)))
    c = usage_rollups.c
    removed = 0
    for width, cut in ((MINUTE, epoch_s(raw_cut)), (HOUR, rollup_cut), (DAY, rollup_cut)):
        both_tiers = c.width_s.in_((width, totals_tier(width)))
        result = await session.execute(delete(usage_rollups).where(both_tiers, c.bucket_s < cut))
        removed += int(result.rowcount or 0)  # type: ignore[attr-defined]
    return RetentionResult(dropped, deleted, removed)


def _dialect(session: AsyncSession) -> str:
    bind = session.bind
    assert bind is not None, "the session must be bound to an engine"
    return str(bind.dialect.name)
