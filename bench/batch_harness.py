"""bench/batch.py's harness: the gateway under test (`laneway serve` on the sim engine, pinned to
one core, its engine occupancy scraped every 0.5 s), its usage rows, the interactive load (Poisson
arrivals sent by bench/routing_load.py, a process of its own: the openai SDK, streamed chat, TTFT
from each request's scheduled send time), and a batch's life through the SDK: submit, measure,
cancel; single probes."""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from openai import OpenAI

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's seeding helper and server factory

from support import seed, serve, sim_model  # noqa: E402

LOADGEN = Path(__file__).with_name("routing_load.py")
SIM = {"max_concurrency": 8, "decode_ms_base": 15.0, "decode_ms_per_seq": 2.0, "prefill_ms_per_token": 0.05}
QUIET_S = 11.0  # longer than the scheduler's 10 s window: then the batch may take every slot
GATEWAY_CORE, CLIENT_CORE = 0, 1
ENDED = ("completed", "failed", "expired", "cancelled")
RUNNING = re.compile(r'^laneway_requests_running\{[^}]*lane="([^"]+)"[^}]*\} ([0-9.e+-]+)$')


def capacity_rps(max_tokens: int) -> float:
    """Requests a second the engine completes with every slot busy."""
    step_s = (SIM["decode_ms_base"] + SIM["decode_ms_per_seq"] * SIM["max_concurrency"]) / 1000
    return SIM["max_concurrency"] / (max_tokens * step_s)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# ---- the gateway ----------------------------------------------------------------------------


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    port: int
    keys: dict[str, str]
    db_path: Path
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # (monotonic, running by lane)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, tenant: str) -> OpenAI:
        return OpenAI(base_url=self.url + "/v1", api_key=self.keys[tenant], max_retries=0, timeout=120)

    def running(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            m = RUNNING.match(line)
            if m:
                out[m[1]] = out.get(m[1], 0.0) + float(m[2])
        return out

    def metric(self, name: str) -> float:
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def mean_running(self, t0: float, t1: float) -> dict[str, float]:
        window = [s for t, s in self.samples if t0 <= t <= t1]
        lanes = {lane for s in window for lane in s}
        return {lane: statistics.fmean(s.get(lane, 0.0) for s in window) for lane in lanes} if window else {}


@contextmanager
def gateway(work: Path, reserve: int) -> Iterator[Gateway]:
    lanes = yaml.safe_load((ROOT / "platform/laneway/policies/lanes.yaml").read_text())["lanes"]
    for lane in lanes:
        if lane["name"] == "interactive":
            lane["max_concurrency"] = SIM["max_concurrency"]
    db = work / "laneway.db"
    url = f"sqlite+aiosqlite:///{db}"
    tenants: dict[str, dict[str, Any]] = {"chat": {}, "batch": {}}
    keys = asyncio.run(seed(url, models={"sim": sim_model("sim", **SIM)}, lanes=lanes, tenants=tenants))
    env = {
        **os.environ,
        "LANEWAY_DATA_DIR": str(work),
        "LANEWAY_DATABASE_URL": url,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_ADMIN_PASSWORD": "bench-admin-password",
        "LANEWAY_LOG_LEVEL": "error",
        "LANEWAY_BACKGROUND_RESERVE_SLOTS": str(reserve),
    }
    proc, port = serve(env, log=work / "gateway.log")
    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        subprocess.run(["taskset", "-apc", str(GATEWAY_CORE), str(proc.pid)], capture_output=True, check=False)
    gw = Gateway(proc, port, keys, db)
    stop = threading.Event()

    def sample() -> None:  # the engine's occupancy, for the table's "sequences running"
        while not stop.wait(0.5):
            try:
                gw.samples.append((time.monotonic(), gw.running()))
            except httpx.HTTPError:
                pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield gw
    finally:
        stop.set()
        sampler.join(5)
        proc.terminate()  # SIGTERM: the usage rows still held are written before it exits
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def usage_rows(gw: Gateway, lane: str, since: datetime, until: datetime) -> list[tuple[datetime, float, float, float]]:
    """(recorded at: when its slot was handed back, queue_ms, ttft_ms, total_ms) of the lane's
    usage rows recorded in [since, until], in that order."""
    with sqlite3.connect(gw.db_path) as conn:
        rows = conn.execute("SELECT created_at, queue_ms, ttft_ms, total_ms FROM usage_records WHERE lane = ?", (lane,))
        out = []
        for created, queue_ms, ttft_ms, total_ms in rows:
            at = datetime.fromisoformat(created)
            at = at if at.tzinfo else at.replace(tzinfo=UTC)
            if since <= at <= until and queue_ms is not None:
                out.append((at, queue_ms, ttft_ms or 0.0, total_ms))
        return sorted(out)


# ---- the load -------------------------------------------------------------------------------


def schedule(rate: float, seconds: float, max_tokens: int, seed_: int = 25) -> list[dict[str, Any]]:
    rng = random.Random(seed_)
    out, at = [], rng.expovariate(rate)
    while at < seconds:
        question = f"Question {len(out)}: what is a good name for a small grey cat?"
        out.append({"at": at, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens})
        at += rng.expovariate(rate)
    return out


@dataclass
class Interactive:
    ttft_ms: list[float]
    failed: int
    tokens: int
    late_ms: float
    started: float  # monotonic, when the load generator was started
    last_at: float  # the schedule's last arrival, seconds after its start


def interactive(gw: Gateway, requests: list[dict[str, Any]], work: Path) -> Interactive:
    spec = {
        "base_url": gw.url + "/v1",
        "api_key": gw.keys["chat"],
        "model": "sim",
        "timeout_s": 60,
        "drain_s": 60,
        "requests": requests,
    }
    spec_path, result_path = work / "load.json", work / "load-result.json"
    spec_path.write_text(json.dumps(spec))
    started = time.monotonic()
    subprocess.run([sys.executable, str(LOADGEN), str(spec_path), str(result_path)], check=True)
    result = json.loads(result_path.read_text())
    records = result["records"]
    return Interactive(
        ttft_ms=[r["ttft"] * 1000 for r in records if r["error"] is None and r["ttft"] is not None],
        failed=sum(r["error"] is not None for r in records),
        tokens=sum(r["tokens"] for r in records),
        late_ms=result["late_ms"],
        started=started,
        last_at=max((r["at"] for r in requests), default=0.0),
    )


def batch_input(lines: int, tokens: tuple[int, int], seed_: int = 5) -> tuple[bytes, float]:
    """The JSONL and its lines' mean max_tokens (drawn from `tokens`, so that lines end at
    different steps, as real answers do: lines of one length would start and end in lockstep)."""
    rng = random.Random(seed_)
    out, total = io.BytesIO(), 0
    for i in range(lines):
        text = f"Summarise record {i} of the nightly export in one line."
        max_tokens = rng.randint(*tokens)
        total += max_tokens
        body = {"model": "sim", "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}
        out.write(
            json.dumps(
                {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            ).encode()
            + b"\n"
        )
    return out.getvalue(), total / max(1, lines)


def submit(client: OpenAI, content: bytes) -> str:
    file_id = client.files.create(file=("input.jsonl", io.BytesIO(content)), purpose="batch").id
    return client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h").id


def done_lines(client: OpenAI, batch_id: str) -> int:
    batch = client.batches.retrieve(batch_id)
    counts = batch.request_counts
    return 0 if counts is None else counts.completed + counts.failed


def wait_running(client: OpenAI, batch_id: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while done_lines(client, batch_id) == 0:
        assert time.monotonic() < deadline, f"batch {batch_id}: no line ended within {within} s"
        time.sleep(0.2)


def cancel(client: OpenAI, batch_id: str, within: float = 120.0) -> str:
    client.batches.cancel(batch_id)
    deadline = time.monotonic() + within
    while (status := client.batches.retrieve(batch_id).status) not in ENDED and time.monotonic() < deadline:
        time.sleep(0.2)
    return status


@dataclass
class Throughput:
    lines_s: float
    tokens_s: float
    window_s: float


def measure(gw: Gateway, client: OpenAI, batch_id: str, until: float) -> Throughput:
    """The batch's lines/s and tokens/s from now to `until` (monotonic)."""
    t0, lines0, tokens0 = time.monotonic(), done_lines(client, batch_id), gw.metric("laneway_batch_tokens_total")
    time.sleep(max(0.0, until - time.monotonic()))
    t1, lines1, tokens1 = time.monotonic(), done_lines(client, batch_id), gw.metric("laneway_batch_tokens_total")
    return Throughput((lines1 - lines0) / (t1 - t0), (tokens1 - tokens0) / (t1 - t0), t1 - t0)


def probe(client: OpenAI, max_tokens: int) -> float:
    """One streamed chat: ms from its send to its first token."""
    sent = time.perf_counter()
    first = None
    stream = client.chat.completions.create(
        model="sim", max_tokens=max_tokens, stream=True, messages=[{"role": "user", "content": "Is anyone there?"}]
    )
    for chunk in stream:
        if first is None and any(c.delta.content for c in chunk.choices):
            first = time.perf_counter()
    assert first is not None, "the probe got no token"
    return (first - sent) * 1000
