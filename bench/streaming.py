"""Cancel on disconnect: how fast an abandoned stream frees its engine slot, and whether any leak.

For each engine (the tiny llama.cpp model and the sim), 200 times: a raw socket sends a
streaming completion, reads the response head and the first chunk, then resets the
connection (SO_LINGER 0: an abrupt disconnect). The bench polls the engine adapter's own
slot count until the slot is free. At the end it checks for leaks: engine slots, scheduler
slots and outstanding counts that did not return to zero. An answer that is not a stream (a
503 `overloaded` while the loop runs behind, a 429) is counted and printed with its status
and body, and each read has a deadline: the client once waited for an event that never came
(issue 37), on a keep-alive connection the gateway had answered with JSON.
Baseline: the same adapter's slot release when its stream is closed directly in-process
(aclose(), no HTTP) - the floor any gateway could reach.

Run: .venv/bin/python bench/streaming.py [--disconnects 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import struct
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laneway.app import create_app
from laneway.bootstrap import issue_key
from laneway.db import migrate
from laneway.db.repositories import ModelRepository, TenantRepository
from laneway.db.session import make_engine, make_sessionmaker
from laneway.embedded import EmbeddedServer
from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN, write_demo_model
from laneway.settings import Settings
from laneway.types import GenerationRequest

ENGINES = {
    "llamacpp": lambda model: {
        "engine_kind": "llamacpp",
        "max_model_len": 2048,
        "config": {"model_path": str(model), "parallel": 2, "demo": True, "ban_tokens": [EOS_TOKEN, IM_END_TOKEN]},
    },
    "sim": lambda model: {
        "engine_kind": "sim",
        "max_model_len": 1_000_000,
        "config": {"max_concurrency": 8, "decode_ms_base": 1.0},
    },
}


async def seed(url: str, model: Path) -> str:
    engine = make_engine(url)
    await migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    async with sessions() as s, s.begin():
        for kind, make in ENGINES.items():
            await ModelRepository(s).upsert(kind, deployments=[{"name": f"{kind}-1", **make(model)}])
        await TenantRepository(s).create("bench")
    _, key = await issue_key(sessions, "bench")
    await engine.dispose()
    return key


def wait_free(engine: Any, within: float = 5.0) -> float:
    start = time.perf_counter()
    while engine.active_slots:
        if time.perf_counter() - start > within:
            return float("inf")
        time.sleep(0.0002)
    return time.perf_counter() - start


ANSWER_DEADLINE_S = 30.0  # for a stream's first event, or a whole other answer


@dataclass(frozen=True)
class Answer:
    """What the gateway sent before the client reset the connection."""

    streamed: bool  # its first server-sent event came
    status: int | None = None  # None: not even a status line
    body: bytes = b""  # of an answer that is not a stream (as much as came)
    ended: str = ""  # why a non-stream answer is over: "answered", "closed", "timed out"

    def line(self) -> str:
        return f"{self.status if self.status is not None else 'no status'} {self.ended}: {self.body[:300]!r}"


def _status(head: bytes) -> int | None:
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def _content_length(head: bytes) -> int | None:
    for line in head.lower().split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


def _not_a_stream(got: bytes, ended: str) -> Answer:
    head, _, body = got.partition(b"\r\n\r\n")
    return Answer(False, _status(head), body or got, ended)


def first_event(sock: socket.socket, deadline_s: float = ANSWER_DEADLINE_S) -> Answer:
    """Reads the answer to a streaming request until its first event, or until it is plainly
    no stream: a whole answer (its Content-Length read, or its last chunk), the connection
    closed, or `deadline_s` gone. A keep-alive JSON answer (a 503 or a 429) never closes, and
    a closed connection reads b"" for ever: a loop waiting for an event without these checks
    never ends."""
    until = time.monotonic() + deadline_s
    got = b""
    while True:
        head, sep, body = got.partition(b"\r\n\r\n")
        if sep:
            status = _status(head)
            if status == 200 and b"text/event-stream" in head.lower():
                if b"data: {" in body:
                    return Answer(True, status)
            else:
                length = _content_length(head)
                if length is not None and len(body) >= length:
                    return Answer(False, status, body[:length], "answered")
                if length is None and body.endswith(b"0\r\n\r\n"):  # a chunked body's last chunk
                    return Answer(False, status, body, "answered")
        left = until - time.monotonic()
        if left <= 0:
            return _not_a_stream(got, "timed out")
        sock.settimeout(left)
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            return _not_a_stream(got, "timed out")
        if not chunk:
            return _not_a_stream(got, "closed")
        got += chunk


def through_gateway(server: EmbeddedServer, key: str, alias: str, n: int) -> tuple[list[float], list[Answer]]:
    """The slot's release after each abrupt disconnect, and the answers that were no stream."""
    engine = server.runtime.gateway.registry.resolve(alias).engine
    body = json.dumps({"model": alias, "prompt": "go", "max_tokens": 1900, "stream": True}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    times: list[float] = []
    refused: list[Answer] = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(head + body)
        answer = first_event(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
        sock.close()
        if answer.streamed:
            times.append(wait_free(engine))
        else:
            refused.append(answer)
    return times, refused


def direct(server: EmbeddedServer, alias: str, n: int) -> list[float]:
    engine = server.runtime.gateway.registry.resolve(alias).engine

    async def once(i: int) -> float:
        stream = engine.generate(
            GenerationRequest(request_id=f"d{i}", prompt="go", prompt_tokens=2, max_tokens=1900, seed=i)
        )
        await anext(stream)
        await stream.aclose()
        return await asyncio.to_thread(wait_free, engine)

    async def all_of() -> list[float]:
        return [await once(i) for i in range(n)]

    return server.call(all_of(), timeout=600)  # on the server's loop, where the engine lives


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--disconnects", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        model = write_demo_model(data / "tiny.gguf")
        url = f"sqlite+aiosqlite:///{data / 'laneway.db'}"
        key = asyncio.run(seed(url, model))
        server = EmbeddedServer(
            create_app(Settings(data_dir=data, database_url=url, bootstrap_demo=False, default_max_tokens=100_000))
        ).start()
        rows = []
        try:
            for alias in ENGINES:
                base = direct(server, alias, args.disconnects)
                gw, refused = through_gateway(server, key, alias, args.disconnects)
                time.sleep(0.5)  # let every finish() settle before counting leaks
                gateway = server.runtime.gateway
                deployment = gateway.registry.resolve(alias)
                leaked = (
                    deployment.engine.active_slots,
                    gateway.scheduler(deployment).running_total,
                    deployment.outstanding,
                )
                rows.append((alias, base, gw, refused, leaked))
        finally:
            server.stop()
    print(
        f"\nlaneway cancel on disconnect: {platform.machine()} {os.cpu_count()} cores, python "
        f"{platform.python_version()}; {args.disconnects} abrupt disconnects (TCP RST after the first chunk) "
        "per engine; baseline = adapter stream closed in-process\n"
    )
    head = (
        f"| {'engine':<8} | {'direct p50':>10} | {'direct p99':>10} | {'disconnect p50':>14} | "
        f"{'disconnect p99':>14} | {'disconnect max':>14} | {'not a stream':>12} | "
        f"{'leaked engine/sched/outst.':>26} |"
    )
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for alias, base, gw, refused, leaked in rows:
        print(
            f"| {alias:<8} | {pct(base, 0.5) * 1000:>8.2f}ms | {pct(base, 0.99) * 1000:>8.2f}ms | "
            f"{pct(gw, 0.5) * 1000:>12.2f}ms | {pct(gw, 0.99) * 1000:>12.2f}ms | "
            f"{max(gw, default=0) * 1000:>12.2f}ms | {len(refused):>12} | {'/'.join(map(str, leaked)):>26} |"
        )
    for alias, _, _, refused, _ in rows:  # what the gateway answered instead of a stream
        for line, count in Counter(answer.line() for answer in refused).most_common():
            print(f"{alias}: {count} answer(s) not a stream: {line}")


if __name__ == "__main__":
    main()
