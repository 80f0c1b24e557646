"""An open-loop HTTP load generator: requests are sent at a fixed arrival rate whatever the
server does, and latency is measured from each request's *scheduled* send time, so a server
that falls behind shows it (no coordinated omission).

Plain asyncio streams with keep-alive connections (a new one opened when none is idle), HTTP/1.1
parsed by hand: cheap enough to drive 1,000+ requests a second from one core.

Used by bench/overhead.py; run alone:
  .venv/bin/python bench/loadgen.py URL --rate 300 --seconds 5 [--key K] [--stream]
prints one JSON line: latencies (ms) by status, time to first byte for streams, timeouts, and
how late each request was written (its connect included): the generator's own lag, which must
stay small for the latencies to be the server's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Closed(Exception):
    pass


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, float | None, bool]:
    """Read one response; (status, seconds to its first body byte after the head, keep-alive)."""
    head = await reader.readuntil(b"\r\n\r\n")
    if not head:
        raise _Closed
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if b":" in line:
            k, _, v = line.partition(b":")
            headers[k.strip().lower()] = v.strip().lower()
    first: float | None = None
    if headers.get(b"transfer-encoding") == b"chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            if first is None:
                first = time.perf_counter()
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            await reader.readexactly(size + 2)
    else:
        length = int(headers.get(b"content-length", b"0"))
        if length:
            await reader.readexactly(length)
        first = time.perf_counter()
    return status, first, headers.get(b"connection") != b"close"


async def run(url: str, body: dict[str, Any], rate: float, seconds: float, key: str | None = None,
              deadline_s: float = 10.0, max_connections: int = 4000,
              with_timeline: bool = False) -> dict[str, Any]:  # fmt: skip
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    payload = json.dumps(body).encode()
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    request = (f"POST {parts.path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\n"
               f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload  # fmt: skip
    idle: deque[Conn] = deque()
    opened = 0
    latencies: dict[str, list[float]] = {}
    # (scheduled offset s, status, latency ms, written ms: when the request went out after its
    # scheduled time, its connect included)
    timeline: list[tuple[float, int, float, float]] = []
    ttfb: list[float] = []
    late: list[float] = []  # how late each request was written (ms after its scheduled time): the generator's own lag
    timeouts = 0
    errors = 0

    async def one(scheduled: float) -> None:
        nonlocal opened, timeouts, errors
        sent = time.perf_counter()
        conn = idle.pop() if idle else None
        try:
            async with asyncio.timeout(max(0.001, scheduled + deadline_s - time.perf_counter())):
                if conn is None:
                    if opened >= max_connections:
                        raise ConnectionError("connection cap")
                    opened += 1
                    conn = await asyncio.open_connection(host, port)
                reader, writer = conn
                wrote = (time.perf_counter() - scheduled) * 1000
                late.append(wrote)
                writer.write(request)
                status, first, keep = await _read_response(reader)
        except TimeoutError:
            timeouts += 1
            if conn is not None:
                conn[1].close()
            return
        except (OSError, asyncio.IncompleteReadError, _Closed, ValueError, IndexError):
            errors += 1
            if conn is not None:
                conn[1].close()
            return
        done = time.perf_counter()
        # From the scheduled send time, or the actual one when a timer fired a little early.
        latency = (done - min(scheduled, sent)) * 1000
        latencies.setdefault(str(status), []).append(latency)
        if with_timeline:
            timeline.append((scheduled - start, status, latency, wrote))
        if first is not None and body.get("stream"):
            ttfb.append((first - min(scheduled, sent)) * 1000)
        if keep:
            idle.append(conn)
        else:
            conn[1].close()

    tasks = []
    start = time.perf_counter() + 0.05
    n = int(rate * seconds)
    for i in range(n):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(scheduled)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    for _, w in idle:
        w.close()
    return {"sent": n, "elapsed": elapsed, "latencies": latencies, "ttfb": ttfb, "late": late, "timeouts": timeouts,
            "errors": errors, "connections": opened, **({"timeline": timeline} if with_timeline else {})}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--key")
    ap.add_argument("--body", default='{"model": "m", "prompt": "hello there", "max_tokens": 16}')
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--timeline", action="store_true", help="also print (offset, status, latency, written) per request")
    # A file, not a pipe, for big results: once in a while a result of several hundred KB read
    # from the pipe had a line break in it, at 128 KB, and did not parse (cause not found).
    ap.add_argument("--out", help="write the JSON there instead of to stdout")
    args = ap.parse_args()
    body = json.loads(args.body)
    if args.stream:
        body["stream"] = True
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(run(args.url, body, args.rate, args.seconds, args.key, args.timeout,
                             with_timeline=args.timeline))  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)
    else:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
