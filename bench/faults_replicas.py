"""bench/faults.py's replica rows (issue 31): one alias served by 3 vLLM stand-ins, each a
process of its own on loopback (tests/standins/vllm_process.py), while attackers and the
victim send to it:

- "replica killed under load": one replica SIGKILLed, restarted on the same port 5 s later;
- "replica returns 500 for 5 s": one replica answers 500 to every generation for 5 s (told
  through the stand-in's POST /_control), then recovers.

A request the gateway could still move (nothing sent to the client yet) must not fail; a
stream already under way when its replica dies ends with an error event, which the row counts
apart ("cut after start"). Leaks, usage rows and the victim's p95 are read as in the other
rows (faults.settle, faults.baseline)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from faults_harness import ROOT, Env, Row, Victim, baseline, gateway, metrics, settle, tally
from support import PrivatePostgres, free_port, wait_for

STANDIN = ROOT / "tests" / "standins" / "vllm_process.py"
ALIAS = "m"
TOKEN_DELAY_S = 0.005  # a 20-token answer takes ~0.1 s: a kill always finds some mid-generation


class Replica:
    """The vLLM stand-in in its own process, so the bench can SIGKILL it and start it again on
    the same port."""

    def __init__(self, token_delay_s: float = TOKEN_DELAY_S) -> None:
        self.token_delay_s = token_delay_s
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(STANDIN), str(self.port), str(self.token_delay_s)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._up, what=f"the stand-in on port {self.port}", within=30)

    def _up(self) -> bool:
        try:
            return httpx.get(self.base_url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def control(self, **switches: Any) -> int:
        """Set the stand-in's switches; returns how many requests it has received."""
        r = httpx.post(self.base_url + "/_control", json=switches, timeout=5)
        r.raise_for_status()
        return int(r.json()["requests"])


def deployment(name: str, replica: Replica) -> dict[str, Any]:
    config = {"base_url": replica.base_url, "model": ALIAS, "metrics_poll_s": 0.2, "shared_slots": False}
    return {"name": name, "engine_kind": "vllm", "max_model_len": 4096, "config": config}


@dataclass
class Clients:
    """What the attackers saw: a failure before anything reached the client is one the gateway
    should have moved; a stream cut after its first byte cannot be moved."""

    failed_before_first_byte: int = 0
    cut_after_start: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


def attack(env: Env, row: Row, clients: Clients, fault: Callable[[], None], *, threads: int = 6) -> None:
    """`threads` attackers send streamed and whole requests in turn while `fault` runs."""
    stop = threading.Event()
    lock = threading.Lock()

    def record(status: int, *, before: bool, cut: bool = False) -> None:
        with lock:
            tally(row, status)
            clients.statuses[status] = clients.statuses.get(status, 0) + 1
            clients.failed_before_first_byte += before
            clients.cut_after_start += cut

    def one(c: httpx.Client, i: int) -> None:
        body = {"model": ALIAS, "prompt": f"p{i}", "max_tokens": 20, "stream": i % 2 == 0}
        got = 0
        try:
            with c.stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    got += bool(line)
                    if line.startswith("data:") and '"error"' in line:
                        record(r.status_code, before=False, cut=True)
                        return
            record(r.status_code, before=r.status_code != 200)
        except httpx.HTTPError:
            record(-1, before=got == 0, cut=got > 0)
            if got == 0:
                row.status_500 += 1  # a dropped connection before any byte is as bad as a 500

    def client(n: int) -> None:
        i = n
        with httpx.Client(base_url=env.base, headers=env.headers("attacker"), timeout=60) as c:
            while not stop.is_set():
                one(c, i)
                i += threads

    workers = [threading.Thread(target=client, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    time.sleep(1.0)
    fault()
    time.sleep(2.0)  # the replica back: requests go to all three again
    stop.set()
    for w in workers:
        w.join(90)


def served_by(env: Env) -> str:
    """Usage rows per deployment, and how many needed more than one try."""

    async def read() -> str:
        from laneway.db.session import make_engine
        from sqlalchemy import text

        engine = make_engine(env.database_url)
        try:
            async with engine.connect() as conn:
                per_sql = "SELECT deployment, count(*) FROM usage_records GROUP BY deployment ORDER BY deployment"
                per = (await conn.execute(text(per_sql))).all()
                moved = (await conn.execute(text("SELECT count(*) FROM usage_records WHERE tries > 1"))).scalar_one()
        finally:
            await engine.dispose()
        return ", ".join(f"{d}: {n}" for d, n in per) + f"; {moved} served after a failover"

    return asyncio.run(read())


def replica_row(
    pg: PrivatePostgres | None, work: Path, name: str, fault: Callable[[Replica], int], settings: dict[str, str]
) -> Row:
    """`fault` breaks a replica and mends it, returning the requests it had received by then.
    The replica broken is the one that has taken the most requests so far (the gateway's
    dispatch favours one replica while it has free slots): the fault finds the most requests
    on it."""
    row = Row(name)
    recovered_at: list[int] = []
    broken: list[Replica] = []

    def break_busiest() -> None:
        broken.append(max(replicas, key=lambda r: r.control()))
        recovered_at.append(fault(broken[0]))

    replicas = [Replica() for _ in range(3)]
    try:
        models = {ALIAS: [deployment(f"{ALIAS}-{i}", r) for i, r in enumerate(replicas)]}
        with gateway(pg, work, models=models, **settings) as env:
            row.baseline_p95 = baseline(env, model=ALIAS)
            clients = Clients()
            with Victim(env, ALIAS) as victim:
                attack(env, row, clients, break_busiest)
            back = broken[0].control() - recovered_at[0]
            row.loaded_p95 = victim.p95
            row.victim_ok = victim.ok / max(1, victim.ok + victim.failed)
            row.status_500 += victim.status_500
            settle(env, row)
            m = metrics(env)
            retries, exhausted = (int(m.get(f"laneway_{n}_total", 0)) for n in ("retries", "retry_budget_exhausted"))
            statuses = json.dumps(clients.statuses, sort_keys=True)
            row.note = (
                f"failed before first byte: {clients.failed_before_first_byte}; streams cut after start: "
                f"{clients.cut_after_start}; statuses {statuses}; retries {retries}, "
                f"budget exhausted {exhausted}; rows by replica: {served_by(env)}; broken: "
                f"{ALIAS}-{replicas.index(broken[0])}, it took {back} requests in the 2 s after"
            )
    finally:
        for r in replicas:
            r.kill()
    return row


def killed(replica: Replica) -> int:
    replica.kill()
    time.sleep(5)
    replica.start()
    return 0  # a new process: it counts from 0


def failing(replica: Replica) -> int:
    replica.control(fail_generation=True)
    time.sleep(5)
    return replica.control(fail_generation=False)


# key -> (row name, the fault, the gateway's settings for the row)
REPLICA_SCENARIOS: dict[str, tuple[str, Callable[[Replica], int], dict[str, str]]] = {
    "replica-killed": ("replica killed under load (1 of 3, SIGKILL, back 5 s later)", killed, {}),
    "replica-500": ("replica returns 500 for 5 s (1 of 3)", failing, {}),
    "replica-500-budget-50": (
        "replica returns 500 for 5 s (1 of 3), retry budget min 50",
        failing,
        {"LANEWAY_RETRY_BUDGET_MIN": "50"},
    ),
}


def run_replica_scenario(key: str, pg: PrivatePostgres | None, work: Path) -> Row:
    name, fault, settings = REPLICA_SCENARIOS[key]
    return replica_row(pg, work, name, fault, settings)
