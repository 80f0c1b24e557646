"""The usage page, summed from the rollups on SQLite and PostgreSQL: per-bucket counts, errors by
code and TTFT percentiles from the histograms (within one histogram bucket of a Python oracle's
exact value); the CSV rows' order."""

from __future__ import annotations

import random
import statistics
from datetime import UTC, datetime, timedelta

from laneway.db import migrate
from laneway.db.repositories import TenantRepository, UsageRepository
from laneway.db.session import make_sessionmaker
from laneway.db.usage_stats import PERIODS, QUANTILES, UsageStatsRepository, period_range
from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncEngine

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)


def _row(tenant_id: int, at: datetime, **fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "request_id": f"r{random.random()}",
        "created_at": at,
        "tenant_id": tenant_id,
        "model": "m",
        "endpoint": "chat",
        "status": 200,
        "prompt_tokens": 3,
        "completion_tokens": 5,
        "ttft_ms": None,
    }
    return {**base, **fields}


def _oracle(values: list[float]) -> dict[float, float]:
    """percentile_cont: linear between closest ranks (statistics' 'inclusive' method)."""
    if len(values) == 1:
        return dict.fromkeys(QUANTILES, values[0])
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {q: cuts[round(q * 100) - 1] for q in QUANTILES}


def _close(got: float | None, want: float) -> bool:
    """Within one histogram bucket (x1.35) of the exact value."""
    return got is not None and want / 1.35 <= got <= want * 1.35


async def test_summary_buckets_errors_and_exact_percentiles(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    rng = random.Random(7)
    async with sessions() as s, s.begin():
        acme = (await TenantRepository(s).create("acme")).id
        other = (await TenantRepository(s).create("other")).id
    period = PERIODS["day"]  # 24 whole hours, the last one holding NOW
    start, end = period_range(period, NOW)
    assert start == NOW - timedelta(hours=23) and end == NOW + timedelta(hours=1)
    rows: list[dict[str, object]] = []
    ttft_by_bucket: dict[int, list[float]] = {}
    for i in range(300):
        bucket = rng.choice([0, 3, 3, 17, 23])
        at = start + bucket * period.width + timedelta(seconds=rng.uniform(0, 3599))
        ttft = round(rng.uniform(5, 900), 3) if i % 7 else None
        status, code = (
            (429, "rate_limit_exceeded") if i % 11 == 0 else (503, "queue_full") if i % 13 == 0 else (200, None)
        )
        rows.append(_row(acme, at, ttft_ms=ttft, status=status, error_code=code, prompt_tokens=i, completion_tokens=2))
        if ttft is not None:
            ttft_by_bucket.setdefault(bucket, []).append(ttft)
    # Outside the period or another tenant's: never counted.
    rows += [
        _row(acme, start - timedelta(seconds=1), ttft_ms=1.0),
        _row(acme, end, ttft_ms=1.0),
        _row(other, NOW - timedelta(minutes=5), ttft_ms=1.0),
    ]
    async with sessions() as s, s.begin():
        await UsageRepository(s).add_many(rows)

    async with sessions() as s:
        summary = await UsageStatsRepository(s).summary(acme, period, now=NOW)
    mine = rows[:300]
    assert summary.totals.requests == 300
    assert summary.totals.prompt_tokens == sum(range(300)) and summary.totals.completion_tokens == 600
    assert summary.totals.errors == sum(1 for r in mine if int(r["status"]) >= 400)  # type: ignore[call-overload]
    assert [(e.status, e.code) for e in summary.errors] == [(429, "rate_limit_exceeded"), (503, "queue_full")]
    assert sum(e.requests for e in summary.errors) == summary.totals.errors
    assert len(summary.buckets) == 24 and summary.buckets[0].start == start
    assert sum(b.figures.requests for b in summary.buckets) == 300
    assert {i for i, b in enumerate(summary.buckets) if b.figures.requests} == {0, 3, 17, 23}
    for index, values in ttft_by_bucket.items():
        got = summary.buckets[index].figures
        assert got.ttft_n == len(values)
        for q, want in _oracle(values).items():
            assert _close(got.ttft[q], want), (index, q, got.ttft[q], want)
    everything = [v for vs in ttft_by_bucket.values() for v in vs]
    for q, want in _oracle(everything).items():
        assert _close(summary.totals.ttft[q], want), (q, summary.totals.ttft[q], want)
    assert summary.buckets[1].figures.ttft[0.5] is None  # an empty bucket has no percentile


async def test_one_row_and_an_empty_period(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        tid = (await TenantRepository(s).create("solo")).id
        await UsageRepository(s).add_many([_row(tid, NOW - timedelta(minutes=1), ttft_ms=42.5)])
    async with sessions() as s:
        stats = UsageStatsRepository(s)
        hour = await stats.summary(tid, PERIODS["hour"], now=NOW)
        assert hour.totals.requests == 1 and all(_close(v, 42.5) for v in hour.totals.ttft.values())
        assert hour.buckets[-2].figures.requests == 1  # the last bucket holds NOW (12:00): 11:59 is the one before
        empty = await stats.summary(tid, PERIODS["hour"], now=NOW + timedelta(days=2))
        assert empty.totals.requests == 0 and empty.errors == [] and empty.totals.ttft[0.99] is None


async def test_export_streams_in_time_order_and_the_index_serves_it(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        tid = (await TenantRepository(s).create("exp")).id
        # Written out of time order, as batches from several replicas are.
        await UsageRepository(s).add_many(
            [_row(tid, NOW - timedelta(seconds=n), request_id=f"r{n}") for n in range(25)]
        )
    async with sessions() as s:
        parts = [
            list(p)
            async for p in UsageStatsRepository(s).stream_rows(
                tid, NOW - timedelta(hours=1), NOW + timedelta(seconds=1), chunk=10
            )
        ]
    assert [len(p) for p in parts] == [10, 10, 5]
    assert [r.request_id for p in parts for r in p] == [f"r{n}" for n in range(24, -1, -1)]

    async with db_engine.connect() as conn:
        indexes = await conn.run_sync(lambda c: inspect(c).get_indexes("usage_records"))
    by_name = {i["name"]: i["column_names"] for i in indexes}
    assert by_name.get("ix_usage_tenant_created_id") == ["tenant_id", "created_at", "id"]
    assert "ix_usage_tenant_created" not in by_name  # replaced, not doubled
    await migrate.downgrade(db_engine, "0004")
    async with db_engine.connect() as conn:
        indexes = await conn.run_sync(lambda c: inspect(c).get_indexes("usage_records"))
    assert {i["name"] for i in indexes} == {"ix_usage_tenant_created"}
