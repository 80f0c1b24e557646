"""Usage rollups: every usage row is also added, in the same transaction, to one bucket per
width (a minute, an hour, a day) keyed by tenant, key, model, lane, deployment, status and error
code. Pages, the usage API and the quota counters' recovery sum buckets, so what they cost grows
with the buckets shown, not with the rows (docs/decisions/0012-usage-rollups.md).

Two gateway replicas may add to the same bucket at once: the write is one
`INSERT ... ON CONFLICT DO UPDATE SET n = n + excluded.n`, which the database applies under the
row's lock, so neither count is lost. Buckets are written in key order: two writers lock rows
in the same order and never deadlock each other.

Unset dimensions are stored as 0 or '' (a NULL never conflicts with itself, so it cannot be part
of the conflict target); readers turn them back into None.

Two tiers in one table, told apart by the sign of width_s:
- detail (width_s > 0): every dimension, for the views grouped by key, model, lane, deployment;
- tenant totals (width_s = -width): only tenant, model, status and error code (key 0, lane and
  deployment ''), for the series, totals and per-model figures of a tenant: a 30-day page reads
  30 days x a few models and statuses, not 30 days x every key, lane and deployment it used.
Each reader names its tier by width, so no row is ever counted twice.

TTFT is kept as a fixed-bucket histogram (TTFT_BOUNDS_MS, geometric, x1.35 from 4 ms): merging
two is adding columns, which the upsert already does, and percentiles read from it are within
one bucket's width (about +-15%) of the exact value.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, Column, Float, Index, Integer, PrimaryKeyConstraint, String, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.db.models import Base

MINUTE, HOUR, DAY = 60, 3600, 86400
WIDTHS = (MINUTE, HOUR, DAY)  # every row is added to one bucket of each, in both tiers


def totals_tier(width: int) -> int:
    """The width_s of the tenant-totals tier of a width."""
    return -width


TTFT_BOUNDS_MS = tuple(round(4.0 * 1.35**i, 3) for i in range(31))  # 4 ms .. ~32 s
HIST_COLUMNS = tuple(f"ttft_b{i:02d}" for i in range(len(TTFT_BOUNDS_MS) + 1))
KEY_COLUMNS = ("width_s", "tenant_id", "bucket_s", "api_key_id", "model", "lane", "deployment", "status", "error_code")
SUM_COLUMNS = ("requests", "prompt_tokens", "completion_tokens", "cost_micros", "ttft_n", "ttft_sum_ms", *HIST_COLUMNS)

usage_rollups = Table(
    "usage_rollups",
    Base.metadata,
    Column("width_s", Integer, nullable=False),
    Column("tenant_id", Integer, nullable=False),  # 0: none
    Column("bucket_s", BigInteger, nullable=False),  # the bucket's start, Unix seconds (UTC)
    Column("api_key_id", Integer, nullable=False),  # 0: none
    Column("model", String(200), nullable=False),
    Column("lane", String(60), nullable=False),  # '': none
    Column("deployment", String(200), nullable=False),
    Column("status", Integer, nullable=False),
    Column("error_code", String(60), nullable=False),
    Column("requests", BigInteger, nullable=False),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("cost_micros", BigInteger, nullable=False),
    Column("ttft_n", BigInteger, nullable=False),
    Column("ttft_sum_ms", Float, nullable=False),
    *(Column(name, BigInteger, nullable=False) for name in HIST_COLUMNS),
    PrimaryKeyConstraint(*KEY_COLUMNS, name="pk_usage_rollups"),
    # Every tenant at once (the in-memory limiter's start, retention): by width and time.
    Index("ix_usage_rollups_width_bucket", "width_s", "bucket_s"),
)


def epoch_s(at: datetime) -> int:
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at
    return int(at.timestamp() // 1)


def ttft_bucket(ttft_ms: float) -> int:
    for i, bound in enumerate(TTFT_BOUNDS_MS):
        if ttft_ms < bound:
            return i
    return len(TTFT_BOUNDS_MS)


def _value_at(hist: Sequence[int], rank: int) -> float:
    """The rank-th smallest value (0-based), placed inside its bucket: the bucket's values
    spread evenly (geometrically; the first bucket, from 0, linearly)."""
    seen = 0
    for i, count in enumerate(hist):
        if rank < seen + count:
            frac = (rank - seen + 0.5) / count
            hi = TTFT_BOUNDS_MS[i] if i < len(TTFT_BOUNDS_MS) else TTFT_BOUNDS_MS[-1] * 1.35
            if i == 0:
                return hi * frac
            lo = TTFT_BOUNDS_MS[i - 1]
            return float(lo * (hi / lo) ** frac)
        seen += count
    return TTFT_BOUNDS_MS[-1]


def percentile(hist: Sequence[int], q: float) -> float | None:
    """The q-quantile of a histogram as percentile_cont computes it over the values (linear
    between the ranks floor(q(n-1)) and the next), each rank's value read from its bucket:
    within one bucket's width of the exact figure."""
    n = sum(hist)
    if n == 0:
        return None
    pos = q * (n - 1)
    lo = int(pos)
    low = _value_at(hist, lo)
    if lo + 1 >= n:
        return low
    return low + (pos - lo) * (_value_at(hist, lo + 1) - low)


def _keys(row: dict[str, Any], width: int, at_s: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The row's bucket in the detail tier and in the tenant-totals tier."""
    tenant, bucket = row.get("tenant_id") or 0, at_s - at_s % width
    status, code = int(row.get("status") or 0), row.get("error_code") or ""
    detail = (
        width,
        tenant,
        bucket,
        row.get("api_key_id") or 0,
        row.get("model") or "",
        row.get("lane") or "",
        row.get("deployment") or "",
        status,
        code,
    )
    return detail, (totals_tier(width), tenant, bucket, 0, detail[4], "", "", status, code)


def aggregate(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rollup buckets of raw usage rows (as the recorder writes them), one per key and
    width, in key order."""
    buckets: dict[tuple[Any, ...], list[Any]] = {}
    width_hist = len(SUM_COLUMNS) - len(HIST_COLUMNS)
    for row in rows:
        created = row.get("created_at") or datetime.now(UTC)
        at_s = epoch_s(created)
        ttft = row.get("ttft_ms")
        slot = None if ttft is None else width_hist + ttft_bucket(float(ttft))
        prompt, completion = int(row.get("prompt_tokens") or 0), int(row.get("completion_tokens") or 0)
        cost = int(row.get("cost_micros") or 0)
        for width in WIDTHS:
            for key in _keys(row, width, at_s):
                sums = buckets.setdefault(key, [0] * width_hist + [0] * len(HIST_COLUMNS))
                sums[0] += 1
                sums[1] += prompt
                sums[2] += completion
                sums[3] += cost
                if slot is not None:
                    sums[4] += 1
                    sums[5] += float(ttft)  # type: ignore[arg-type]
                    sums[slot] += 1
    return [
        dict(zip(KEY_COLUMNS, key, strict=True)) | dict(zip(SUM_COLUMNS, sums, strict=True))
        for key, sums in sorted(buckets.items())
    ]


async def add(session: AsyncSession, rows: Iterable[dict[str, Any]]) -> None:
    """Add raw usage rows to their buckets (in the caller's transaction)."""
    buckets = aggregate(rows)
    if not buckets:
        return
    bind = session.bind
    assert bind is not None, "the session must be bound to an engine"
    dialect = postgresql if bind.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(usage_rollups)
    excluded = stmt.excluded
    stmt = stmt.on_conflict_do_update(
        index_elements=list(KEY_COLUMNS),
        set_={name: usage_rollups.c[name] + excluded[name] for name in SUM_COLUMNS},
    )
    # An executemany of one cached statement: SQLAlchemy sends it as multi-row VALUES pages
    # (insertmanyvalues). Building a VALUES list per batch instead compiled a new statement of
    # ~20,000 parameters every time (1.6 s for 500 rows' buckets, measured).
    await session.execute(stmt, buckets)
