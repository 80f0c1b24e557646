"""The fault benchmarks' harness: a gateway under test, its victim client, and what is read
after a fault (leaks, usage rows, statuses). bench/faults.py and bench/faults_replicas.py use it."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

ROOT = Path(__file__).resolve().parents[1]
FAULTS = Path(__file__).with_name("faults.py")  # the victim runs as `faults.py --victim ...`
sys.path.insert(0, str(ROOT / "tests"))  # the suite's seeding helper and private services

from support import PrivatePostgres, PrivateRedis, seed, serve, sim_model  # noqa: E402  # noqa: E402

ADMIN_PASSWORD = "bench-admin-password"
LANES = [
    {
        "name": "interactive",
        "priority": 0,
        "match_max_prompt_tokens": 511,
        "match_stream": True,
        "max_concurrency": 8,
        "max_queue_depth": 256,
        "queue_timeout_s": 10.0,
        "max_unacked_tokens": 4096,
    },
    {"name": "standard", "priority": 1, "max_concurrency": 8, "max_queue_depth": 256, "queue_timeout_s": 10.0},
]
TENANTS = {"attacker": {"max_concurrency": 10_000}, "victim": {}}


@dataclass
class Row:
    name: str
    requests: int = 0
    status_500: int = 0
    refused: int = 0  # 4xx/503 answers by design (throttled, shed, refused, shutting down)
    leaked: int | None = None
    rows_expected: int | None = None
    rows_stored: int | None = None
    baseline_p95: float | None = None
    loaded_p95: float | None = None
    victim_ok: float | None = None
    note: str = ""


@dataclass
class Env:
    """One gateway process and what it runs on."""

    proc: subprocess.Popen[bytes]
    port: int
    keys: dict[str, str]
    database_url: str
    redis: PrivateRedis
    prefix: str
    pg: PrivatePostgres | None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}


# ---- the victim -----------------------------------------------------------------------------


VICTIM_REQUEST = {"model": "sim", "prompt": "hello", "max_tokens": 4, "stream": True}


class Victim:
    """One short streamed request at a time as the victim tenant, each latency recorded, in a
    process of its own: the attackers' threads in this one would otherwise slow the victim's
    own client (the GIL) and the bench would blame the gateway for it."""

    def __init__(self, env: Env, model: str = "sim") -> None:
        self.env = env
        self.model = model
        self.latencies: list[float] = []
        self.ok = 0
        self.failed = 0
        self.status_500 = 0
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Victim:
        self._proc = subprocess.Popen(
            [sys.executable, str(FAULTS), "--victim", self.env.base, self.env.keys["victim"], self.model],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None and self._proc.stdout.readline().strip() == "started"
        return self

    def __exit__(self, *_: object) -> None:
        assert self._proc is not None
        out, _ = self._proc.communicate("", timeout=90)  # stdin closed: it stops and reports
        result = json.loads(out.strip().splitlines()[-1])
        self.latencies, self.ok = result["latencies"], result["ok"]
        self.failed, self.status_500 = result["failed"], result["status_500"]

    @property
    def p95(self) -> float | None:
        if len(self.latencies) < 5:
            return None
        return statistics.quantiles(self.latencies, n=20)[18]


def victim_process(base: str, key: str, model: str = "sim") -> None:
    """--victim: the victim's loop until stdin closes, then its results as one JSON line."""
    request = {**VICTIM_REQUEST, "model": model}
    stop = threading.Event()
    result: dict[str, Any] = {"latencies": [], "ok": 0, "failed": 0, "status_500": 0}

    def loop() -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
            while not stop.is_set():
                started = time.perf_counter()
                try:  # a short streamed answer, like a chat client's (the interactive lane)
                    with c.stream("POST", "/v1/completions", json=request) as r:
                        for _ in r.iter_lines():
                            pass
                    result["latencies"].append(time.perf_counter() - started)
                    result["ok"] += r.status_code == 200
                    result["failed"] += r.status_code != 200
                    result["status_500"] += r.status_code == 500
                except httpx.HTTPError:
                    result["failed"] += 1
                stop.wait(0.01)

    thread = threading.Thread(target=loop)
    thread.start()
    print("started", flush=True)
    sys.stdin.read()
    stop.set()
    thread.join(60)
    print(json.dumps(result), flush=True)


def baseline(env: Env, seconds: float = 2.0, model: str = "sim") -> float | None:
    with Victim(env, model) as v:
        time.sleep(seconds)
    return v.p95


# ---- gateway lifecycle ----------------------------------------------------------------------


def new_database(pg: PrivatePostgres | None, work: Path) -> str:
    if pg is None:
        return f"sqlite+aiosqlite:///{work / f'{uuid.uuid4().hex}.db'}"
    name = f"bench_{uuid.uuid4().hex[:10]}"
    psql = ["psql", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-qc"]
    subprocess.run([*psql, f'CREATE DATABASE "{name}"'], check=True, stdout=subprocess.DEVNULL)
    return pg.url.rsplit("/", 1)[0] + f"/{name}"


@contextmanager
def gateway(
    pg: PrivatePostgres | None,
    work: Path,
    models: dict[str, list[dict[str, Any]]] | None = None,
    lanes: list[dict[str, Any]] | None = None,
    ready_within: float = 60.0,
    **env_extra: str,
) -> Iterator[Env]:
    """`models`: alias -> deployments (default: the sim as alias "sim"); `lanes`: default LANES;
    `ready_within`: seconds its deployments may take to warm up."""
    url = new_database(pg, work)
    if models is None:
        models = {"sim": sim_model("sim", max_concurrency=8, decode_ms_base=2.0, decode_ms_per_seq=0.05)}
    keys = asyncio.run(seed(url, models=models, lanes=lanes or LANES, tenants=TENANTS))
    data = Path(tempfile.mkdtemp(dir=work))
    r = PrivateRedis().start()
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    env = {
        **os.environ,
        "LANEWAY_DATA_DIR": str(data),
        "LANEWAY_DATABASE_URL": url,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_REDIS_URL": r.url,
        "LANEWAY_REDIS_PREFIX": prefix,
        "LANEWAY_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "LANEWAY_DEFAULT_MAX_TOKENS": "100000",
        "LANEWAY_LOG_LEVEL": "error",
        **env_extra,
    }
    proc, port = serve(env, within=ready_within)
    e = Env(proc, port, keys, url, r, prefix, pg)
    try:
        yield e
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        r.stop()


def metrics(env: Env) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(env.base + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def redis_holders(env: Env) -> int:
    if env.redis.proc is None:
        return 0
    client = redis.Redis.from_url(env.redis.url, socket_timeout=2)
    try:
        return sum(int(client.zcard(f"{env.prefix}rl:{{{tid}}}:inflight")) for tid in (1, 2))
    finally:
        client.close()


def held(env: Env) -> int:
    m = metrics(env)
    names = (
        "laneway_leases_in_flight",
        "laneway_engine_active_slots",
        "laneway_requests_running",
        "laneway_requests_waiting",
        "laneway_ratelimit_local_holders",
    )
    return int(sum(m.get(n, 0.0) for n in names)) + redis_holders(env)


def stored_rows(url: str) -> int:
    async def count() -> int:
        from laneway.db.session import make_engine
        from sqlalchemy import text

        engine = make_engine(url)
        try:
            async with engine.connect() as conn:
                return int((await conn.execute(text("SELECT count(*) FROM usage_records"))).scalar_one())
        finally:
            await engine.dispose()

    return asyncio.run(count())


def settle(env: Env, row: Row, within: float = 40.0) -> None:
    """Wait for the gateway to let go of everything, then read leaks and usage rows."""
    deadline = time.monotonic() + within
    leftover = held(env)
    while leftover and time.monotonic() < deadline:
        time.sleep(0.2)
        leftover = held(env)
    row.leaked = leftover
    while metrics(env).get("laneway_usage_rows_pending", 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    row.rows_expected = int(metrics(env).get("laneway_leases_opened_total", 0))
    row.rows_stored = stored_rows(env.database_url)


def run(env: Env, row: Row, attack: Callable[[Env, Row], None]) -> Row:
    row.baseline_p95 = baseline(env)
    with Victim(env) as victim:
        attack(env, row)
    row.loaded_p95 = victim.p95
    row.victim_ok = victim.ok / max(1, victim.ok + victim.failed)
    row.status_500 += victim.status_500
    settle(env, row)
    return row


def tally(row: Row, status: int) -> None:
    row.requests += 1
    row.status_500 += status == 500
    row.refused += status in (400, 429, 503)


# ---- raw sockets ----------------------------------------------------------------------------
