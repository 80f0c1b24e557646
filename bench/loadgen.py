"""An open-loop HTTP load generator: requests are sent at a fixed arrival rate whatever the
server does, and latency is measured from each request's *scheduled* send time, so a server
that falls behind shows it (no coordinated omission).

Keep-alive connections (a new one opened when none is idle), each an asyncio Protocol whose
responses httptools parses in its callbacks: no task, stream reader or timeout per request, so
that one core can drive a gateway at five times its capacity (12,000+ requests a second) and
still write each request on time. Time-outs are swept every 100 ms. It reports its own CPU
time too, to show it was not the bottleneck.

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
from typing import Any, cast
from urllib.parse import urlsplit

import httptools


class _Client(asyncio.Protocol):
    """One keep-alive connection, one request in flight at a time (as an SDK client sends),
    its response parsed by httptools's C parser in the protocol's own callbacks: no task and
    no stream reader per request, so one core can offer a gateway five times its capacity."""

    def __init__(self, gen: _Generator) -> None:
        self.gen = gen
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.scheduled = self.sent = 0.0
        self.wrote = 0.0  # ms after its scheduled time
        self.first: float | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def send(self, scheduled: float, sent: float) -> None:
        assert self.transport is not None
        self.scheduled, self.sent, self.first, self.busy = scheduled, sent, None, True
        self.wrote = (time.perf_counter() - scheduled) * 1000
        self.gen.late.append(self.wrote)
        self.transport.write(self.gen.request)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.gen.failed(self)

    def on_body(self, body: bytes) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def on_message_complete(self) -> None:
        if self.busy:
            self.busy = False
            self.gen.answered(self, self.parser.get_status_code(), self.parser.should_keep_alive())

    def connection_lost(self, exc: Exception | None) -> None:
        self.gen.failed(self)  # a failure if a request was in flight; else the idle one is forgotten


class _Generator:
    """The connections and the counts of one run."""

    def __init__(
        self,
        host: str,
        port: int,
        request: bytes,
        deadline_s: float,
        max_connections: int,
        stream: bool,
        with_timeline: bool,
    ) -> None:
        self.host, self.port, self.request = host, port, request
        self.deadline_s, self.max_connections = deadline_s, max_connections
        self.stream, self.with_timeline = stream, with_timeline
        self.idle: list[_Client] = []
        self.in_flight: set[_Client] = set()
        self.connecting = 0
        self.opened = 0
        self.latencies: dict[str, list[float]] = {}
        # (scheduled offset s, status, latency ms, written ms: when the request went out after its
        # scheduled time, its connect included)
        self.timeline: list[tuple[float, int, float, float]] = []
        self.ttfb: list[float] = []
        self.late: list[float] = []  # how late each request was written (ms): the generator's own lag
        self.timeouts = 0
        self.errors = 0
        self.start = 0.0
        self.quiet = asyncio.Event()  # nothing in flight or connecting

    def fire(self, scheduled: float) -> None:
        """Send the request scheduled for then, on an idle connection or a new one."""
        sent = time.perf_counter()
        self.quiet.clear()
        if self.idle:
            client = self.idle.pop()
            self.in_flight.add(client)
            client.send(scheduled, sent)
        elif self.opened >= self.max_connections:
            self.errors += 1  # the connection cap
        else:
            self.opened += 1
            self.connecting += 1
            asyncio.get_running_loop().create_task(self._connect(scheduled, sent))

    async def _connect(self, scheduled: float, sent: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(max(0.001, scheduled + self.deadline_s - time.perf_counter())):
                _, client = await loop.create_connection(lambda: _Client(self), self.host, self.port)
        except TimeoutError:
            self.timeouts += 1
            return
        except OSError:
            self.errors += 1
            return
        finally:
            self.connecting -= 1
            self._check_quiet()
        self.quiet.clear()
        self.in_flight.add(client)
        client.send(scheduled, sent)

    def answered(self, client: _Client, status: int, keep: bool) -> None:
        done = time.perf_counter()
        self.in_flight.discard(client)
        # From the scheduled send time, or the actual one when a timer fired a little early.
        origin = min(client.scheduled, client.sent)
        latency = (done - origin) * 1000
        self.latencies.setdefault(str(status), []).append(latency)
        if self.with_timeline:
            self.timeline.append((client.scheduled - self.start, status, latency, client.wrote))
        if self.stream and client.first is not None:
            self.ttfb.append((client.first - origin) * 1000)
        if keep:
            self.idle.append(client)
        elif client.transport is not None:
            client.transport.close()
        self._check_quiet()

    def failed(self, client: _Client) -> None:
        if client.busy:
            client.busy = False
            self.errors += 1
        self.in_flight.discard(client)
        if client in self.idle:
            self.idle.remove(client)
        if client.transport is not None:
            client.transport.abort()
        self._check_quiet()

    def expire(self) -> None:
        """Abort the requests past their deadline (counted as timed out, not failed)."""
        now = time.perf_counter()
        for client in [c for c in self.in_flight if now > c.scheduled + self.deadline_s]:
            client.busy = False
            self.timeouts += 1
            self.in_flight.discard(client)
            if client.transport is not None:
                client.transport.abort()
        self._check_quiet()

    def _check_quiet(self) -> None:
        if not self.in_flight and not self.connecting:
            self.quiet.set()


async def run(
    url: str,
    body: dict[str, Any],
    rate: float,
    seconds: float,
    key: str | None = None,
    deadline_s: float = 10.0,
    max_connections: int = 4000,
    with_timeline: bool = False,
) -> dict[str, Any]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    payload = json.dumps(body).encode()
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    request = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    gen = _Generator(host, port, request, deadline_s, max_connections, bool(body.get("stream")), with_timeline)
    cpu = time.process_time()
    gen.start = start = time.perf_counter() + 0.05
    n = int(rate * seconds)
    next_expiry = start + 0.1
    for i in range(n):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        gen.fire(scheduled)
        if scheduled >= next_expiry:
            gen.expire()
            next_expiry = scheduled + 0.1
    while not gen.quiet.is_set():
        try:
            await asyncio.wait_for(gen.quiet.wait(), 0.1)
        except TimeoutError:
            gen.expire()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    for client in gen.idle:
        if client.transport is not None:
            client.transport.close()
    return {
        "sent": n,
        "elapsed": elapsed,
        "latencies": gen.latencies,
        "ttfb": gen.ttfb,
        "late": gen.late,
        "timeouts": gen.timeouts,
        "errors": gen.errors,
        "connections": gen.opened,
        "cpu_s": cpu,
        **({"timeline": gen.timeline} if with_timeline else {}),
    }


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
    result = asyncio.run(
        run(args.url, body, args.rate, args.seconds, args.key, args.timeout, with_timeline=args.timeline)
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)
    else:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
