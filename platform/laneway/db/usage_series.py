"""Usage read from the rollups (db/rollups.py): the one service every usage view calls.

- `usage_series`: figures per time bucket (and per group: model, key, lane, ...), summed from
  the coarsest rollup width that tiles the buckets: a 12-month page sums days, not rows.
- `exact_totals`: tokens and cost over an arbitrary [since, before) to the microsecond, for the
  quota and budget counters' recovery: whole days, hours and minutes from the rollups, and only
  the less-than-a-minute edges from the raw rows (on the (tenant_id, created_at) index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, case, false, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.db.models import UsageRecord
from laneway.db.rollups import DAY, HIST_COLUMNS, HOUR, MINUTE, epoch_s, percentile, totals_tier, usage_rollups

# group_by names (the usage API's and the pages') -> rollup columns.
GROUP_COLUMNS = {
    "tenant": "tenant_id",
    "key": "api_key_id",
    "model": "model",
    "lane": "lane",
    "deployment": "deployment",
    "status": "status",
    "error_code": "error_code",
}
_UNSET = {"tenant_id": 0, "api_key_id": 0, "lane": "", "deployment": "", "error_code": ""}


@dataclass
class Totals:
    requests: int = 0
    errors: int = 0  # status >= 400
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micros: int = 0
    ttft_n: int = 0
    ttft_sum_ms: float = 0.0
    ttft_hist: list[int] = field(default_factory=lambda: [0] * len(HIST_COLUMNS))

    def add(self, other: Totals) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost_micros += other.cost_micros
        self.ttft_n += other.ttft_n
        self.ttft_sum_ms += other.ttft_sum_ms
        self.ttft_hist = [a + b for a, b in zip(self.ttft_hist, other.ttft_hist, strict=True)]

    def ttft(self, q: float) -> float | None:
        """TTFT's q-quantile in ms, from the histogram (within one bucket, about +-15%)."""
        return percentile(self.ttft_hist, q)


@dataclass(frozen=True)
class SeriesRow:
    start: datetime  # the bucket's start
    group: dict[str, Any]  # group_by name -> value (None: unset)
    totals: Totals


# group_by names the tenant-totals tier holds (db/rollups.py): a view grouped by nothing else
# reads it, a few rows a bucket instead of one per key, model, lane and deployment.
_TOTALS_GROUPS = {"tenant", "model", "status", "error_code"}


def tier(width: int, group_by: Sequence[str], key_id: int | None = None) -> int:
    """The width_s to read: the tenant-totals tier where it holds what is asked."""
    return totals_tier(width) if key_id is None and set(group_by) <= _TOTALS_GROUPS else width


def source_width(bucket_s: int, start_s: int) -> int:
    """The coarsest rollup width whose buckets tile `bucket_s`-wide buckets from start_s."""
    for width in (DAY, HOUR, MINUTE):
        if bucket_s % width == 0 and start_s % width == 0:
            return width
    raise ValueError(f"a bucket of {bucket_s} s from {start_s} is not whole minutes")


def _sums(*, histogram: bool = True) -> list[ColumnElement[Any]]:
    """The summed figures; without the histogram (32 columns), a third of the work."""
    c = usage_rollups.c
    failed = func.sum(case((c.status >= 400, c.requests), else_=0))
    columns = [c.requests, c.prompt_tokens, c.completion_tokens, c.cost_micros, c.ttft_n, c.ttft_sum_ms]
    hist = [func.sum(c[h]) for h in HIST_COLUMNS] if histogram else []
    return [func.sum(c.requests), failed, *(func.sum(col) for col in columns[1:]), *hist]


def _totals(values: Sequence[Any]) -> Totals:
    requests, errors, prompt, completion, cost, ttft_n, ttft_sum, *hist = values
    return Totals(
        int(requests or 0),
        int(errors or 0),
        int(prompt or 0),
        int(completion or 0),
        int(cost or 0),
        int(ttft_n or 0),
        float(ttft_sum or 0.0),
        [int(h or 0) for h in hist] if hist else [0] * len(HIST_COLUMNS),
    )


async def usage_series(
    session: AsyncSession,
    tenant_id: int | None,
    start: datetime,
    end: datetime,
    bucket: timedelta,
    group_by: Sequence[str] = (),
    *,
    key_id: int | None = None,
) -> list[SeriesRow]:
    """Usage per `bucket`-wide time bucket from `start` (aligned down to a whole bucket) to
    `end`, per distinct `group_by` values (GROUP_COLUMNS), of one tenant (None: all) or one key.
    Only buckets with usage are returned, in time order, then by group. Its cost grows with the
    buckets and groups returned, never with the raw rows."""
    bucket_s = int(bucket.total_seconds())
    start_s = epoch_s(start)
    start_s -= start_s % min(bucket_s, DAY)
    width = source_width(bucket_s, start_s)
    c = usage_rollups.c
    index = ((c.bucket_s - start_s) // bucket_s).label("bucket_index")  # whole buckets, on both databases
    groups = [c[GROUP_COLUMNS[name]] for name in group_by]
    where = [c.width_s == tier(width, group_by, key_id), c.bucket_s >= start_s, c.bucket_s < epoch_s(end)]
    if tenant_id is not None:
        where.append(c.tenant_id == tenant_id)
    if key_id is not None:
        where.append(c.api_key_id == key_id)
    stmt = select(index, *groups, *_sums()).where(*where).group_by(index, *groups).order_by(index, *groups)
    rows = []
    for found in (await session.execute(stmt)).all():
        at = datetime.fromtimestamp(start_s + int(found[0]) * bucket_s, UTC)
        values = found[1 : 1 + len(groups)]
        rows.append(SeriesRow(at, _group(group_by, values), _totals(found[1 + len(groups) :])))
    return rows


def cover(lo: float, hi: float, widths: tuple[int, ...] = (DAY, HOUR, MINUTE)) -> list[tuple[int, float, float]]:
    """[lo, hi) as (width, from, to) segments: whole buckets of the widest width that fits,
    narrower ones at the edges, and width 0 (raw rows) for what is left of a minute."""
    if lo >= hi:
        return []
    if not widths:
        return [(0, lo, hi)]
    w = widths[0]
    a, b = -(-lo // w) * w, hi // w * w
    if a >= b:
        return cover(lo, hi, widths[1:])
    return [*cover(lo, a, widths[1:]), (w, a, b), *cover(b, hi, widths[1:])]


async def exact_totals(
    session: AsyncSession,
    since: datetime,
    before: datetime | None = None,
    *,
    tenant_id: int | None = None,
    key_id: int | None = None,
    by_key: bool = True,
) -> dict[tuple[int, int | None], tuple[int, int]]:
    """(tokens, cost micros) per (tenant, key) of the usage created in [since, before) (before
    None: up to now), exact to the row. `by_key` False: per tenant only (key None), from the
    tenant-totals tier."""
    hi = before.timestamp() if before is not None else (epoch_s(datetime.now(UTC)) // DAY + 1) * DAY
    out: dict[tuple[int, int | None], tuple[int, int]] = {}

    def take(tenant: Any, key: Any, tokens: Any, cost: Any) -> None:
        if not tenant:  # usage of no tenant: nobody's quota
            return
        slot = (int(tenant), int(key) if key and (by_key or key_id is not None) else None)
        t, m = out.get(slot, (0, 0))
        out[slot] = (t + int(tokens or 0), m + int(cost or 0))

    for width, lo, to in cover(since.timestamp(), hi):
        if width:
            r = usage_rollups.c
            read = width if by_key or key_id is not None else totals_tier(width)
            where: list[ColumnElement[bool]] = [r.width_s == read, r.bucket_s >= int(lo), r.bucket_s < int(to)]
            by: list[Any] = [r.tenant_id, r.api_key_id]
            tokens: Any = func.sum(r.prompt_tokens + r.completion_tokens)
            cost: Any = func.sum(r.cost_micros)
        else:
            u = UsageRecord
            lo_at, to_at = datetime.fromtimestamp(lo, UTC), datetime.fromtimestamp(to, UTC)
            where = [u.created_at >= lo_at, u.created_at < to_at]
            by = [u.tenant_id, u.api_key_id]
            tokens = func.sum(u.prompt_tokens + u.completion_tokens)
            cost = func.sum(u.cost_micros)
        if tenant_id is not None:
            where.append(by[0] == tenant_id)
        if key_id is not None:
            where.append(by[1] == key_id)
        for found in (await session.execute(select(*by, tokens, cost).where(and_(*where)).group_by(*by))).all():
            take(found[0], found[1], found[2], found[3])
    return out


def _covered(start: datetime, end: datetime, group_by: Sequence[str]) -> ColumnElement[bool]:
    """Rollup rows that tile [start, end) exactly (whole minutes; the coarsest widths that fit),
    in the tier that holds group_by."""
    c = usage_rollups.c
    parts = [
        and_(c.width_s == tier(width, group_by), c.bucket_s >= int(lo), c.bucket_s < int(hi))
        for width, lo, hi in cover(float(epoch_s(start)), float(epoch_s(end)))
        if width
    ]
    return or_(*parts) if parts else false()


async def top_groups(
    session: AsyncSession,
    tenant_id: int | None,
    start: datetime,
    end: datetime,
    group_by: Sequence[str],
    *,
    limit: int | None = None,
    failed: bool = False,
) -> list[tuple[dict[str, Any], Totals]]:
    """Totals over [start, end) per distinct `group_by` values, most spent (then most tokens)
    first, at most `limit` of them; `failed`: only requests that failed (status >= 400).
    Without TTFT histograms (the totals' ttft() is None)."""
    c = usage_rollups.c
    groups = [c[GROUP_COLUMNS[name]] for name in group_by]
    where = [_covered(start, end, group_by)]
    if tenant_id is not None:
        where.append(c.tenant_id == tenant_id)
    if failed:
        where.append(c.status >= 400)
    sums = _sums(histogram=False)  # totals per group, no percentiles: a third of the work
    order = [sums[4].desc(), (sums[2] + sums[3]).desc(), *groups]
    stmt = select(*groups, *sums).where(*where).group_by(*groups).order_by(*order)
    if limit is not None:
        stmt = stmt.limit(limit)
    out = []
    for found in (await session.execute(stmt)).all():
        values = found[: len(groups)]
        out.append((_group(group_by, values), _totals(found[len(groups) :])))
    return out


def _group(group_by: Sequence[str], values: Sequence[Any]) -> dict[str, Any]:
    return {
        name: (None if value == _UNSET.get(GROUP_COLUMNS[name], object()) else value)
        for name, value in zip(group_by, values, strict=True)
    }


async def raw_gone_before(session: AsyncSession, tenant_id: int, start: datetime) -> datetime | None:
    """Where the tenant's raw rows since `start` now begin, when the rollups hold usage from
    before it (the raw rows past retention were dropped; their rollups remain); None when
    every row of the period is still there."""
    oldest = (
        await session.execute(
            select(func.min(UsageRecord.created_at)).where(
                UsageRecord.tenant_id == tenant_id, UsageRecord.created_at >= start
            )
        )
    ).scalar()
    upto = epoch_s(oldest if oldest is not None else datetime.now(UTC))
    upto -= upto % MINUTE  # whole minutes: the rollups' finest
    if upto <= epoch_s(start):
        return None
    earlier = await top_groups(session, tenant_id, start, datetime.fromtimestamp(upto, UTC), ("tenant",))
    if not any(totals.requests for _, totals in earlier):
        return None
    return datetime.fromtimestamp(upto, UTC) if oldest is None else oldest.replace(tzinfo=oldest.tzinfo or UTC)
