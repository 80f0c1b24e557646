"""A tenant's usage over a period, aggregated in SQL: the admin UI's usage page and CSV export.

Every figure is computed by the database over the index (tenant_id, created_at, id), never by
loading rows into Python: GROUP BY a time-bucket number for the per-bucket series, GROUP BY
(status, error_code) for the errors. TTFT percentiles are exact and mean the same on both
databases (percentile_cont, linear interpolation between the two nearest ranks):
- PostgreSQL: percentile_cont(q) WITHIN GROUP (ORDER BY ttft_ms), per bucket and overall in
  one query (GROUP BY ROLLUP);
- SQLite has no ordered-set aggregates: row_number() and count() over a window per bucket,
  keeping only the (at most two) rows around each wanted rank; the interpolation between
  them is done here. At most 6 rows per bucket leave the database.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Integer, and_, case, cast, func, literal, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.db.models import UsageRecord

QUANTILES = (0.5, 0.95, 0.99)
# Julian day of the Unix epoch: SQLite's julianday() -> seconds since the epoch.
_UNIX_EPOCH_JD = 2440587.5


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


def interpolate(ranked: dict[int, float], n: int, q: float) -> float | None:
    """percentile_cont over n sorted values, from the values at ranks floor(q(n-1)) and the next."""
    if n == 0:
        return None
    pos = q * (n - 1)
    lo = int(pos)  # the same double arithmetic as SQLite's CAST(q * (n - 1) AS INTEGER)
    low = ranked[lo]
    if lo + 1 >= n:
        return low
    return low + (pos - lo) * (ranked[lo + 1] - low)


class UsageStatsRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    @property
    def _dialect(self) -> str:
        bind = self.session.bind
        assert bind is not None, "the session must be bound to an engine"
        return str(bind.dialect.name)

    def _in_range(self, tenant_id: int, start: datetime, end: datetime) -> ColumnElement[bool]:
        return and_(UsageRecord.tenant_id == tenant_id, UsageRecord.created_at >= start, UsageRecord.created_at < end)

    def _bucket(self, start: datetime, width: timedelta) -> ColumnElement[int]:
        """The bucket number of a row: whole widths between the period's start and created_at."""
        width_s = width.total_seconds()
        if self._dialect == "postgresql":
            seconds: Any = func.extract("epoch", UsageRecord.created_at) - start.timestamp()
            return cast(func.floor(seconds / width_s), Integer)
        # SQLite stores the UTC wall time as text; julianday() parses it. The CAST truncates,
        # which is floor for the non-negative offsets the range filter leaves.
        seconds = (func.julianday(UsageRecord.created_at) - _UNIX_EPOCH_JD) * 86400.0 - start.timestamp()
        return cast(seconds / width_s, Integer)

    async def summary(self, tenant_id: int, period: Period, *, now: datetime | None = None) -> UsageSummary:
        end = now or datetime.now(UTC)
        start = end - period.length
        in_range = self._in_range(tenant_id, start, end)
        bucket = self._bucket(start, period.width).label("bucket")
        failed = UsageRecord.status >= 400

        buckets = [Figures() for _ in range(period.buckets)]
        totals = Figures()
        counts = (
            select(
                bucket,
                func.count(),
                func.coalesce(func.sum(case((failed, 1), else_=0)), 0),
                func.coalesce(func.sum(UsageRecord.prompt_tokens), 0),
                func.coalesce(func.sum(UsageRecord.completion_tokens), 0),
                func.coalesce(func.sum(UsageRecord.cost_micros), 0),
            )
            .where(in_range)
            .group_by(bucket)
        )
        for b, requests, errors, prompt, completion, cost in (await self.session.execute(counts)).all():
            for target in (buckets[_clamp(b, period.buckets)], totals):
                target.requests += int(requests)
                target.errors += int(errors)
                target.prompt_tokens += int(prompt)
                target.completion_tokens += int(completion)
                target.cost_micros += int(cost)

        by_code = (
            select(UsageRecord.status, UsageRecord.error_code, func.count().label("n"))
            .where(in_range, failed)
            .group_by(UsageRecord.status, UsageRecord.error_code)
            .order_by(func.count().desc(), UsageRecord.status)
        )
        errors = [ErrorCount(int(s), code or "-", int(n)) for s, code, n in (await self.session.execute(by_code)).all()]

        timed = and_(in_range, UsageRecord.ttft_ms.is_not(None))
        if self._dialect == "postgresql":
            await self._percentiles_pg(timed, bucket, buckets, totals, period.buckets)
        else:
            await self._percentiles_portable(timed, bucket, buckets, period.buckets)
            await self._percentiles_portable(timed, None, [totals], 1)
        return UsageSummary(
            period=period,
            start=start,
            end=end,
            buckets=[Bucket(start + i * period.width, f) for i, f in enumerate(buckets)],
            totals=totals,
            errors=errors,
            by_key=await self._spend(in_range, UsageRecord.api_key_id),
            by_model=await self._spend(in_range, UsageRecord.model),
        )

    async def _spend(self, in_range: ColumnElement[bool], by: Any) -> list[Spend]:
        """Spend grouped by a column (the key, the model asked for), most spent first."""
        cost = func.coalesce(func.sum(UsageRecord.cost_micros), 0)
        tokens = func.coalesce(func.sum(UsageRecord.prompt_tokens + UsageRecord.completion_tokens), 0)
        stmt = select(by, func.count(), tokens, cost).where(in_range).group_by(by).order_by(cost.desc(), by)
        rows = (await self.session.execute(stmt)).all()
        return [Spend("-" if name is None else str(name), int(n), int(t), int(c)) for name, n, t, c in rows]

    async def _percentiles_pg(
        self, timed: ColumnElement[bool], bucket: Any, buckets: list[Figures], totals: Figures, n_buckets: int
    ) -> None:
        stmt = (
            select(
                bucket,
                func.count(UsageRecord.ttft_ms),
                *(func.percentile_cont(q).within_group(UsageRecord.ttft_ms) for q in QUANTILES),
            )
            .where(timed)
            .group_by(func.rollup(bucket))  # the row with bucket NULL: the whole period
        )
        for b, n, *values in (await self.session.execute(stmt)).all():
            if not n:  # ROLLUP's grand total over no rows
                continue
            target = totals if b is None else buckets[_clamp(b, n_buckets)]
            target.ttft_n = int(n)
            target.ttft = {q: float(v) for q, v in zip(QUANTILES, values, strict=True)}

    async def _percentiles_portable(
        self, timed: ColumnElement[bool], bucket: Any, targets: list[Figures], n_buckets: int
    ) -> None:
        # bucket None: the whole period as one partition (numbered 0).
        partition = [bucket] if bucket is not None else None
        ranked = (
            select(
                (bucket if bucket is not None else literal(0)).label("b"),
                UsageRecord.ttft_ms.label("v"),
                (func.row_number().over(partition_by=partition, order_by=UsageRecord.ttft_ms) - 1).label("rn"),
                func.count().over(partition_by=partition).label("n"),
            )
            .where(timed)
            .subquery()
        )
        near = []
        for q in QUANTILES:
            lo = cast(q * (ranked.c.n - 1), Integer)
            near += [ranked.c.rn == lo, ranked.c.rn == lo + 1]
        stmt = select(ranked.c.b, ranked.c.n, ranked.c.rn, ranked.c.v).where(or_(*near))
        found: dict[int, tuple[int, dict[int, float]]] = {}
        for b, n, rn, v in (await self.session.execute(stmt)).all():
            found.setdefault(_clamp(b, n_buckets), (int(n), {}))[1][int(rn)] = float(v)
        for index, (n, ranks) in found.items():
            target = targets[index]
            target.ttft_n = n
            target.ttft = {q: interpolate(ranks, n, q) for q in QUANTILES}

    async def stream_rows(
        self, tenant_id: int, start: datetime, end: datetime, *, chunk: int = 1000
    ) -> AsyncIterator[Sequence[Any]]:
        """The tenant's rows in (created_at, id) order, `chunk` at a time from a server-side
        cursor (asyncpg; aiosqlite fetches in chunks too): memory stays flat whatever the count."""
        stmt = (
            select(*(UsageRecord.__table__.c[name] for name in EXPORT_COLUMNS))
            .where(self._in_range(tenant_id, start, end))
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


def _clamp(b: Any, n: int) -> int:
    """Floating-point edges: a row at the very end of the period may compute as bucket n."""
    return min(max(int(b), 0), n - 1)
