"""The upstream HTTP client alone: CPU per request of engines/http1/ vs aiohttp (the client it
replaced), against the same fake engine (bench/upstream.py, on the other core), in one run.

Each row sends `--requests` requests with `--concurrency` in flight over keep-alive
connections, from one event loop (uvloop, as the gateway runs) pinned to one core, and reads
the CPU time of this process (time.process_time) across the row: the client's own cost per
request, the event loop's included. Rows are interleaved over `--rounds` rounds; the table
shows each client's median and the ratio to aiohttp (the baseline).

Kinds: a non-streaming completion (one JSON answer), and a 16-chunk SSE stream read piece by
piece as the vLLM adapter reads it.

Run: .venv/bin/python bench/upstream_client.py [--requests 3000] [--concurrency 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import uvloop
from laneway.engines.http1 import Http1Pool

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support import free_port  # noqa: E402

HEADERS = (("X-Request-Id", "bench-1"), ("Content-Type", "application/json"))
PLAIN = json.dumps({"model": "m", "prompt": "hello there", "max_tokens": 16}).encode()
STREAM = json.dumps({"model": "m", "prompt": "hello there", "max_tokens": 16, "stream": True}).encode()

Send = Callable[[bytes], Awaitable[int]]


async def aiohttp_client(base: str, limit: int) -> tuple[Send, Send, Callable[[], Awaitable[None]]]:
    session = aiohttp.ClientSession(
        base_url=base + "/",
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=600),
        connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=30),
        skip_auto_headers=("User-Agent",),
    )

    async def plain(body: bytes) -> int:
        async with session.post("v1/completions", data=body, headers=dict(HEADERS)) as r:
            return len(await r.read())

    async def stream(body: bytes) -> int:
        n = 0
        async with session.post("v1/completions", data=body, headers=dict(HEADERS)) as r:
            async for data in r.content.iter_any():
                n += len(data)
        return n

    return plain, stream, session.close


async def http1_client(base: str, limit: int) -> tuple[Send, Send, Callable[[], Awaitable[None]]]:
    pool = Http1Pool(base, limit=limit)

    async def plain(body: bytes) -> int:
        async with await pool.request("POST", "/v1/completions", body, HEADERS) as r:
            return len(await r.read())

    async def stream(body: bytes) -> int:
        n = 0
        async with await pool.request("POST", "/v1/completions", body, HEADERS) as r:
            async for data in r.chunks():
                n += len(data)
        return n

    return plain, stream, pool.close


async def run_row(send: Send, body: bytes, requests: int, concurrency: int) -> float:
    """CPU microseconds per request."""
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            if await send(body) <= 0:
                raise RuntimeError("empty answer")

    cpu = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (time.process_time() - cpu) * 1e6 / requests


async def bench(base: str, args: argparse.Namespace) -> dict[tuple[str, str], list[float]]:
    clients = {
        "aiohttp": await aiohttp_client(base, args.concurrency + 8),
        "http1": await http1_client(base, args.concurrency + 8),
    }
    out: dict[tuple[str, str], list[float]] = {}
    try:
        for plain, stream, _ in clients.values():  # warm both: connections, caches
            await run_row(plain, PLAIN, 200, args.concurrency)
            await run_row(stream, STREAM, 200, args.concurrency)
        for _ in range(args.rounds):
            for name, (plain, stream, _) in clients.items():
                out.setdefault((name, "non-streaming"), []).append(
                    await run_row(plain, PLAIN, args.requests, args.concurrency)
                )
                out.setdefault((name, "16-chunk stream"), []).append(
                    await run_row(stream, STREAM, args.requests, args.concurrency)
                )
    finally:
        for _, _, close in clients.values():
            await close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    port = free_port()
    taskset = ["taskset", "-c", "1"] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []
    upstream = subprocess.Popen([*taskset, sys.executable, str(ROOT / "bench" / "upstream.py"), "--port", str(port)])
    if taskset:
        os.sched_setaffinity(0, {0})
    try:
        time.sleep(0.7)
        results = uvloop.run(bench(f"http://127.0.0.1:{port}", args))
    finally:
        upstream.terminate()
    print(
        f"# bench/upstream_client.py on {platform.node()} ({os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load {os.getloadavg()[0]:.1f}); {args.requests} requests a row, "
        f"{args.concurrency} in flight, {args.rounds} interleaved rounds; baseline: aiohttp"
    )
    print("\n| kind | client | CPU / request (median) | every round | vs aiohttp |\n|---|---|---|---|---|")
    for kind in ("non-streaming", "16-chunk stream"):
        base = statistics.median(results[("aiohttp", kind)])
        for name in ("aiohttp", "http1"):
            rounds = results[(name, kind)]
            med = statistics.median(rounds)
            print(f"| {kind} | {name} | {med:.0f} us | {' / '.join(f'{r:.0f}' for r in rounds)} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
