"""What a request's rate limit costs in Redis mode against memory mode: the limiter alone.

Each simulated request reserves (core/ratelimit.py), yields to the loop a few times (the
request's own work, here none), and settles; `--concurrency` of them run at once, as many
as a loaded gateway has in flight. For each limiter: this process's CPU per request
(reserve + settle, the background settles included: the run waits for them), the reserve's
p50/p99 latency, and for Redis the server's own time per request (INFO commandstats: the
reserve and settle scripts). A private redis-server (tests/services.py), so nothing else's
commands are counted.

Run: .venv/bin/python bench/redis_limits.py [--requests 20000] [--concurrency 1 8 32]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from laneway.core.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter  # noqa: E402
from laneway.types import TenantSnapshot  # noqa: E402
from services import PrivateRedis  # noqa: E402

# Limits on everything the script checks: both buckets, concurrency, both quotas, the key's too.
LIMITED = TenantSnapshot(1, "bench", 11, rpm=10**9, tpm=10**12, max_concurrency=10**6,
                         tokens_per_day=10**15, tokens_per_month=10**16,
                         key_rpm=10**9, key_tpm=10**12, key_max_concurrency=10**6)  # fmt: skip
PLAIN = TenantSnapshot(2, "plain", 12)  # no limits: what bench/overhead.py's tenant has
TOP_LEVEL = {"cmdstat_evalsha", "cmdstat_eval", "cmdstat_script|load", "cmdstat_script|exists"}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(limiter: RateLimiter, tenant: TenantSnapshot, requests: int, concurrency: int) -> dict[str, Any]:
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
    if isinstance(limiter, RedisRateLimiter):
        await limiter.settled(30)
    cpu = time.process_time() - cpu0
    return {"cpu_us": cpu / requests * 1e6, "p50": pct(latencies, 0.5) * 1e6, "p99": pct(latencies, 0.99) * 1e6}


async def commandstats(url: str) -> dict[str, tuple[int, int]]:
    import redis.asyncio as redis

    client = redis.Redis.from_url(url)
    stats = await client.info("commandstats")
    await client.aclose()
    return {k: (v["calls"], v["usec"]) for k, v in stats.items()}


async def redis_row(url: str, tenant: TenantSnapshot, requests: int, concurrency: int, share: float) -> dict[str, Any]:
    limiter = RedisRateLimiter(url, prefix=f"bench:{uuid.uuid4().hex}:", share=share)
    await run(limiter, tenant, 500, concurrency)  # warm up: scripts loaded, pool filled
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


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32])
    args = ap.parse_args()
    redis = PrivateRedis().start()
    try:
        print("| tenant | concurrency | limiter | CPU / request | reserve p50 | reserve p99 | Redis time / request "
              "| ratio CPU |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for name, tenant in (("no limits", PLAIN), ("every limit", LIMITED)):
            for c in args.concurrency:
                mem = await run(MemoryRateLimiter(), tenant, args.requests, c)
                exact = await redis_row(redis.url, tenant, args.requests, c, share=0.0)
                red = await redis_row(redis.url, tenant, args.requests, c, share=0.1)
                for label, r in (("memory", mem), ("redis, each decided by Redis (share 0)", exact),
                                 ("redis, admitting at once (share 0.1)", red)):  # fmt: skip
                    print(f"| {name} | {c} | {label} | {r['cpu_us']:.0f} us | {r['p50']:.0f} us | {r['p99']:.0f} us "
                          f"| {r.get('redis_us', 0):.1f} us | {r['cpu_us'] / mem['cpu_us']:.1f}x |")  # fmt: skip
                print(f"<!-- redis calls (share 0 / 0.1): {exact['calls']} / {red['calls']} -->")
    finally:
        redis.stop()


if __name__ == "__main__":
    asyncio.run(main())
