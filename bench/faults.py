"""Hostile and unlucky clients, failing dependencies: does anyone else notice, and does
anything leak?

Each scenario runs against a fresh `laneway serve` process (its own database in a private
PostgreSQL cluster started with initdb/pg_ctl on a free port, and its own redis-server for
the rate limits), never the machine's shared services. Engine: the sim (8 sequences, 2 ms a
decode step). Throughout each scenario a victim tenant sends one short request at a time.
After it, the bench waits for the gateway to settle and reads:

- leaked: whatever is still held after the settle (leases, engine slots, queue entries, local
  rate-limit holders from /metrics, and the tenants' in-flight sets in Redis);
- usage rows: expected = leases the gateway opened (each must leave one row; for SIGTERM,
  every request sent), stored = rows in the database once its backlog is written;
- victim p95 vs baseline: the victim's p95 latency during the scenario over its p95 alone on
  the same process just before (the baseline, measured in the same run).

Goal: 0 leaked, 0 rows lost, 0 x 500, victim p95 <= 1.5x baseline in every row.

The replica rows (bench/faults_replicas.py) serve one alias from 3 vLLM stand-ins, each a
process of its own: one is SIGKILLed and restarted, or answers 500 for 5 s. There the goal is
also 0 failed requests that had not received a byte (failover before the first byte).

Run: .venv/bin/python bench/faults.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults_harness import ROOT, Env, Row, gateway, run, stored_rows, tally, victim_process
from faults_replicas import REPLICA_SCENARIOS, run_replica_scenario
from support import PrivatePostgres, closed_by_server


def request_bytes(env: Env, body: dict[str, Any], *, path: str = "/v1/completions") -> bytes:
    payload = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {env.keys['attacker']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload


def rst_socket(env: Env) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", env.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends RST
    return sock


def read_until(sock: socket.socket, marker: bytes, timeout: float = 10) -> None:
    sock.settimeout(timeout)
    data = b""
    try:
        while marker not in data:
            chunk = sock.recv(4096)
            if not chunk:
                return
            data += chunk
    except OSError:
        return


STREAM = {"model": "sim", "prompt": "go", "max_tokens": 300, "stream": True}
PLAIN = {"model": "sim", "prompt": "go", "max_tokens": 40}


def in_threads(n: int, work: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


# ---- scenarios ------------------------------------------------------------------------------


def rst_storm(env: Env, row: Row) -> None:
    rng = random.Random(1)

    def one(i: int) -> None:
        sock = rst_socket(env)
        point = i % 6
        payload = request_bytes(env, STREAM if i % 2 else PLAIN)
        if point == 0:
            sock.sendall(payload[: payload.index(b"\r\n\r\n") + 4])  # headers, no body
        else:
            sock.sendall(payload)
            if point == 2:
                read_until(sock, b"\r\n\r\n")
            elif point == 3:
                read_until(sock, b"data: ")
            elif point >= 4:
                time.sleep(rng.uniform(0, 0.05))
        sock.close()
        row.requests += 1

    in_threads(6, lambda n: [one(n * 50 + j) for j in range(50)])


def disconnect_at_grant(env: Env, row: Row) -> None:
    """Hogs keep all 8 slots busy with ~60 ms streams; 200 queued clients hang up after
    0-80 ms, so many hang up just as a slot is granted to them."""
    stop = threading.Event()

    def hog(_: int) -> None:
        with httpx.Client(base_url=env.base, headers=env.headers("attacker"), timeout=30) as c:
            while not stop.is_set():
                with c.stream("POST", "/v1/completions", json={**STREAM, "max_tokens": 30}) as r:
                    for _ in r.iter_lines():
                        pass

    hogs = [threading.Thread(target=hog, args=(i,)) for i in range(8)]
    for h in hogs:
        h.start()
    rng = random.Random(2)

    def one(i: int) -> None:
        sock = rst_socket(env)
        sock.sendall(request_bytes(env, STREAM))
        time.sleep(rng.uniform(0, 0.08))
        sock.close()
        row.requests += 1

    in_threads(4, lambda n: [one(n * 50 + j) for j in range(50)])
    stop.set()
    for h in hogs:
        h.join(30)


def overload_with_timeouts(env: Env, row: Row) -> None:
    """40 clients (5x the 8 slots), each giving up after 20-300 ms, for 5 s."""

    async def go() -> None:
        rng = random.Random(3)

        async def client(n: int) -> None:
            async with httpx.AsyncClient(base_url=env.base, headers=env.headers("attacker")) as c:
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    body = {**STREAM, "max_tokens": rng.randint(20, 200), "stream": n % 2 == 0}
                    try:
                        r = await c.post("/v1/completions", json=body, timeout=rng.uniform(0.02, 0.3))
                        tally(row, r.status_code)
                    except httpx.TimeoutException:
                        row.requests += 1

        await asyncio.gather(*(client(n) for n in range(40)))

    asyncio.run(go())


def nul_rows(env: Env, row: Row) -> None:
    with httpx.Client(base_url=env.base, headers=env.headers("attacker"), timeout=30) as c:
        for i in range(100):
            user = "a\u0000b" if i % 2 else "alice"
            tally(row, c.post("/v1/completions", json={**PLAIN, "max_tokens": 3, "user": user}).status_code)


def steady_attacker(env: Env, row: Row, seconds: float, during: Callable[[], None]) -> None:
    """Four attacker clients keep sending while `during` breaks something."""
    stop = threading.Event()

    def client(_: int) -> None:
        with httpx.Client(base_url=env.base, headers=env.headers("attacker"), timeout=30) as c:
            while not stop.is_set():
                try:
                    tally(row, c.post("/v1/completions", json={**PLAIN, "max_tokens": 8}).status_code)
                except httpx.HTTPError:
                    row.requests += 1
                    row.status_500 += 1  # a hang or a dropped connection is as bad as a 500

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    during()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(60)


def redis_killed(env: Env, row: Row) -> None:
    def during() -> None:
        env.redis.kill()
        time.sleep(5)
        env.redis.start()

    steady_attacker(env, row, 1.0, during)


def redis_frozen(env: Env, row: Row) -> None:
    def during() -> None:
        env.redis.freeze()
        time.sleep(5)
        env.redis.thaw()

    steady_attacker(env, row, 1.0, during)


def redis_restarted(env: Env, row: Row) -> None:
    steady_attacker(env, row, 3.0, env.redis.restart)


def postgres_stopped(env: Env, row: Row) -> None:
    assert env.pg is not None

    def during() -> None:
        env.pg.stop()  # type: ignore[union-attr]
        time.sleep(10)
        env.pg.start()  # type: ignore[union-attr]

    steady_attacker(env, row, 1.0, during)


def login_attackers(env: Env, row: Row) -> None:
    """The suite's attacker script, in a process of its own (as remote attackers are): 16
    threads from 16 loopback addresses post wrong passwords as fast as they are answered."""
    script = ROOT / "tests" / "standins" / "login_attackers.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), env.base, "16"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    time.sleep(5)
    out, _ = proc.communicate("", timeout=90)
    for status, count in json.loads(out.strip().splitlines()[-1])["statuses"].items():
        for _ in range(count):
            tally(row, int(status))


def slowloris(env: Env, row: Row) -> None:
    socks = []
    for _ in range(1000):
        s = socket.create_connection(("127.0.0.1", env.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-a: ")
        socks.append(s)
        row.requests += 1
    deadline = time.monotonic() + 12  # past the 10 s request read timeout
    while time.monotonic() < deadline:
        for s in socks[:200]:
            try:
                s.send(b"a")
            except OSError:
                pass
        time.sleep(1)
    row.note = f"{closed_by_server(socks, timeout=2)}/1000 closed by the server"


def slow_readers(env: Env, row: Row) -> None:
    socks = []
    for _ in range(4):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", env.port))
        s.sendall(request_bytes(env, {**STREAM, "max_tokens": 50_000}))
        socks.append(s)
        row.requests += 1
    deadline = time.monotonic() + 20  # the send timeout (10 s) cuts them once their buffers fill
    while time.monotonic() < deadline:
        for s in socks:
            s.settimeout(0.01)
            try:
                s.recv(1)
            except OSError:
                pass
        time.sleep(1)
    for s in socks:
        s.close()


def sigterm_with_streams(pg: PrivatePostgres | None, work: Path) -> Row:
    row = Row("SIGTERM with 20 streams (drain 10 s)")
    with gateway(pg, work, LANEWAY_DRAIN_TIMEOUT_S="10") as env:
        results: list[int] = []

        def one(_: int) -> None:
            try:
                with httpx.stream(
                    "POST",
                    env.base + "/v1/completions",
                    headers=env.headers("attacker"),
                    timeout=60,
                    json={**STREAM, "max_tokens": 200},
                ) as r:
                    for _ in r.iter_lines():
                        pass
                    results.append(r.status_code)
            except httpx.HTTPError:
                results.append(-1)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        env.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        code = env.proc.wait(60)
        for status in results:
            tally(row, status)
            row.status_500 += status == -1
        row.rows_expected = 20
        row.rows_stored = stored_rows(env.database_url)
        row.note = f"exit {code}; {results.count(200)} finished, {results.count(503)} refused while queued"
        row.leaked = 0 if code == 0 else None
    return row


SCENARIOS: dict[str, tuple[str, Callable[[Env, Row], None]]] = {
    "rst": ("RST storm x300 at mixed points", rst_storm),
    "grant": ("disconnect at grant x200", disconnect_at_grant),
    "overload": ("5x capacity, client time-outs", overload_with_timeouts),
    "nul": ("NUL in `user` (50 of 100)", nul_rows),
    "redis-killed": ("Redis killed 5 s", redis_killed),
    "redis-frozen": ("Redis frozen 5 s (SIGSTOP)", redis_frozen),
    "redis-restarted": ("Redis restarted", redis_restarted),
    "pg-stopped": ("PostgreSQL stopped 10 s", postgres_stopped),
    "login": ("16 login attackers, 5 s", login_attackers),
    "slowloris": ("1000 slowloris connections", slowloris),
    "slow-reader": ("4 readers at 1 byte/s", slow_readers),
}


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def print_table(rows: list[Row]) -> None:
    print(
        "| scenario | requests | 500s | refused (4xx/503) | leaked after settle | usage rows expected / stored "
        "| victim p95 baseline → during (ms) | ratio | victim ok | note |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = "-" if not (r.baseline_p95 and r.loaded_p95) else f"{r.loaded_p95 / r.baseline_p95:.2f}x"
        rows_col = "-" if r.rows_expected is None else f"{r.rows_expected} / {r.rows_stored}"
        ok = "-" if r.victim_ok is None else f"{r.victim_ok * 100:.1f} %"
        leaked = "-" if r.leaked is None else str(r.leaked)
        print(
            f"| {r.name} | {r.requests} | {r.status_500} | {r.refused} | {leaked} | {rows_col} | "
            f"{fmt_ms(r.baseline_p95)} → {fmt_ms(r.loaded_p95)} | {ratio} | {ok} | {r.note} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    ap.add_argument(
        "--only", nargs="*", choices=[*SCENARIOS, "sigterm", *REPLICA_SCENARIOS], help="run only these scenarios"
    )
    ap.add_argument("--victim", nargs="+", help=argparse.SUPPRESS)  # internal: the victim's own process
    args = ap.parse_args()
    if args.victim:
        victim_process(*args.victim)
        return
    chosen = args.only or [*SCENARIOS, "sigterm", *REPLICA_SCENARIOS]
    work = Path(tempfile.mkdtemp(prefix="lw-faults-"))
    pg: PrivatePostgres | None = None
    pg_note = ""
    try:
        base = Path(tempfile.mkdtemp(prefix="lw-pg-"))
        pg = PrivatePostgres(base).start()
    except BaseException as exc:  # no initdb here: SQLite, and the PostgreSQL row is skipped
        pg, pg_note = None, f"private PostgreSQL unavailable ({exc}); SQLite used"
    database = "a private PostgreSQL cluster" if pg else pg_note
    print(
        f"# bench/faults.py on {platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()}); "
        f"database: {database}; Redis: a private redis-server per scenario"
    )
    rows: list[Row] = []
    try:
        for key in chosen:
            if key == "sigterm":
                rows.append(sigterm_with_streams(pg, work))
                continue
            if key in REPLICA_SCENARIOS:
                rows.append(run_replica_scenario(key, pg, work))
                print(f"  done: {key}", file=sys.stderr)
                continue
            name, attack = SCENARIOS[key]
            if key == "pg-stopped" and pg is None:
                rows.append(Row(name, note="skipped: " + pg_note))
                continue
            with gateway(pg, work) as env:
                rows.append(run(env, Row(name), attack))
            print(f"  done: {name}", file=sys.stderr)
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows)


if __name__ == "__main__":
    main()
