"""A tenant's usage over a period, summed from the rollups (db/usage_series.py): the admin UI's
usage page. Its cost grows with the buckets shown (a 12-month page sums 365 day buckets),
never with the raw rows; TTFT percentiles come from the rollups' fixed-bucket histograms. The
CSV export alone reads raw rows, streamed from a server-side cursor.

A period's buckets are whole (aligned to their width): the last one holds now.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.db.models import UsageRecord
from laneway.db.rollups import epoch_s
from laneway.db.usage_series import Totals, top_groups, usage_series

QUANTILES = (0.5, 0.95, 0.99)
TOP_GROUPS = 20  # keys and models listed by spend: the top ones, never every key of a tenant


@dataclass(frozen=True)
class Period:
    key: str
    label: str
    length: timedelta
    buckets: int

    @property
    def width(self) -> timedelta:
        return self.length / self.buckets


PERIODS: dict[str, Period] = {
    p.key: p
    for p in (
        Period("hour", "Last hour", timedelta(hours=1), 12),  # 5-minute buckets
        Period("day", "Last 24 hours", timedelta(days=1), 24),  # hourly
        Period("30d", "Last 30 days", timedelta(days=30), 30),  # daily
        Period("12m", "Last 12 months", timedelta(days=360), 12),  # 30 days each
    )
}
DEFAULT_PERIOD = "day"


@dataclass
class Figures:
    """Counts and TTFT percentiles (milliseconds; None without a request that had a first token)."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micros: int = 0  # spend, in micro-units of the currency (rows without a price count 0)
    ttft_n: int = 0
    ttft: dict[float, float | None] = field(default_factory=lambda: dict.fromkeys(QUANTILES))


@dataclass(frozen=True)
class Bucket:
    start: datetime
    figures: Figures


@dataclass(frozen=True)
class ErrorCount:
    status: int
    code: str
    requests: int


@dataclass(frozen=True)
class Spend:
    """Requests, tokens and spend (micro-units) of one key or one model over the period."""

    name: str
    requests: int
    tokens: int
    cost_micros: int


@dataclass(frozen=True)
class UsageSummary:
    period: Period
    start: datetime
    end: datetime
    buckets: list[Bucket]
    totals: Figures
    errors: list[ErrorCount]
    by_key: list[Spend] = field(default_factory=list)  # most spent first
    by_model: list[Spend] = field(default_factory=list)


def as_utc(value: datetime) -> datetime:
    """SQLite hands timestamps back naive; they were written in UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def period_range(period: Period, now: datetime) -> tuple[datetime, datetime]:
    """The period's whole buckets, the last one holding `now`."""
    width = int(period.width.total_seconds())
    at = epoch_s(now)
    last = at - at % width
    start = datetime.fromtimestamp(last - (period.buckets - 1) * width, UTC)
    return start, start + period.length


def _figures(totals: Totals) -> Figures:
    return Figures(
        requests=totals.requests,
        errors=totals.errors,
        prompt_tokens=totals.prompt_tokens,
        completion_tokens=totals.completion_tokens,
        cost_micros=totals.cost_micros,
        ttft_n=totals.ttft_n,
        ttft={q: totals.ttft(q) for q in QUANTILES},
    )


class UsageStatsRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def summary(self, tenant_id: int, period: Period, *, now: datetime | None = None) -> UsageSummary:
        start, end = period_range(period, now or datetime.now(UTC))
        series = await usage_series(self.session, tenant_id, start, end, period.width)
        per_bucket = [Totals() for _ in range(period.buckets)]
        overall = Totals()
        for row in series:
            index = int((row.start - start) / period.width)
            per_bucket[min(max(index, 0), period.buckets - 1)].add(row.totals)
            overall.add(row.totals)
        errors = [
            ErrorCount(int(g["status"]), g["error_code"] or "-", t.requests)
            for g, t in await top_groups(self.session, tenant_id, start, end, ("status", "error_code"), failed=True)
        ]
        errors.sort(key=lambda e: (-e.requests, e.status, e.code))
        return UsageSummary(
            period=period,
            start=start,
            end=end,
            buckets=[Bucket(start + i * period.width, _figures(t)) for i, t in enumerate(per_bucket)],
            totals=_figures(overall),
            errors=errors,
            by_key=await self._spend(tenant_id, start, end, "key"),
            by_model=await self._spend(tenant_id, start, end, "model"),
        )

    async def _spend(self, tenant_id: int, start: datetime, end: datetime, by: str) -> list[Spend]:
        """The TOP_GROUPS keys (or models) that spent most, then most tokens."""
        found = await top_groups(self.session, tenant_id, start, end, (by,), limit=TOP_GROUPS)
        return [
            Spend(
                "-" if g[by] is None else str(g[by]), t.requests, t.prompt_tokens + t.completion_tokens, t.cost_micros
            )
            for g, t in found
        ]

    async def stream_rows(
        self, tenant_id: int, start: datetime, end: datetime, *, chunk: int = 1000
    ) -> AsyncIterator[Sequence[Any]]:
        """The tenant's rows in (created_at, id) order, `chunk` at a time from a server-side
        cursor (asyncpg; aiosqlite fetches in chunks too): memory stays flat whatever the count."""
        stmt = (
            select(*(UsageRecord.__table__.c[name] for name in EXPORT_COLUMNS))
            .where(UsageRecord.tenant_id == tenant_id, UsageRecord.created_at >= start, UsageRecord.created_at < end)
            .order_by(UsageRecord.created_at, UsageRecord.id)
            .execution_options(yield_per=chunk)
        )
        result = await self.session.stream(stmt)
        async for part in result.partitions():
            yield part


EXPORT_COLUMNS = (
    "id",
    "created_at",
    "request_id",
    "api_key_id",
    "model",
    "deployment",
    "lane",
    "endpoint",
    "end_user",
    "stream",
    "status",
    "finish_reason",
    "error_code",
    "prompt_tokens",
    "completion_tokens",
    "queue_ms",
    "ttft_ms",
    "total_ms",
    "cost_micros",
)
