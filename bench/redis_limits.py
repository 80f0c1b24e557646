"""What a request's rate limit costs in Redis mode against memory mode: the limiter alone, and
optionally against another tree of laneway (a baseline: `--baseline PATH`) in the same run.

Each simulated request reserves (core/ratelimit), yields to the loop once (the request's own
work, here none), and settles; `--concurrency` of them run at once, as many as a loaded
gateway has in flight. For each limiter: this process's CPU per request (reserve + settle,
the background settles included: the run waits for them), the reserve's p50/p99 latency, and
for Redis the server's own time per request (INFO commandstats: the scripts' top-level
calls). One private redis-server (tests/services.py), so nothing else's commands are counted.

Every row runs in a child process of its own, whose PYTHONPATH is the measured tree's
`platform/`; with a baseline, each row of this tree runs right after the same row of the
baseline, round after round (`--rounds`, medians), so both see the same machine.

Run: .venv/bin/python bench/redis_limits.py [--requests 20000] [--concurrency 1 8 32]
                                            [--baseline /path/to/other/tree] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support import PrivateRedis  # noqa: E402

# Limits on everything the script checks: both buckets, concurrency, both quotas, the key's too.
LIMITED = dict(
    id=1,
    name="bench",
    api_key_id=11,
    rpm=10**9,
    tpm=10**12,
    max_concurrency=10**6,
    tokens_per_day=10**15,
    tokens_per_month=10**16,
    key_rpm=10**9,
    key_tpm=10**12,
    key_max_concurrency=10**6,
)
PLAIN = dict(id=2, name="plain", api_key_id=12)  # no limits: what bench/overhead.py's tenant has
TENANTS = {"no limits": PLAIN, "every limit": LIMITED}
LIMITERS = {"memory": None, "redis, each decided by Redis (share 0)": 0.0, "redis, admitting at once (share 0.1)": 0.1}
TOP_LEVEL = {"cmdstat_evalsha", "cmdstat_eval", "cmdstat_script|load", "cmdstat_script|exists"}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(limiter: Any, tenant: Any, requests: int, concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    counter = iter(range(requests))

    async def worker() -> None:
        for i in counter:
            t0 = time.perf_counter()
            # As the pipeline does: at once where the limiter may (Redis: Headroom), else waiting.
            reservation = limiter.reserve_at_once(tenant, 40, f"r{i}") or await limiter.reserve(tenant, 40, f"r{i}")
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0)
            limiter.settle(reservation, 20)

    cpu0 = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    if hasattr(limiter, "settled"):
        await limiter.settled(30)
    cpu = time.process_time() - cpu0
    return {"cpu_us": cpu / requests * 1e6, "p50": pct(latencies, 0.5) * 1e6, "p99": pct(latencies, 0.99) * 1e6}


async def commandstats(url: str) -> dict[str, tuple[int, int]]:
    import redis.asyncio as redis

    client = redis.Redis.from_url(url)
    stats = await client.info("commandstats")
    await client.aclose()
    return {k: (v["calls"], v["usec"]) for k, v in stats.items()}


async def row(url: str, tenant_name: str, share: float | None, requests: int, concurrency: int) -> dict[str, Any]:
    """One row, in the child: the tree on PYTHONPATH's limiter."""
    from laneway.core.ratelimit import MemoryRateLimiter, RedisRateLimiter
    from laneway.types import TenantSnapshot

    tenant = TenantSnapshot(**TENANTS[tenant_name])  # type: ignore[arg-type]
    if share is None:
        return await run(MemoryRateLimiter(), tenant, requests, concurrency)
    limiter = RedisRateLimiter(url, prefix=f"bench:{uuid.uuid4().hex}:", share=share)
    await run(limiter, tenant, 500, concurrency)  # warm up: scripts loaded, connection open
    before = await commandstats(url)
    out = await run(limiter, tenant, requests, concurrency)
    after = await commandstats(url)
    await limiter.close()
    # A script's own commands are counted twice (alone, and in its EVALSHA): the top level only.
    usec = sum(v[1] - before.get(k, (0, 0))[1] for k, v in after.items() if k in TOP_LEVEL)
    calls = {k: v[0] - before.get(k, (0, 0))[0] for k, v in after.items() if k != "cmdstat_info"}
    out["redis_us"] = usec / requests
    out["calls"] = {k.removeprefix("cmdstat_"): n for k, n in calls.items() if n}
    return out


def in_child(tree: Path, url: str, tenant: str, share: float | None, requests: int, concurrency: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree / "platform")}
    spec = json.dumps([url, tenant, share, requests, concurrency])
    done = subprocess.run(
        [sys.executable, __file__, "--child", spec], env=env, check=True, capture_output=True, text=True
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def median(results: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r.get(key, 0.0) for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32])
    ap.add_argument("--baseline", type=Path, help="another laneway tree, measured row by row beside this one")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(row(*json.loads(args.child)))))
        return
    trees = [("this", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    redis = PrivateRedis().start()
    print(
        f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"{args.requests} requests a row, median of {args.rounds} round(s); trees: "
        + ", ".join(f"{name} = {path}" for name, path in trees)
    )
    print(
        "| tenant | concurrency | limiter | tree | CPU / request | reserve p50 | reserve p99 | Redis time / request "
        "| CPU vs memory | CPU vs baseline |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    try:
        for tenant in TENANTS:
            for c in args.concurrency:
                results: dict[tuple[str, str], list[dict[str, Any]]] = {}
                for _ in range(args.rounds):  # interleaved: each tree's row right after the other's
                    for label, share in LIMITERS.items():
                        for name, tree in reversed(trees):
                            out = in_child(tree, redis.url, tenant, share, args.requests, c)
                            results.setdefault((label, name), []).append(out)
                for label in LIMITERS:
                    for name, _ in reversed(trees):
                        rs = results[(label, name)]
                        cpu = median(rs, "cpu_us")
                        mem = median(results[("memory", name)], "cpu_us")
                        base = median(results[(label, "baseline")], "cpu_us") if args.baseline else None
                        print(
                            f"| {tenant} | {c} | {label} | {name} | {cpu:.0f} us | {median(rs, 'p50'):.0f} us "
                            f"| {median(rs, 'p99'):.0f} us | {median(rs, 'redis_us'):.1f} us | {cpu / mem:.2f}x "
                            f"| {f'{cpu / base:.2f}x' if base else '-'} |"
                        )
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
