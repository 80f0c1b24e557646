"""Usage rollups on SQLite and PostgreSQL: they hold what the raw rows hold (per tenant and day,
per minute and hour), two recorders adding to the same buckets at once lose nothing, the exact
totals behind quota recovery match the rows at any cut, the migration builds them from rows
already there (and on PostgreSQL partitions the raw table, both ways without losing a row), and
retention drops raw days while the rollups' totals stay."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from laneway.db import migrate
from laneway.db.models import UsageRecord
from laneway.db.repositories import UsageRepository
from laneway.db.session import make_engine, make_sessionmaker
from laneway.db.usage_retention import drop_expired, ensure_partitions, is_partitioned, partitions
from laneway.db.usage_series import exact_totals, raw_gone_before, usage_series
from laneway.usage import UsageRecorder
from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

NOW = datetime.now(UTC).replace(microsecond=0)


def _rows(rng: random.Random, n: int, *, days: int, tenants: int = 3) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        status, code = rng.choice([(200, None)] * 8 + [(429, "rate_limit_exceeded"), (503, "queue_full")])
        out.append(
            {
                "request_id": f"r{i}-{rng.random()}",
                "created_at": NOW - timedelta(seconds=rng.uniform(0, days * 86400)),
                "tenant_id": rng.randint(1, tenants),
                "api_key_id": rng.choice([None, 1, 2, 3]),
                "model": rng.choice(["m1", "m2"]),
                "lane": rng.choice([None, "interactive", "batch"]),
                "deployment": rng.choice([None, "d1"]),
                "endpoint": "chat",
                "stream": False,
                "status": status,
                "error_code": code,
                "prompt_tokens": rng.randint(0, 500),
                "completion_tokens": rng.randint(0, 200),
                "cost_micros": rng.choice([None, rng.randint(0, 9000)]),
                "ttft_ms": None if status != 200 else rng.uniform(1, 5000),
            }
        )
    return out


async def _raw_by_tenant_day(session: AsyncSession) -> dict[tuple[int, str], tuple[int, int, int, int]]:
    rows = (await session.execute(select(UsageRecord))).scalars().all()
    out: dict[tuple[int, str], tuple[int, int, int, int]] = {}
    for r in rows:
        at = r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=UTC)
        slot = (int(r.tenant_id or 0), f"{at.astimezone(UTC):%Y-%m-%d}")
        n, p, c, m = out.get(slot, (0, 0, 0, 0))
        out[slot] = (n + 1, p + r.prompt_tokens, c + r.completion_tokens, m + (r.cost_micros or 0))
    return out


async def _rolled_by_tenant_day(
    session: AsyncSession, tenants: int, days: int
) -> dict[tuple[int, str], tuple[int, int, int, int]]:
    out = {}
    for tenant in range(1, tenants + 1):
        # Both tiers: the tenant totals (no group) and the detail (by model, added up).
        for width, group_by in (
            (timedelta(days=1), ()),
            (timedelta(days=1), ("model",)),
            (timedelta(hours=1), ("lane",)),
            (timedelta(hours=1), ()),
            (timedelta(minutes=1), ()),
            (timedelta(minutes=1), ("key",)),
        ):
            per_day: dict[str, tuple[int, int, int, int]] = {}
            start = NOW - timedelta(days=days + 1)
            for row in await usage_series(session, tenant, start, NOW + timedelta(days=1), width, group_by):
                day = f"{row.start:%Y-%m-%d}"
                n, p, c, m = per_day.get(day, (0, 0, 0, 0))
                t = row.totals
                per_day[day] = (n + t.requests, p + t.prompt_tokens, c + t.completion_tokens, m + t.cost_micros)
            if width == timedelta(days=1) and not group_by:
                out.update({(tenant, day): v for day, v in per_day.items()})
            else:  # the finer widths add up to the same days
                assert per_day == {day: v for (t, day), v in out.items() if t == tenant}, (tenant, width, group_by)
    return out


async def test_rollup_totals_equal_raw_totals_per_tenant_and_day(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    rows = _rows(random.Random(40), 1500, days=6)
    for i in range(0, len(rows), 200):  # several batches, as the recorder writes them
        async with sessions() as s, s.begin():
            await UsageRepository(s).add_many(rows[i : i + 200])
    async with sessions() as s:
        raw = await _raw_by_tenant_day(s)
        assert await _rolled_by_tenant_day(s, 3, 6) == raw
        errors = await usage_series(
            s, 1, NOW - timedelta(days=7), NOW + timedelta(days=1), timedelta(days=7), ["status", "error_code"]
        )
        by_code: dict[tuple[int, str | None], int] = {}
        for found in errors:  # two 7-day buckets: add them up
            slot = (found.group["status"], found.group["error_code"])
            by_code[slot] = by_code.get(slot, 0) + found.totals.requests
        want: dict[tuple[int, str | None], int] = {}
        for r in rows:
            if r["tenant_id"] == 1:
                slot = (int(r["status"]), r["error_code"])
                want[slot] = want.get(slot, 0) + 1
        assert by_code == want


async def test_exact_totals_match_the_rows_at_any_cut(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    rng = random.Random(3)
    rows = _rows(rng, 800, days=3, tenants=2)
    async with sessions() as s, s.begin():
        await UsageRepository(s).add_many(rows)
    for _ in range(6):
        since = NOW - timedelta(seconds=rng.uniform(0, 3 * 86400))
        before = since + timedelta(seconds=rng.uniform(0, 2 * 86400))
        async with sessions() as s:
            got = await exact_totals(s, since, before, tenant_id=2)
        want: dict[tuple[int, int | None], tuple[int, int]] = {}
        for r in rows:
            if r["tenant_id"] == 2 and since <= r["created_at"] < before:
                slot = (2, r["api_key_id"])
                t, m = want.get(slot, (0, 0))
                want[slot] = (t + r["prompt_tokens"] + r["completion_tokens"], m + (r["cost_micros"] or 0))
        assert got == want, (since, before)
    async with sessions() as s:  # every tenant, up to now: the in-memory limiter's start
        everyone = await UsageRepository(s).tokens_since(NOW - timedelta(days=4))
    assert everyone == {
        t: sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows if r["tenant_id"] == t) for t in (1, 2)
    }


@pytest.mark.parametrize("db_engine", ["postgres"], indirect=True)
async def test_two_recorders_adding_to_the_same_buckets_lose_no_count(db_engine: AsyncEngine) -> None:
    """Two replicas (two engines, two pools) write rows of the same tenant, key, model and
    minute at once: every bucket's counts are the sum of both."""
    second = make_engine(
        db_engine.url.render_as_string(hide_password=False),
        connect_args={"server_settings": {"search_path": await _schema(db_engine)}},
    )
    recorders = [UsageRecorder(make_sessionmaker(e), interval_s=0.01, batch_size=50) for e in (db_engine, second)]
    try:
        rows = [_rows(random.Random(seed), 2000, days=0, tenants=1) for seed in (1, 2)]
        for recorder, mine in zip(recorders, rows, strict=True):
            for r in mine:
                r["created_at"] = NOW  # one minute: every write hits the same few buckets
                recorder.record(r)

        await asyncio.gather(*(r.flush() for r in recorders))
        assert all(r.pending == 0 for r in recorders)
        async with make_sessionmaker(db_engine)() as s:
            series = await usage_series(
                s, 1, NOW - timedelta(minutes=1), NOW + timedelta(minutes=1), timedelta(minutes=1)
            )
            raw = (await s.execute(select(func.count(), func.sum(UsageRecord.prompt_tokens)))).one()
        assert sum(r.totals.requests for r in series) == 4000 == raw[0]
        assert sum(r.totals.prompt_tokens for r in series) == raw[1]
    finally:
        await second.dispose()


async def _schema(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        return str((await conn.execute(text("SELECT current_schema()"))).scalar())


async def test_upgrade_builds_rollups_from_existing_rows_and_downgrade_keeps_them(db_engine: AsyncEngine) -> None:
    await migrate.downgrade(db_engine, "0015")
    rows = _rows(random.Random(9), 600, days=120)
    async with db_engine.begin() as conn:
        await conn.execute(insert(UsageRecord.__table__), rows)
    await migrate.upgrade(db_engine)
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s:
        raw = await _raw_by_tenant_day(s)
        assert await _rolled_by_tenant_day(s, 3, 120) == raw
        if db_engine.dialect.name == "postgresql":
            assert await is_partitioned(s)
            names = await partitions(s)
            assert "usage_records_pdefault" in names and len(names) > 120
    await migrate.downgrade(db_engine, "0015")
    async with sessions() as s:
        assert (await s.execute(select(func.count()).select_from(UsageRecord))).scalar() == 600
    await migrate.upgrade(db_engine)
    async with sessions() as s:
        assert await _raw_by_tenant_day(s) == raw
        assert await _rolled_by_tenant_day(s, 3, 120) == raw


async def test_retention_drops_expired_days_and_the_rollups_remain(db_engine: AsyncEngine) -> None:
    await migrate.downgrade(db_engine, "0015")
    rows = _rows(random.Random(5), 400, days=200)
    async with db_engine.begin() as conn:
        await conn.execute(insert(UsageRecord.__table__), rows)
    await migrate.upgrade(db_engine)
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s:
        before = await usage_series(s, None, NOW - timedelta(days=210), NOW + timedelta(days=1), timedelta(days=30))
    async with sessions() as s:
        assert await raw_gone_before(s, 1, NOW - timedelta(days=210)) is None  # every row still there
    async with sessions() as s, s.begin():
        today = datetime.now(UTC)  # the migration's day (not NOW's, should midnight have passed since)
        assert await ensure_partitions(s, now=today, ahead_days=9) == (
            [f"usage_records_p{today + timedelta(days=n):%Y%m%d}" for n in (8, 9)]
            if db_engine.dialect.name == "postgresql"
            else []
        )
        result = await drop_expired(s, raw_days=90, rollup_days=730, now=today)
    cut = (today - timedelta(days=90)).replace(hour=0, minute=0, second=0, microsecond=0)
    kept = [r for r in rows if r["created_at"] >= cut]
    async with sessions() as s:
        assert (await s.execute(select(func.count()).select_from(UsageRecord))).scalar() == len(kept)
        after = await usage_series(s, None, NOW - timedelta(days=210), NOW + timedelta(days=1), timedelta(days=30))
        gone = await raw_gone_before(s, 1, NOW - timedelta(days=210))
    assert gone is not None and gone >= cut  # the export can say the raw rows before are gone
    assert [(r.start, r.totals.requests, r.totals.cost_micros) for r in after] == [
        (r.start, r.totals.requests, r.totals.cost_micros) for r in before
    ]
    if db_engine.dialect.name == "postgresql":
        assert len(result.dropped_partitions) >= 100 and result.deleted_rows == 0
    else:
        assert result.deleted_rows == len(rows) - len(kept)
