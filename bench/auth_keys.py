"""What API key authentication costs as the number of keys in use grows: the authenticator alone.

Requests arrive at a fixed total rate (open loop), spread round robin over N keys of the
database, each authenticated by core/auth.py's KeyAuthenticator with the default 0.5 s ttl.
For each N: database queries a second, the requests that waited on a lookup of their own
key, the authenticator's p50/p99/max latency, and this process's CPU per request (the
database driver's thread included); then an admin change (invalidate) and every key's next
request at once: the queries that cost and how long until all were answered. The 1-key row
is the baseline of the same run.

The embedded default database (SQLite in a temporary directory), or --database-url (e.g.
PostgreSQL through asyncpg: postgresql+asyncpg://postgres@127.0.0.1:5432/test; its tables
are dropped and made again). --src DIR measures another source tree instead (a `git
worktree` of an older commit: its platform/ goes first on the import path), for a before
and after on the same machine.

Run: .venv/bin/python bench/auth_keys.py [--rate 300] [--seconds 5] [--keys 1 100 1000] [--src DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


async def measure(url: str, keys: int, rate: float, seconds: float) -> dict[str, Any]:
    from laneway.core.auth import KeyAuthenticator, new_api_key
    from laneway.db import migrate
    from laneway.db.models import Base
    from laneway.db.repositories import TenantRepository
    from laneway.db.session import make_engine, make_sessionmaker

    engine = make_engine(url)
    if engine.dialect.name == "postgresql":
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.drop_all)
            await conn.exec_driver_sql("DROP TABLE IF EXISTS alembic_version")
    await migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    secrets: list[str] = []
    async with sessions() as s, s.begin():
        repo = TenantRepository(s)
        tenant = await repo.create(f"bench-{keys}")
        for i in range(keys):
            secret, prefix, digest = new_api_key()
            await repo.add_key(tenant, prefix=prefix, secret_sha256=digest, name=f"k{i}")
            secrets.append(f"Bearer {secret}")
    auth = KeyAuthenticator(sessions)
    for header in secrets:  # first uses: every design looks each key up once
        await auth.authenticate(header)
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    waited = 0
    lookups0, sweeps0 = auth.lookups, getattr(auth, "sweeps", 0)

    async def one(header: str) -> None:
        nonlocal waited
        before = auth.lookups - getattr(auth, "sweeps", 0)
        t0 = time.perf_counter()
        await auth.authenticate(header)
        latencies.append(time.perf_counter() - t0)
        if auth.lookups - getattr(auth, "sweeps", 0) > before:
            waited += 1

    tasks: set[asyncio.Task[None]] = set()
    n = int(rate * seconds)
    cpu0, start = time.process_time(), loop.time()
    for i in range(n):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = loop.create_task(one(secrets[i % keys]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    elapsed = loop.time() - start
    cpu = time.process_time() - cpu0
    # An admin change, then every key's next request at once.
    auth.invalidate()
    before_change = auth.lookups
    t0 = time.perf_counter()
    await asyncio.gather(*(auth.authenticate(header) for header in secrets))
    change_ms = (time.perf_counter() - t0) * 1000
    result = {
        "keys": keys,
        "requests": n,
        "queries_per_s": (auth.lookups - lookups0) / elapsed,
        "sweeps_per_s": (getattr(auth, "sweeps", 0) - sweeps0) / elapsed,
        "waited": waited,
        "p50_ms": pct(latencies, 0.5) * 1000,
        "p99_ms": pct(latencies, 0.99) * 1000,
        "max_ms": max(latencies) * 1000,
        "cpu_ms": cpu * 1000 / n,
        "change_queries": auth.lookups - before_change,
        "change_ms": change_ms,
    }
    close = getattr(auth, "close", None)
    if close is not None:
        await close()
    await engine.dispose()
    return result


def run_in(src: Path | None, url: str, keys: int, rate: float, seconds: float) -> dict[str, Any]:
    """One measurement in a fresh process (the source tree's laneway on the path)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = f"{src / 'platform'}{os.pathsep}{env.get('PYTHONPATH', '')}"
    args = [sys.executable, __file__, "--one", url, str(keys), str(rate), str(seconds)]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True, timeout=seconds * 10 + 300)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=300.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--keys", type=int, nargs="*", default=[1, 100, 1000])
    ap.add_argument("--database-url")
    ap.add_argument("--src", type=Path, help="measure this source tree instead (its platform/ first on the path)")
    ap.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        url, keys, rate, seconds = args.one
        print(json.dumps(asyncio.run(measure(url, int(keys), float(rate), float(seconds)))))
        return
    which = str(args.src) if args.src else "this tree"
    print(
        f"# bench/auth_keys.py ({which}): {args.rate:.0f} requests/s over N keys, {args.seconds:.0f} s a row, "
        f"ttl 0.5 s; baseline: the 1-key row of this run\n"
    )
    print(
        "| keys | DB queries/s | requests that waited on a lookup | p50 | p99 | max | CPU / request | vs 1 key "
        "| after an admin change: queries, all keys answered in |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    base = None
    with tempfile.TemporaryDirectory() as tmp:
        for keys in args.keys:
            url = args.database_url or f"sqlite+aiosqlite:///{Path(tmp) / f'auth-{keys}.db'}"
            r = run_in(args.src, url, keys, args.rate, args.seconds)
            base = base or r["cpu_ms"]
            print(
                f"| {keys} | {r['queries_per_s']:.1f} | {r['waited']} of {r['requests']} | {r['p50_ms']:.3f} ms "
                f"| {r['p99_ms']:.3f} ms | {r['max_ms']:.1f} ms | {r['cpu_ms'] * 1000:.0f} us "
                f"| {r['cpu_ms'] / base:.2f}x | {r.get('change_queries', '-')}, "
                f"{r.get('change_ms', float('nan')):.1f} ms |",
                flush=True,
            )


if __name__ == "__main__":
    main()
