"""A stream survives its replica (issue 39): 40 concurrent streamed chats of 80 tokens over three
vLLM-protocol replicas, each a process of its own (tests/standins/vllm_process.py speaking a
deterministic model: each word chosen by the word before it, so a continued answer is word for
word an unbroken one, and every stream's whole answer is known before it is sent). When the
clients have received about half their tokens, the replica holding the most streams is
SIGKILLed (its connections drop) or SIGSTOPped (frozen: caught by the deployments'
`inter_token_timeout_s`).

Per row, on a fresh `laneway serve` (its own database in a private PostgreSQL cluster, its own
redis-server) and three fresh replicas:

- whole: the stream came back as the answer it should be: its text equal to the expected one
  (no word twice, none missing), one `id`, one `finish_reason` (`length`), one final usage chunk
  whose completion_tokens are the words received, and `[DONE]` last;
- cut: it ended with an error event (never a clean `[DONE]` after a cut);
- wrong: anything else (a duplicate, a gap, two ids, two usages, ...): must be 0;
- on the broken replica: streams it held when it broke (from its own request log);
- seam: for those streams, the longest wait between two content chunks the client saw, p50 / p99
  (after a SIGSTOP it includes the inter-token timeout), and the gateway's own
  `laneway_continuation_seam_seconds` mean (failure seen -> next replica's first token);
- leaked after settle, and usage rows matching what the clients were sent (completion_tokens
  equal to the usage chunk; `continuations` > 0 exactly on continued streams).

The baseline rows run the same fault with continuation off (LANEWAY_CONTINUATION=false), in the
same run. The retry budget's minimum is raised to 50 in every row but one (a replica dying
under 14 streams asks its deployment for 14 moves at once; the default minimum, 3 a 10 s
window, lets only 3 of them continue: the row "default retry budget" shows it).

Run: .venv/bin/python bench/continuation.py [--only KEY ...] [--streams 40] [--tokens 80]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults_harness import ROOT, Env, gateway, metrics, settle
from faults_harness import Row as FaultRow
from faults_replicas import Replica, deployment
from support import PrivatePostgres

sys.path.insert(0, str(ROOT / "tests"))
from standins.vllm_server import _markov  # the stand-in's own model: the expected answers

ALIAS = "m"
INTER_TOKEN_TIMEOUT_S = 1.0
TOKEN_DELAY_S = 0.03  # per chunk of the stand-in: 80 tokens take ~2.4 s, time enough to find them half done
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
    request_id: str = ""
    status: int = 0
    text: str = ""
    ids: set[str] = field(default_factory=set)
    finishes: list[str] = field(default_factory=list)
    usages: list[dict[str, Any]] = field(default_factory=list)
    last: str = ""
    chunks: int = 0
    arrivals: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def whole(self) -> bool:
        return (
            self.status == 200
            and self.text == self.expected
            and len(self.ids) == 1
            and self.finishes == ["length"]
            and len(self.usages) == 1
            and self.usages[0]["completion_tokens"] == self.chunks
            and self.last == "[DONE]"
        )

    @property
    def cut(self) -> bool:
        return '"error"' in self.last and not self.finishes and self.expected.startswith(self.text)

    def longest_gap(self) -> float:
        gaps = [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]
        return max(gaps, default=0.0)


def body_of(i: int, tokens: int) -> dict[str, Any]:
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": f"question {i} tell me a long story"}],
        "max_tokens": tokens,
        "temperature": 0,
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def expected_answer(body: dict[str, Any]) -> str:
    return "".join(_markov(body, 0))


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
    continuations: int = 0


async def drive(env: Env, replicas: list[Replica], fault: Callable[[Replica], None] | None, n: int, tokens: int):
    bodies = [body_of(i, tokens) for i in range(n)]
    streams = [Stream(i, expected_answer(b)) for i, b in enumerate(bodies)]
    headers = env.headers("attacker")
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    broken_held: set[str] = set()
    fault_at = 0.0
    async with httpx.AsyncClient(base_url=env.base, headers=headers, timeout=120, limits=limits) as client:
        tasks = [asyncio.create_task(one_stream(client, s, b)) for s, b in zip(streams, bodies, strict=True)]
        if fault is not None:
            # Half done: the median stream has half its tokens.
            while statistics.median(s.chunks for s in streams) < tokens // 2:  # noqa: ASYNC110  # polled: 40 counters
                await asyncio.sleep(0.01)
            fault_at = statistics.mean(s.chunks for s in streams)
            states = await asyncio.gather(*(asyncio.to_thread(state, r) for r in replicas))
            busiest = max(range(len(replicas)), key=lambda k: states[k]["running"])
            done = set(states[busiest]["finished"])
            broken_held = {b["_request_id"] for b in states[busiest]["bodies"]} - done
            fault(replicas[busiest])
        await asyncio.gather(*tasks)
    return streams, broken_held, fault_at


def state(replica: Replica) -> dict[str, Any]:
    """The stand-in's request log: what it received, what it finished, how many it runs."""
    r = httpx.post(replica.base_url + "/_control", json={"bodies": True}, timeout=5)
    r.raise_for_status()
    return dict(r.json())


def sigkill(replica: Replica) -> None:
    replica.kill()


def sigstop(replica: Replica) -> None:
    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGSTOP)  # SIGCONTed and killed once the row is read


async def usage_of(env: Env) -> dict[str, dict[str, Any]]:
    from laneway.db.session import make_engine
    from sqlalchemy import text

    engine = make_engine(env.database_url)
    try:
        async with engine.connect() as conn:
            sql = "SELECT request_id, status, completion_tokens, continuations FROM usage_records"
            return {r.request_id: dict(r._mapping) for r in (await conn.execute(text(sql))).all()}
    finally:
        await engine.dispose()


def run_row(
    pg: PrivatePostgres | None,
    work: Path,
    name: str,
    fault: Callable[[Replica], None] | None,
    settings: dict[str, str],
    n: int,
    tokens: int,
) -> Result:
    replicas = [Replica(TOKEN_DELAY_S) for _ in range(3)]
    try:
        for r in replicas:
            r.control(markov=True)
        deployments = []
        for i, r in enumerate(replicas):
            d = deployment(f"{ALIAS}-{i}", r)
            d["config"].update(inter_token_timeout_s=INTER_TOKEN_TIMEOUT_S, max_concurrency=64)
            deployments.append(d)
        env_settings = {"LANEWAY_RETRY_BUDGET_MIN": "50", **settings}
        with gateway(pg, work, models={ALIAS: deployments}, lanes=LANES, **env_settings) as env:
            streams, held, fault_at = asyncio.run(drive(env, replicas, fault, n, tokens))
            result = Result(name, streams, held, fault_at)
            for r in replicas:  # a frozen replica thawed: its sockets close, nothing more reaches a client
                if r.proc is not None and r.proc.poll() is None:
                    os.kill(r.proc.pid, signal.SIGCONT)
            settle(env, result.row)
            m = metrics(env)
            count = m.get("laneway_continuation_seam_seconds_count", 0.0)
            result.continuations = int(m.get("laneway_continuations_total", 0.0))
            if count:
                result.seam_server_mean = m["laneway_continuation_seam_seconds_sum"] / count
                result.seam_server_p50, result.seam_server_p99 = (seam_bucket(env, q) for q in (0.5, 0.99))
            rows = asyncio.run(usage_of(env))
            result.rows_match = rows_match(streams, rows, held)
    finally:
        for r in replicas:
            r.kill()
    return result


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


def rows_match(streams: list[Stream], rows: dict[str, dict[str, Any]], held: set[str]) -> str:
    """Each stream's usage row bills what its client was sent: completion_tokens equal to the
    usage chunk (or, for a cut stream, the words it got), continuations > 0 only where continued."""
    ok = 0
    for s in streams:
        row = rows.get(s.request_id)
        if row is None:
            continue
        sent = s.usages[0]["completion_tokens"] if s.usages else s.chunks
        ok += row["completion_tokens"] == sent and (row["continuations"] > 0) == (s.whole and s.request_id in held)
    return f"{ok}/{len(streams)} ({len(rows)} rows)"


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


ROWS: dict[str, tuple[str, Callable[[Replica], None] | None, dict[str, str]]] = {
    "none": ("no fault", None, {}),
    "kill-off": ("SIGKILL busiest, continuation off (baseline)", sigkill, {"LANEWAY_CONTINUATION": "false"}),
    "kill": ("SIGKILL busiest, continuation on", sigkill, {}),
    "kill-budget": (
        "SIGKILL busiest, continuation on, default retry budget (min 3)",
        sigkill,
        {"LANEWAY_RETRY_BUDGET_MIN": "3"},
    ),
    "stop-off": ("SIGSTOP busiest, continuation off (baseline)", sigstop, {"LANEWAY_CONTINUATION": "false"}),
    "stop": ("SIGSTOP busiest, continuation on", sigstop, {}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=list(ROWS))
    ap.add_argument("--streams", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=80)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lw-cont-"))
    try:
        pg: PrivatePostgres | None = PrivatePostgres(Path(tempfile.mkdtemp(prefix="lw-pg-"))).start()
        database = "a private PostgreSQL cluster"
    except BaseException as exc:  # no initdb here: SQLite
        pg, database = None, f"SQLite (private PostgreSQL unavailable: {exc})"
    print(
        f"# bench/continuation.py on {platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()}); "
        f"{args.streams} streams x {args.tokens} tokens, 3 vLLM-protocol stand-in processes "
        f"({TOKEN_DELAY_S * 1000:.0f} ms a token), inter_token_timeout_s {INTER_TOKEN_TIMEOUT_S:g}; "
        f"database: {database}"
    )
    results: list[Result] = []
    try:
        for key in args.only or list(ROWS):
            name, fault, settings = ROWS[key]
            results.append(run_row(pg, work, name, fault, settings, args.streams, args.tokens))
            print(f"  done: {key}", file=sys.stderr)
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    print_table(results, args.streams)


def print_table(results: list[Result], n: int) -> None:
    print(
        "| row | whole | cut (error event) | refused before the first byte | wrong | on the broken replica: "
        "whole / held | fault at (tokens, mean) | seam, client's longest gap p50 / p99 (ms) | normal longest gap "
        "p50 (ms) | seam, gateway p50 / p99 / mean (ms) | continuations | leaked | usage rows stored / leases "
        "| rows bill what was sent |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        whole = sum(s.whole for s in r.streams)
        cut = sum(s.cut for s in r.streams)
        refused = sum(s.status != 200 for s in r.streams)
        wrong = len(r.streams) - whole - cut - refused
        on = [s for s in r.streams if s.request_id in r.broken_held]
        others = [s for s in r.streams if s.request_id not in r.broken_held]
        seam = [s.longest_gap() for s in on if s.whole]
        normal = [s.longest_gap() for s in others if s.whole]
        held = f"{sum(s.whole for s in on)} / {len(on)}" if r.broken_held else "-"
        gateway_seam = f"{r.seam_server_p50} / {r.seam_server_p99} / {ms(r.seam_server_mean)}"
        print(
            f"| {r.name} | {whole}/{n} | {cut} | {refused} | {wrong} | {held} | {r.fault_at_tokens:.0f} "
            f"| {ms(pct(seam, 0.5))} / {ms(pct(seam, 0.99))} | {ms(pct(normal, 0.5))} | {gateway_seam} "
            f"| {r.continuations} | {r.row.leaked} | {r.row.rows_stored} / {r.row.rows_expected} | {r.rows_match} |"
        )
    for r in results:
        odd = [s for s in r.streams if not s.whole and not s.cut]
        for s in odd[:3]:
            print(
                f"  {r.name}: stream {s.index}: status {s.status}, {len(s.ids)} ids, finishes {s.finishes}, "
                f"{len(s.usages)} usages, last {s.last[:80]!r}, text ok {s.text == s.expected}, said {s.error!r}"
            )


if __name__ == "__main__":
    main()
