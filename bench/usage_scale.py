"""Usage at scale on PostgreSQL: every usage view of the biggest tenant over 24 hours, 30 days and
12 months, read from the rollups, against a seeded database (issue 40).

Seeds a throwaway database (created and dropped here; never another's data) migrated to head:
- raw usage rows over the last `--days` days (day partitions), half of them one big tenant's,
  the rest spread over `--tenants` tenants, by INSERT ... SELECT FROM generate_series;
- their rollups built by migration 0016's own backfill SQL (minute, hour and day buckets);
- rollups for the months before (hour and day buckets, synthetic, generate_series) so the
  12-month views sum a year;
- `--keys` API keys in the big tenant.
Then times (p95 of `--loads` calls each, in-process, the service calls the handlers make):
the usage page summary (hour, day, 30d, 12m), the usage API (24 h by hour, 30 days by day, 12
months by day a page of 31 at a time, with group_by model and key), the keys list (first page,
a page deep, a search), the quota recovery (exact tokens and cost of this month), retention
(expired day partitions dropped; the rollups' totals before and after), the check that rollup
totals equal raw totals per tenant and day, and the recorder's sustained rows/s with rollups on
against the same recorder with them off (the baseline, same run, rounds interleaved).

    PYTHONPATH=platform .venv/bin/python bench/usage_scale.py --rows 2000000
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from laneway.db import migrate, rollups
from laneway.db.key_pages import key_page
from laneway.db.repositories import UsageRepository
from laneway.db.session import make_engine, make_sessionmaker
from laneway.db.usage_retention import drop_expired
from laneway.db.usage_stats import PERIODS, UsageStatsRepository
from laneway.usage import UsageRecorder
from laneway.usage.report import parse_query, usage_page
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

ROOT = Path(__file__).resolve().parents[1]
BIG = 1  # the big tenant's id


def _migration() -> Any:
    path = ROOT / "migrations" / "versions" / "0016_usage_rollups_and_partitions.py"
    spec = importlib.util.spec_from_file_location("m0016", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _sql(engine: AsyncEngine, sql: str, **params: Any) -> Any:
    async with engine.begin() as conn:
        return await conn.execute(text(sql), params)


async def seed(engine: AsyncEngine, args: argparse.Namespace, now: datetime) -> dict[str, float]:
    took: dict[str, float] = {}
    t0 = time.perf_counter()
    await _sql(
        engine,
        "INSERT INTO tenants (id, name, weight, priority_floor, disabled, created_at) "
        "SELECT g, 'tenant-' || g, 1.0, 0, false, now() FROM generate_series(1, :n) g",
        n=args.tenants,
    )
    await _sql(
        engine,
        "INSERT INTO api_keys (id, tenant_id, name, prefix, secret_sha256, created_at) "
        "SELECT g, CASE WHEN g <= :big THEN 1 ELSE 2 + (g % (:tenants - 1)) END, 'svc-' || g, 'lw-' || g, "
        "md5(g::text) || md5((g * 7)::text), now() FROM generate_series(1, :total) g",
        big=args.keys,
        tenants=args.tenants,
        total=args.keys + args.tenants * 2,
    )
    await _sql(engine, "SELECT setval('tenants_id_seq', :n)", n=args.tenants)
    await _sql(engine, "SELECT setval('api_keys_id_seq', :n)", n=args.keys + args.tenants * 2)
    took["tenants and keys"] = time.perf_counter() - t0
    migration = _migration()
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    for n in range(args.days + 1):
        await _sql(engine, migration.day_partition(today - timedelta(days=n)))
    t0 = time.perf_counter()
    span = args.days * 86400
    # Half the rows are the big tenant's; its traffic comes mostly from 50 keys, a little from
    # any of its keys; the rest are other tenants' (one key each).
    await _sql(
        engine,
        "INSERT INTO usage_records (request_id, created_at, tenant_id, api_key_id, model, deployment, lane, "
        "endpoint, stream, status, error_code, prompt_tokens, completion_tokens, ttft_ms, total_ms, tries, "
        "continuations, continued_prompt_tokens, cost_micros) "
        "SELECT 'r' || g, CAST(:now AS timestamptz) - make_interval(secs => ((g::bigint * 7919) % :span)::float8), "
        "CASE WHEN g % 2 = 0 THEN 1 ELSE 2 + (g % (:tenants - 1)) END, "
        "CASE WHEN g % 2 = 1 THEN :big + 2 + (g % (:tenants - 1)) WHEN g % 20 = 0 THEN 1 + (g % :big) "
        "ELSE 1 + (g % 50) END, "
        "(ARRAY['small','medium','large'])[1 + g % 3], (ARRAY['d1','d2','d3','d4'])[1 + g % 4], "
        "(ARRAY['interactive','standard','batch'])[1 + (g / 3) % 3], 'chat', g % 2 = 0, "
        "CASE WHEN g % 50 = 0 THEN 429 WHEN g % 97 = 0 THEN 503 ELSE 200 END, "
        "CASE WHEN g % 50 = 0 THEN 'rate_limit_exceeded' WHEN g % 97 = 0 THEN 'queue_full' END, "
        "50 + g % 900, 10 + g % 300, CASE WHEN g % 50 = 0 OR g % 97 = 0 THEN NULL ELSE 20 + (g * 13) % 2000 END, "
        "100 + g % 5000, 1, 0, 0, (g % 1000) * 3 "
        "FROM generate_series(1, :rows) g",
        now=now,
        span=span,
        tenants=args.tenants,
        big=args.keys,
        rows=args.rows,
    )
    took["raw rows"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for width in rollups.WIDTHS:
        await _sql(engine, migration.backfill(width, "postgresql"))
    took["rollups of the raw rows"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if args.history:
        await seed_history(engine, args, today - timedelta(days=args.days))
    for width in rollups.WIDTHS:  # the tenant-totals tier, of both
        await _sql(engine, migration.totals(width))
    took["12 months of older rollups"] = time.perf_counter() - t0
    await _sql(engine, "ANALYZE")
    return took


async def seed_history(engine: AsyncEngine, args: argparse.Namespace, until: datetime) -> None:
    """Hour and day buckets for the year before the raw rows: the big tenant's 20 busiest keys x
    3 models x 2 lanes every hour; 50 other tenants every hour; every tenant every day."""
    hist = ", ".join(rollups.HIST_COLUMNS)
    hist_values = ", ".join("(r % 7)" if i in (10, 14, 18) else "0" for i in range(len(rollups.HIST_COLUMNS)))
    first = int((until - timedelta(days=365 - args.days)).timestamp())
    last = int(until.timestamp())
    columns = (
        "width_s, tenant_id, bucket_s, api_key_id, model, lane, deployment, status, error_code, requests, "
        f"prompt_tokens, completion_tokens, cost_micros, ttft_n, ttft_sum_ms, {hist}"
    )
    for width, tenants, keys in ((3600, "1", 20), (86400, "1", 20), (3600, "generate_series(2, 51)", 1)):
        await _sql(
            engine,
            f"INSERT INTO usage_rollups ({columns}) SELECT :w, t, b, k, m, l, 'd1', 200, '', r, r * 400, r * 150, "
            f"r * 3000, 3 * (r % 7), 3 * (r % 7) * 300.0, {hist_values} "
            f"FROM generate_series(:first, :last - 1, :w) b, (SELECT {tenants} AS t) tt, "
            "generate_series(1, :keys) k, unnest(ARRAY['small','medium','large']) m, "
            "unnest(ARRAY['interactive','batch']) l, LATERAL (SELECT 1 + (b / :w + k) % 40 AS r) rr",
            w=width,
            first=first,
            last=last,
            keys=keys,
        )
    await _sql(
        engine,
        f"INSERT INTO usage_rollups ({columns}) SELECT 86400, t, b, 0, 'small', '', 'd1', 200, '', 24, 9600, "
        f"3600, 72000, 0, 0, {', '.join('0' for _ in rollups.HIST_COLUMNS)} "
        "FROM generate_series(:first, :last - 1, 86400) b, generate_series(2, :tenants) t",
        first=first,
        last=last,
        tenants=args.tenants,
    )


async def p95(call: Callable[[], Awaitable[Any]], loads: int) -> tuple[float, float]:
    times = []
    for _ in range(loads):
        t0 = time.perf_counter()
        await call()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[max(0, round(0.95 * len(times)) - 1)]


async def time_views(engine: AsyncEngine, loads: int, now: datetime) -> list[tuple[str, float, float]]:
    sessions = make_sessionmaker(engine)
    out = []

    def session_call(fn: Callable[[Any], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
        async def run() -> Any:
            async with sessions() as s:
                return await fn(s)

        return run

    for key in ("hour", "day", "30d", "12m"):
        period = PERIODS[key]
        call = session_call(lambda s, p=period: UsageStatsRepository(s).summary(BIG, p))
        out.append((f"usage page, {period.label.lower()}", *await p95(call, loads)))
    t = int(now.timestamp())
    for label, params in (
        ("usage API, 24 h by hour", {"start_time": [str(t - 86400)], "bucket_width": ["1h"]}),
        (
            "usage API, 24 h by hour, group_by model+key",
            {"start_time": [str(t - 86400)], "bucket_width": ["1h"], "group_by": ["model,key"]},
        ),
        ("usage API, 30 d by day", {"start_time": [str(t - 30 * 86400)], "bucket_width": ["1d"], "limit": ["31"]}),
        (
            "usage API, 30 d by day, group_by model",
            {"start_time": [str(t - 30 * 86400)], "bucket_width": ["1d"], "limit": ["31"], "group_by": ["model"]},
        ),
        (
            "usage API, 12 months by day (a 31-day page)",
            {"start_time": [str(t - 365 * 86400)], "bucket_width": ["1d"], "limit": ["31"]},
        ),
    ):
        query = parse_query(params)
        out.append((label, *await p95(session_call(lambda s, q=query: usage_page(s, BIG, q)), loads)))

    async def whole_year(s: Any) -> None:
        params = {"start_time": [str(t - 365 * 86400)], "bucket_width": ["1d"], "limit": ["31"]}
        while True:
            page = await usage_page(s, BIG, parse_query(params))
            if not page["has_more"]:
                return
            params["page"] = [page["next_page"]]

    out.append(("usage API, 12 months by day (all 12 pages)", *await p95(session_call(whole_year), loads)))
    out.append(("keys, first page of 50", *await p95(session_call(lambda s: key_page(s, BIG, limit=51)), loads)))
    out.append(
        (
            "keys, a page after key 90,000",
            *await p95(session_call(lambda s: key_page(s, BIG, after=90_000, limit=51)), loads),
        )
    )
    out.append(
        ("keys, search 'svc-4242'", *await p95(session_call(lambda s: key_page(s, BIG, q="svc-4242", limit=51)), loads))
    )
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    out.append(
        (
            "quota recovery: this month's tokens (exact)",
            *await p95(session_call(lambda s: UsageRepository(s).tokens_since(month, BIG, before=now)), loads),
        )
    )
    out.append(
        (
            "budget recovery: this month's cost per key (exact)",
            *await p95(session_call(lambda s: UsageRepository(s).cost_since(month, BIG, before=now)), loads),
        )
    )
    return out


TOTALS = (
    "SELECT width_s, sum(requests), sum(cost_micros) FROM usage_rollups WHERE abs(width_s) > 60 GROUP BY 1 ORDER BY 1"
)
CHECK = """
WITH raw AS (
    SELECT tenant_id, CAST(floor(extract(epoch FROM created_at) / 86400) AS BIGINT) * 86400 AS day,
           count(*) AS n, sum(prompt_tokens) AS p, sum(completion_tokens) AS c, sum(coalesce(cost_micros, 0)) AS m
    FROM usage_records GROUP BY 1, 2),
rolled AS (
    SELECT tenant_id, bucket_s AS day, sum(requests) AS n, sum(prompt_tokens) AS p,
           sum(completion_tokens) AS c, sum(cost_micros) AS m
    FROM usage_rollups WHERE width_s = 86400 AND bucket_s >= (SELECT min(day) FROM raw) GROUP BY 1, 2)
SELECT (SELECT count(*) FROM raw), (SELECT count(*) FROM (SELECT * FROM raw EXCEPT SELECT * FROM rolled) a),
       (SELECT count(*) FROM (SELECT * FROM rolled EXCEPT SELECT * FROM raw) b)
"""


async def recorder_rate(engine: AsyncEngine, rows: int, rollups_on: bool, keys: int) -> float:
    """Rows/s the recorder writes (batches of 500, its default), the rows queued first."""
    original = rollups.add

    async def off(session: Any, batch: Any) -> None:
        return None

    recorder = UsageRecorder(make_sessionmaker(engine), interval_s=0.05)
    rng = random.Random(1)
    now = datetime.now(UTC)
    for i in range(rows):
        key = rng.randint(1, keys) if i % 20 == 0 else 1 + i % 50
        recorder.record(
            {
                "request_id": f"bench-{i}",
                "created_at": now + timedelta(microseconds=i),
                "tenant_id": BIG,
                "api_key_id": key,
                "model": ("small", "medium", "large")[i % 3],
                "deployment": "d1",
                "lane": "interactive",
                "endpoint": "chat",
                "stream": True,
                "status": 200,
                "prompt_tokens": 100,
                "completion_tokens": 50,
                "ttft_ms": 20.0 + i % 900,
                "cost_micros": 1500,
            }
        )
    if not rollups_on:
        rollups.add = off  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        await recorder.flush()
        return rows / (time.perf_counter() - t0)
    finally:
        rollups.add = original


async def migrate_round_trip(engine: AsyncEngine) -> None:
    """`laneway migrate --downgrade 0015` then `laneway migrate` on the seeded rows: the raw
    table back to one plain table, then partitioned again with its rollups rebuilt."""
    count = "SELECT count(*), sum(prompt_tokens) FROM usage_records"
    rows = (await _sql(engine, count)).one()
    t0 = time.perf_counter()
    await migrate.downgrade(engine, "0015")
    down = time.perf_counter() - t0
    kept = (await _sql(engine, count)).one()
    t0 = time.perf_counter()
    await migrate.upgrade(engine)
    up = time.perf_counter() - t0
    again = (await _sql(engine, count)).one()
    n, raw_only, rolled_only = (await _sql(engine, CHECK)).one()
    print(
        f"\n## migrate on {rows[0]:,} raw rows: downgrade (to one plain table) {down:.1f} s, rows "
        f"{'kept' if kept == rows else 'CHANGED'}; upgrade (partitions by day, rollups rebuilt) {up:.1f} s, rows "
        f"{'kept' if again == rows else 'CHANGED'}; rollups = raw for {n:,} (tenant, day) pairs: "
        f"{'OK' if raw_only == rolled_only == 0 else 'MISMATCH'}"
    )


async def main(args: argparse.Namespace) -> None:
    admin = make_engine(args.pg_url, isolation_level="AUTOCOMMIT")
    name = f"lw_bench_{uuid.uuid4().hex[:10]}"
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = make_engine(args.pg_url.rsplit("/", 1)[0] + f"/{name}", pool_size=4)
    try:
        await migrate.upgrade(engine)
        now = datetime.now(UTC)
        took = await seed(engine, args, now)
        counts = (
            await _sql(engine, "SELECT (SELECT count(*) FROM usage_records), (SELECT count(*) FROM usage_rollups)")
        ).one()
        print(
            f"## seeded: {counts[0]:,} raw rows over {args.days} days, {counts[1]:,} rollup rows, "
            f"{args.tenants:,} tenants, {args.keys:,} keys in tenant {BIG}"
        )
        for what, seconds in took.items():
            print(f"- {what}: {seconds:.1f} s")
        big_rows = (await _sql(engine, "SELECT count(*) FROM usage_records WHERE tenant_id = 1")).scalar()
        print(f"- the big tenant's raw rows: {big_rows:,}\n")
        print(f"## views of the big tenant (in-process service calls, ms, {args.loads} loads each)\n")
        print("| view | median | p95 |\n|---|---:|---:|")
        for label, median, high in await time_views(engine, args.loads, now):
            print(f"| {label} | {median:.1f} | {high:.1f} |")
        for tier in (86400, -86400):  # the detail tier, then the tenant totals
            n, raw_only, rolled_only = (await _sql(engine, CHECK.replace("width_s = 86400", f"width_s = {tier}"))).one()
            print(
                f"\n## rollups (width_s {tier}) = raw per tenant and day: {n:,} (tenant, day) pairs, {raw_only} "
                f"differ one way, {rolled_only} the other: {'OK' if raw_only == rolled_only == 0 else 'MISMATCH'}"
            )
        before = (
            await _sql(
                engine,
                TOTALS,
            )
        ).all()
        # The minute rollups past the raw retention first, timed apart: what is left for
        # drop_expired is dropping the day partitions (its DELETEs then find nothing).
        cut = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=args.retention_days)
        t0 = time.perf_counter()
        await _sql(
            engine, "DELETE FROM usage_rollups WHERE width_s IN (60, -60) AND bucket_s < :cut", cut=int(cut.timestamp())
        )
        minute_ms = (time.perf_counter() - t0) * 1000
        async with make_sessionmaker(engine)() as s, s.begin():
            t0 = time.perf_counter()
            result = await drop_expired(s, raw_days=args.retention_days)
        took_ms = (time.perf_counter() - t0) * 1000
        print(f"\n(the minute rollups past retention deleted first: {minute_ms:.0f} ms)")
        after = (
            await _sql(
                engine,
                TOTALS,
            )
        ).all()
        left = (await _sql(engine, "SELECT count(*) FROM usage_records")).scalar()
        print(
            f"\n## retention at {args.retention_days} days: {len(result.dropped_partitions)} day partitions dropped "
            f"in {took_ms:.0f} ms (commit included), {left:,} raw rows left; hour and day rollup totals "
            f"{'unchanged' if before == after else 'CHANGED'}"
        )
        print(f"\n## recorder, {args.recorder_rows:,} rows a round (batches of 500), rows/s\n")
        print("| round | rollups off (baseline) | rollups on | ratio |\n|---|---:|---:|---:|")
        ons, offs = [], []
        for r in range(args.rounds):
            off = await recorder_rate(engine, args.recorder_rows, False, args.keys)
            on = await recorder_rate(engine, args.recorder_rows, True, args.keys)
            offs.append(off)
            ons.append(on)
            print(f"| {r + 1} | {off:,.0f} | {on:,.0f} | {on / off:.2f} |")
        print(
            f"| median | {statistics.median(offs):,.0f} | {statistics.median(ons):,.0f} | "
            f"{statistics.median(ons) / statistics.median(offs):.2f} |"
        )
        if args.migrate:
            await migrate_round_trip(engine)
    finally:
        await engine.dispose()
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--days", type=int, default=95, help="days of raw rows (a few past retention)")
    parser.add_argument("--retention-days", type=int, default=90)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--loads", type=int, default=20)
    parser.add_argument("--recorder-rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-history", dest="history", action="store_false", help="no rollups before the raw rows")
    parser.add_argument("--migrate", action="store_true", help="time migrate --downgrade 0015 and migrate at the end")
    asyncio.run(main(parser.parse_args()))
