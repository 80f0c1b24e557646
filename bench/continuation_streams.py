"""bench/continuation.py's streams and what is read of them: a client stream with everything it
received, a row's result, the drive (all streams at once, the fault on the busiest replica),
the usage rows and the seam histogram."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults_harness import Env
from faults_harness import Row as FaultRow

ALIAS = "m"
LANES = [
    {
        "name": "interactive",
        "priority": 0,
        "max_concurrency": 64,
        "max_queue_depth": 256,
        "queue_timeout_s": 30.0,
        "max_unacked_tokens": 4096,
    }
]


@dataclass
class Stream:
    index: int
    expected: str
    expected_finish: str = "length"
    request_id: str = ""
    status: int = 0
    text: str = ""
    ids: set[str] = field(default_factory=set)
    finishes: list[str] = field(default_factory=list)
    usages: list[dict[str, Any]] = field(default_factory=list)
    last: str = ""
    chunks: int = 0
    arrivals: list[float] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def whole(self) -> bool:
        return (
            self.status == 200
            and self.text == self.expected
            and len(self.ids) == 1
            and self.finishes == [self.expected_finish]
            and len(self.usages) == 1
            and self.usages[0]["completion_tokens"] == self.chunks
            and self.last == "[DONE]"
        )

    @property
    def cut(self) -> bool:
        return '"error"' in self.last and not self.finishes and self.expected.startswith(self.text)

    def seam_at(self) -> int:
        """Where the stream's longest wait fell, as a character offset: a continued stream's seam."""
        gaps = [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]
        at = max(range(len(gaps)), key=gaps.__getitem__, default=-1) + 1
        return sum(len(p) for p in self.pieces[:at])

    def longest_gap(self) -> float:
        gaps = [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]
        return max(gaps, default=0.0)


async def one_stream(client: httpx.AsyncClient, s: Stream, body: dict[str, Any]) -> None:
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            s.status = r.status_code
            s.request_id = r.headers.get("x-request-id", "")
            if r.status_code != 200:
                s.error = (await r.aread()).decode()[:160]
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                s.last = data
                if data == "[DONE]":
                    continue
                event = json.loads(data)
                if "error" in event:
                    continue
                s.ids.add(event["id"])
                if event.get("usage"):
                    s.usages.append(event["usage"])
                for c in event.get("choices", []):
                    piece = (c.get("delta") or {}).get("content") or ""
                    if piece:
                        s.text += piece
                        s.pieces.append(piece)
                        s.chunks += 1
                        s.arrivals.append(time.perf_counter())
                    if c.get("finish_reason"):
                        s.finishes.append(c["finish_reason"])
    except httpx.HTTPError as exc:
        s.error = repr(exc)


@dataclass
class Result:
    name: str
    streams: list[Stream]
    broken_held: set[str]
    fault_at_tokens: float = 0.0
    row: FaultRow = field(default_factory=lambda: FaultRow("x"))
    rows_match: str = "-"
    seam_server_mean: float | None = None
    seam_server_p50: str = "-"  # the histogram bucket (upper bound, ms) the quantile falls in
    seam_server_p99: str = "-"
    continued: set[str] = field(default_factory=set)
    continuations: int = 0


async def drive(
    env: Env,
    replicas: list[Any],
    signum: int | None,
    streams: list[Stream],
    kind: Kind,
) -> tuple[int | None, float]:
    """The streams, all at once; once the kind's `ready` says so, its `fault` sends `signum` to
    the replica with the most requests (running and waiting, as its /metrics says), now or
    when it has generated half its answers. Returns which replica and the mean tokens the
    clients had when it was chosen."""
    bodies = kind.bodies
    headers = env.headers("attacker")
    n = len(streams)
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    broken: int | None = None
    fault_at = 0.0
    async with httpx.AsyncClient(base_url=env.base, headers=headers, timeout=300, limits=limits) as client:
        tasks = [asyncio.create_task(one_stream(client, s, b)) for s, b in zip(streams, bodies, strict=True)]
        if signum is not None:
            while not kind.ready(streams):  # noqa: ASYNC110  # polled: the clients' counters
                await asyncio.sleep(0.01)
            fault_at = statistics.mean(s.chunks for s in streams)
            loads = await asyncio.gather(*(asyncio.to_thread(load, r) for r in replicas))
            broken = max(range(len(replicas)), key=lambda k: loads[k])
            kind.fault(replicas[broken], signum)
        await asyncio.gather(*tasks)
    return broken, fault_at


def load(replica: Any) -> float:
    """Requests the replica runs and queues, from its vLLM-style /metrics."""
    text = httpx.get(replica.base_url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
    )


def signal_now(replica: Any, signum: int) -> None:
    assert replica.proc is not None
    os.kill(replica.proc.pid, signum)  # a SIGSTOPped one is SIGCONTed and killed once the row is read


async def usage_of(env: Env) -> dict[str, dict[str, Any]]:
    from laneway.db.session import make_engine
    from sqlalchemy import text

    engine = make_engine(env.database_url)
    try:
        async with engine.connect() as conn:
            sql = (
                "SELECT request_id, status, deployment, failed_deployments, completion_tokens, continuations "
                "FROM usage_records"
            )
            return {r.request_id: dict(r._mapping) for r in (await conn.execute(text(sql))).all()}
    finally:
        await engine.dispose()


@dataclass
class Kind:
    """The replicas a row runs on: how one starts, what the streams ask, what each should get,
    and when the fault comes."""

    label: str
    start: Callable[[], Any]
    bodies: list[dict[str, Any]]
    streams: Callable[[], list[Stream]]
    ready: Callable[[list[Stream]], bool]  # when the replica to break is chosen, by the clients' streams
    fault: Callable[[Any, int], None]  # (that replica, the signal): send it, now or armed
    inter_token_timeout_s: float
    max_model_len: int = 4096
    # A frozen replica's queued requests never see a first token: without this they wait for
    # it as long as their clients do.
    first_token_timeout_s: float | None = None


def seam_bucket(env: Env, q: float) -> str:
    """The `q` quantile of laneway_continuation_seam_seconds, as the bucket it falls in (ms)."""
    buckets: list[tuple[float, float]] = []
    for line in httpx.get(env.base + "/metrics", timeout=10).text.splitlines():
        if line.startswith("laneway_continuation_seam_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0.0
    for le, count in buckets:
        if total and count >= q * total:
            return "≤ inf" if le == float("inf") else f"≤ {le * 1000:.0f}"
    return "-"


def rows_match(streams: list[Stream], rows: dict[str, dict[str, Any]]) -> str:
    """Each stream's usage row bills what its client was sent: completion_tokens equal to the
    usage chunk (or, for a cut stream, the tokens it got)."""
    ok = 0
    for s in streams:
        row = rows.get(s.request_id)
        if row is None:
            continue
        sent = s.usages[0]["completion_tokens"] if s.usages else s.chunks
        ok += row["completion_tokens"] == sent
    return f"{ok}/{len(streams)} ({len(rows)} rows)"


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"
