"""Routing across replicas of one real engine (issue 27): laneway's three routings and two
peer routers, in front of the same three llama.cpp replicas, offered the same requests in one run.

The replicas: bench/replica_server.py, SmolLM2-135M-Instruct (Q4_1 GGUF, fetched once with pip
as laneway's demo model is), one process each, one thread each, one request computed at a time
(the rest queue, FIFO), a prefix cache per replica (llama-cpp-python's LlamaRAMCache) sized so
that it holds about a third of workload (a)'s system prompts. Every row starts cold: the
replicas' caches are emptied before each workload.

Rows: `laneway serve` (this tree) with LANEWAY_ROUTING = cache_aware | least_outstanding |
round_robin, the replicas as one alias of three "vllm" deployments (tokenize "never");
vllm-router==0.1.17 and sglang-router==0.3.2 with --policy cache_aware (their other settings at
their defaults), installed with pip into ~/.cache/laneway/routers-venv on first use. A peer
that cannot be installed or started gets its reason in its row.

Workloads, each offered open loop by bench/routing_load.py (a process of its own, the openai
SDK, streamed chat, Poisson arrivals from a fixed seed: every row gets the same requests at the
same times):
(a) shared prefix: G groups, each a distinct ~1024-token system prompt; a short question;
(b) multi-turn sessions: a session's next turn is sent when its previous answer has arrived
    and its user has paused (exponential, --think-s on average), its history growing;
    sessions arrive at random and overlap, about three times as many live at once as one
    replica's cache holds (prompt_cache_key = session);
(c) nothing shared: every request has a system prompt of its own (the template's default
    system prompt, shared by all, would otherwise be used).
Reported per row: TTFT p50/p99 and end-to-end p50 (from each request's scheduled time), output
tokens a second over the row, the prefix hit rate (prompt tokens served from the replicas'
caches over prompt tokens, from their /metrics), requests per replica, failures; and ratios
to the laneway least_outstanding row of the same run.

Run: PYTHONPATH=platform .venv/bin/python bench/routing.py [--quick] [--rows ...] [--workloads ...]
[--rounds N]. The defaults take about 25 minutes on a 2-core machine, --quick a few (a smoke
check). The replicas share the machine's cores with the router, the load generator and
whatever else runs there, and a workload offers tens of requests: rows of the same routing
can differ by 2x on a busy machine. --rounds N runs the rows again, interleaved, and pools
their samples.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx
from routing_setup import SERVED, Front, Replicas, Sizes, Workloads, laneway, peer

LOADGEN = Path(__file__).with_name("routing_load.py")
LANEWAY_ROWS = ("cache_aware", "least_outstanding", "round_robin")
ROWS = (*LANEWAY_ROWS, "vllm-router", "sglang-router")
WORKLOADS = {"shared": "(a) shared prefix", "sessions": "(b) multi-turn sessions", "unique": "(c) nothing shared"}
BASE = "least_outstanding"
QUICK = Sizes(
    groups=3,
    prefix_tokens=256,
    shared_rate=0.6,
    shared_s=8,
    sessions_rate=0.4,
    sessions_s=5,
    session_system_tokens=128,
    turns=3,
    think_s=0.5,
    unique_rate=0.6,
    unique_s=5,
    unique_tokens=128,
    max_tokens=16,
)


@dataclass
class Cell:
    """One row's result on one workload."""

    note: str = ""  # why there are no numbers
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    tokens: int = 0
    span_s: float = 0.0
    sent: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    hits: float = 0.0  # prompt tokens served from the replicas' caches
    queries: float = 0.0  # prompt tokens
    split: list[int] = field(default_factory=list)
    late_ms: float = 0.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.span_s if self.span_s > 0 else 0.0

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries else None

    def pool(self, other: Cell) -> Cell:
        """This round's samples and another's together (--rounds)."""
        if self.note or other.note:
            return self if self.note else other
        errors = {k: self.errors.get(k, 0) + other.errors.get(k, 0) for k in {*self.errors, *other.errors}}
        split = [a + b for a, b in zip(self.split, other.split, strict=True)]
        return Cell(
            "",
            self.ttft + other.ttft,
            self.e2e + other.e2e,
            self.tokens + other.tokens,
            self.span_s + other.span_s,
            self.sent + other.sent,
            self.failed + other.failed,
            errors,
            self.hits + other.hits,
            self.queries + other.queries,
            split,
            max(self.late_ms, other.late_ms),
        )


def pct(values: list[float], q: float) -> float | None:
    """Nearest rank: with fewer than 100 samples, p99 is the slowest."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def front_for(row: str, work: Path, replicas: Replicas, slots: int) -> AbstractContextManager[Front]:
    if row in LANEWAY_ROWS:
        return laneway(work, replicas, row, slots)
    return peer(row, work, replicas)


def probe(front: Front, within: float = 90.0) -> None:
    """One tiny chat through the router, retried until it answers (a router may still be
    registering its workers when its /health first answers)."""
    deadline = time.monotonic() + within
    body = {"model": front.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    while True:
        try:
            r = httpx.post(
                front.base_url + "/chat/completions",
                json=body,
                timeout=60,
                headers={"Authorization": f"Bearer {front.api_key}"},
            )
            if r.status_code == 200:
                return
            said = f"{r.status_code} {r.text[:160]}"
        except httpx.HTTPError as exc:
            said = str(exc)
        if time.monotonic() > deadline:
            raise RuntimeError(f"no answer through the router within {within:.0f} s: {said}")
        time.sleep(1)


def run_workload(
    front: Front, spec: dict[str, Any], replicas: Replicas, work: Path, name: str, seconds: float, drain_s: float
) -> Cell:
    cell = Cell()
    if not replicas.idle():
        cell.note = "the replicas were still busy with the previous workload"
        return cell
    replicas.reset()
    before = replicas.metrics()
    spec = {
        **spec,
        "base_url": front.base_url,
        "api_key": front.api_key,
        "model": front.model,
        "timeout_s": 600.0,
        "drain_s": drain_s,
        "prompt_cache_key": True,
    }
    spec_path, result_path = work / f"{name}.spec.json", work / f"{name}.result.json"
    spec_path.write_text(json.dumps(spec))
    subprocess.run(
        [sys.executable, str(LOADGEN), str(spec_path), str(result_path)], check=True, timeout=seconds + drain_s + 120
    )
    result = json.loads(result_path.read_text())
    after = replicas.metrics()
    for rec in result["records"]:
        cell.sent += 1
        if rec["error"]:
            cell.failed += 1
            kind = rec["error"].split(":", 1)[0]
            cell.errors[kind] = cell.errors.get(kind, 0) + 1
            continue
        cell.ttft.append(rec["ttft"] if rec["ttft"] is not None else rec["e2e"])
        cell.e2e.append(rec["e2e"])
        cell.tokens += rec["tokens"]
    cell.span_s, cell.late_ms = result["span_s"], result["late_ms"]

    def delta(metric: str) -> list[float]:
        return [a.get(metric, 0.0) - b.get(metric, 0.0) for a, b in zip(after, before, strict=True)]

    cell.queries = sum(delta("vllm:prefix_cache_queries_total"))
    cell.hits = sum(delta("vllm:prefix_cache_hits_total"))
    cell.split = [int(x) for x in delta("vllm:request_success_total")]
    return cell


def cache_size(replicas: Replicas, workloads: Workloads, entries: int) -> tuple[int, int, int]:
    """Size the caches from one group's saved state, measured on replica 0: room for `entries`
    of them and half of another. Returns (cache bytes, one state's bytes, its tokens)."""
    replicas.reset(1 << 40)
    request = workloads.shared()["requests"][0]
    body = {"model": SERVED, "messages": request["messages"], "max_tokens": request["max_tokens"], "temperature": 0}
    replicas.call("POST", "/v1/chat/completions", json=body)
    stats = replicas.call("GET", "/stats")
    one, tokens = int(stats["cache_bytes"]), int(stats["entries"][0])
    size = int(one * (entries + 0.5))
    replicas.reset(size)
    return size, one, tokens


def fmt(value: float | None, unit: str = "s") -> str:
    if value is None:
        return "-"
    return f"{value:.2f} {unit}" if unit else f"{value:.2f}"


def ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value is not None and base else "-"


def table(title: str, cells: dict[str, Cell]) -> list[str]:
    out = [
        f"\n### {title}\n",
        "| router | TTFT p50 | TTFT p99 | e2e p50 | output tok/s | prefix hit rate | requests per replica | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row, c in cells.items():
        name = f"laneway {row}" if row in LANEWAY_ROWS else row
        if c.note:
            out.append(f"| {name} | {c.note} |")
            continue
        hit = "-" if c.hit_rate is None else f"{c.hit_rate:.0%}"
        errors = f" ({', '.join(f'{k} {n}' for k, n in c.errors.items())})" if c.errors else ""
        split = "/".join(map(str, c.split))
        out.append(
            f"| {name} | {fmt(pct(c.ttft, 0.5))} | {fmt(pct(c.ttft, 0.99))} | {fmt(pct(c.e2e, 0.5))} | "
            f"{c.tok_s:.1f} | {hit} | {split} | {c.failed} of {c.sent}{errors} |"
        )
    base = cells.get(BASE)
    if base is None or base.note:
        return out
    out += [
        f"\nRatios to laneway {BASE} (lower is better, but tok/s):\n",
        "| router | TTFT p50 | TTFT p99 | e2e p50 | output tok/s |",
        "|---|---|---|---|---|",
    ]
    for row, c in cells.items():
        if row == BASE or c.note:
            continue
        name = f"laneway {row}" if row in LANEWAY_ROWS else row
        out.append(
            f"| {name} | {ratio(pct(c.ttft, 0.5), pct(base.ttft, 0.5))} | "
            f"{ratio(pct(c.ttft, 0.99), pct(base.ttft, 0.99))} | {ratio(pct(c.e2e, 0.5), pct(base.e2e, 0.5))} | "
            f"{ratio(c.tok_s, base.tok_s)} |"
        )
    return out


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small prompts, seconds per workload: a smoke check")
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads per replica")
    ap.add_argument("--n-ctx", type=int, help="the replicas' context (default 2048, quick 512)")
    ap.add_argument("--cache-entries", type=int, help="group states a replica's cache holds (default: groups / 3)")
    ap.add_argument("--laneway-slots", type=int, default=2, help="each deployment's max_concurrency in laneway")
    ap.add_argument("--rounds", type=int, default=1, help="rows run again, interleaved; samples pooled")
    ap.add_argument("--drain", type=float, default=90.0, help="seconds a workload's last requests may take")
    for f in fields(Sizes):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None)
    return ap.parse_args()


def sizes_of(args: argparse.Namespace) -> Sizes:
    given = {f.name: getattr(args, f.name) for f in fields(Sizes) if getattr(args, f.name) is not None}
    return dataclasses.replace(QUICK if args.quick else Sizes(), **given)


@contextlib.contextmanager
def replicas_of(args: argparse.Namespace, work: Path) -> Iterator[Replicas]:
    from laneway.engines.model_fetch import SMOLLM2, fetch_model  # this tree's: routing_setup put it first

    cache = Path(os.environ.get("LANEWAY_TEST_MODEL_CACHE") or Path.home() / ".cache" / "laneway" / "models")
    model = fetch_model(SMOLLM2, cache)
    n_ctx = args.n_ctx or (512 if args.quick else 2048)  # laneway warms each replica with half of it
    replicas = Replicas(model, args.replicas, work, n_ctx=n_ctx, threads=args.threads, cache_bytes=1 << 30)
    try:
        yield replicas
    finally:
        replicas.stop()


def run_row(
    row: str,
    args: argparse.Namespace,
    work: Path,
    replicas: Replicas,
    specs: dict[str, Callable[[], dict[str, Any]]],
    seconds: dict[str, float],
    round_: str,
) -> dict[str, Cell]:
    """One router in front of the replicas, every workload through it; a router that does not
    install or start gets its reason in each of its cells."""
    started, cells = time.monotonic(), {}
    try:
        with front_for(row, work, replicas, args.laneway_slots) as front:
            probe(front)
            for w in args.workloads:
                cell = run_workload(front, specs[w](), replicas, work, f"{row}-{w}-{round_}", seconds[w], args.drain)
                cells[w] = cell
                hit = "-" if cell.hit_rate is None else f"{cell.hit_rate:.0%}"
                print(f"  {row} {w}: {cell.sent} sent, {cell.failed} failed, hit rate {hit}", flush=True)
    except Exception as exc:
        reason = f"not run: {type(exc).__name__}: {str(exc)[:200]}"
        print(f"  {row}: {reason}", flush=True)
        cells.update({w: Cell(note=reason) for w in args.workloads if w not in cells})
    print(f"  {row}: {time.monotonic() - started:.0f} s", flush=True)
    return cells


def main() -> None:
    args = parse()
    sizes = sizes_of(args)
    entries = args.cache_entries or max(1, round(sizes.groups / 3))
    work = Path(tempfile.mkdtemp(prefix="lw-routing-"))
    started = time.monotonic()
    with replicas_of(args, work) as replicas:
        workloads = Workloads(sizes, replicas)
        cache_bytes, one, one_tokens = cache_size(replicas, workloads, entries)
        specs: dict[str, Callable[[], dict[str, Any]]] = {
            "shared": workloads.shared,
            "sessions": workloads.sessions,
            "unique": workloads.unique,
        }
        seconds = {"shared": sizes.shared_s, "sessions": sizes.sessions_s, "unique": sizes.unique_s}
        st = workloads.system_tokens
        print(f"# Routing bench ({'quick' if args.quick else 'full'}), {platform.machine()}, {os.cpu_count()} cores\n")
        print(
            f"- replicas: {args.replicas} x bench/replica_server.py, SmolLM2-135M-Instruct Q4_1, {args.threads} "
            f"thread(s), n_ctx {replicas.n_ctx}, one request at a time; logs in {work}"
        )
        print(
            f"- replica prefix cache: {cache_bytes / 2**20:.1f} MiB = {entries + 0.5} x one group's saved state "
            f"({one / 2**20:.1f} MiB, {one_tokens} tokens): holds {entries} of the {sizes.groups} groups"
        )
        print(
            f"- (a) shared prefix: G={sizes.groups} system prompts of {min(st)}-{max(st)} tokens, a question of "
            f"~20, max_tokens {sizes.max_tokens}; {sizes.shared_rate}/s for {sizes.shared_s:.0f} s"
        )
        print(
            f"- (b) sessions: {sizes.sessions_rate} new/s for {sizes.sessions_s:.0f} s, {sizes.turns} turns each, "
            f"a ~{sizes.session_system_tokens}-token system prompt, ~35-token turns, max_tokens {sizes.max_tokens}, "
            f"a pause of {sizes.think_s:g} s on average (exponential) before each next turn, "
            "prompt_cache_key = the session's id"
        )
        print(
            f"- (c) nothing shared: a ~{sizes.unique_tokens}-token system prompt of its own and a question, "
            f"{sizes.unique_rate}/s for {sizes.unique_s:.0f} s, max_tokens {sizes.max_tokens}"
        )
        print(
            f"- laneway: each deployment max_concurrency {args.laneway_slots}, metrics_poll_s 0.25, loop-delay "
            f"shedding off; drain {args.drain:.0f} s after a workload's last arrival; {args.rounds} round(s), "
            "rows interleaved, samples pooled; p99 of fewer than 100 requests is their slowest\n",
            flush=True,
        )
        cells: dict[str, dict[str, Cell]] = {w: {} for w in args.workloads}
        for n in range(args.rounds):
            for row in args.rows:
                for w, cell in run_row(row, args, work, replicas, specs, seconds, f"{n}").items():
                    cells[w][row] = cells[w][row].pool(cell) if row in cells[w] else cell
        for w in args.workloads:
            print("\n".join(table(WORKLOADS[w], cells[w])))
        late = max((c.late_ms for ws in cells.values() for c in ws.values()), default=0.0)
        print(
            f"\nLoad generator at most {late:.0f} ms late on a send; the whole run took "
            f"{(time.monotonic() - started) / 60:.1f} min."
        )


if __name__ == "__main__":
    main()
