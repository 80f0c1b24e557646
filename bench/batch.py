"""Batch jobs beside interactive traffic (issue 25): does a batch fill what the interactive
streams leave of one engine, without slowing them down?

One deployment: the sim engine (engines/sim.py) with a continuous-batching cost model, up to
8 sequences at once, a decode step of 15 ms + 2 ms per running sequence, prefill 0.05 ms per
prompt token. Served by `laneway serve` (this tree; SQLite, no Redis) pinned to core 0
(taskset); this process and the load generator on core 1. Lanes: the shipped lanes.yaml (batch
in the background lane), with the interactive lane's max_concurrency raised from 4 (sized for
small engines) to the engine's 8, so that the interactive baseline is the engine's own.

Rows, in one run, in this order:
 1 interactive alone: Poisson arrivals (a fixed seed) at --load (0.25) of the engine's capacity
   for answers of --max-tokens (32): 8 / (32 x 31 ms) = 8.1 req/s, so 2.0 req/s, for --duration
   seconds; short streamed chats through the openai SDK (bench/routing_load.py, a process of
   its own); TTFT from each request's scheduled send time.
 2 batch alone: a --lines (5,000) line batch of short chats, each line's max_tokens drawn from
   --batch-tokens (32-64: lines of one length would start and end in lockstep, which real
   answers do not), submitted with the SDK (files.create + batches.create), measured once no
   foreground request has been seen for 11 s (the batch may then take every slot) over
   --batch-window seconds: lines/s (request_counts, read with batches.retrieve) and tokens/s
   (prompt + completion, laneway_batch_tokens_total); then cancelled. The engine's capacity
   for batch work.
 3 both: a new batch of the same size; once its lines run, row 1's schedule again. TTFT as a
   ratio to row 1; batch throughput over the schedule as a share of row 2.
 4 arrival while the batch holds every slot: row 3's batch runs on; after 11 s without
   foreground traffic, --probes single streamed chats, each sent 11-13 s (at random) after the
   previous one ended: arrival -> first token; its wait for a slot (its usage row's queue_ms)
   against the time from its arrival at the gateway to the end of the first batch line that
   ended after it (the lines' usage rows are stamped as their slots are handed back); and a
   batch line's service time (its slot held: total_ms - queue_ms, lines ended in this row).
From the gateway, per row: mean sequences running (laneway_requests_running scraped every
0.5 s; a step costs 15 + 2 x that ms) and the interactive requests' wait for a slot and their
gateway-side TTFT less that wait (usage rows).

Goals (issue 25): row 3's TTFT p99 <= 1.2x row 1's; row 3's batch throughput >= 0.9 of row 2's
while interactive load is light; in row 4 an arrival waits at most one batch line's remaining
time: judged as each probe taking the first slot a batch line hands back after it arrived.

Run: PYTHONPATH=platform .venv/bin/python bench/batch.py [--duration S] [--lines N] [--probes N]
About 8 minutes with the defaults; tests/bench/test_batch_bench.py runs it in seconds.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from batch_harness import (
    CLIENT_CORE,
    GATEWAY_CORE,
    QUIET_S,
    SIM,
    Interactive,
    Throughput,
    batch_input,
    cancel,
    capacity_rps,
    gateway,
    interactive,
    measure,
    pct,
    probe,
    schedule,
    submit,
    usage_rows,
    wait_running,
)

WAITED_MS = 5.0  # a slot wait past this one is a wait for a slot to be handed back, not bookkeeping
FIRST_SLOT_SLACK_MS = 5.0  # a line's usage row is stamped just after the slot it handed back was granted


@dataclass
class Results:
    alone: Interactive | None = None
    both: Interactive | None = None
    batch_alone: Throughput | None = None
    batch_both: Throughput | None = None
    probes: list[float] = field(default_factory=list)  # arrival -> first token, ms
    # per probe: (its wait for a slot, the time from its arrival at the gateway to the first batch
    # line's end after it), ms
    probe_waits: list[tuple[float, float | None]] = field(default_factory=list)
    probes_failed: int = 0
    line_tokens: float = 0.0  # the batch lines' mean max_tokens
    probe_slots: list[float] = field(default_factory=list)  # batch lines running just before each probe
    line_hold_ms: list[float] = field(default_factory=list)
    queue_ms: dict[str, list[float]] = field(default_factory=dict)  # interactive slot waits, rows 1 and 3
    served_ms: dict[str, list[float]] = field(default_factory=dict)  # their gateway TTFT less the slot wait
    seqs: dict[str, dict[str, float]] = field(default_factory=dict)  # mean running by lane, per row
    status: dict[str, str] = field(default_factory=dict)  # how each batch ended


def run(args: argparse.Namespace, work: Path) -> Results:
    res = Results()
    rate = args.load * capacity_rps(args.max_tokens)
    requests = schedule(rate, args.duration, args.max_tokens)
    content, res.line_tokens = batch_input(args.lines, (args.batch_tokens[0], args.batch_tokens[1]))
    jitter = random.Random(4)
    walls: dict[str, tuple[datetime, datetime]] = {}
    with gateway(work, args.reserve) as gw:
        client = gw.client("batch")
        # 1: interactive alone
        w0 = datetime.now(UTC)
        res.alone = interactive(gw, requests, work)
        t_end = time.monotonic()
        walls["alone"] = (w0, datetime.now(UTC))
        res.seqs["1"] = gw.mean_running(res.alone.started, t_end)
        # 2: batch alone, once the foreground has been quiet long enough for it to take every slot
        batch = submit(client, content)
        wait_running(client, batch)
        time.sleep(max(0.0, t_end + args.quiet - time.monotonic()))
        t0 = time.monotonic()
        res.batch_alone = measure(gw, client, batch, t0 + args.batch_window)
        res.seqs["2"] = gw.mean_running(t0, time.monotonic())
        res.status["2"] = cancel(client, batch)
        # 3: both
        batch = submit(client, content)
        wait_running(client, batch)
        time.sleep(1.0)
        w0 = datetime.now(UTC)
        box: dict[str, Interactive] = {}
        load = threading.Thread(target=lambda: box.update(r=interactive(gw, requests, work)))
        started = time.monotonic()
        load.start()
        time.sleep(1.0)  # the load generator's start-up (its first arrival is 0.2 s after it starts)
        res.batch_both = measure(gw, client, batch, started + 1.0 + max(1.0, requests[-1]["at"] if requests else 1.0))
        load.join()
        t_end = time.monotonic()
        walls["both"] = (w0, datetime.now(UTC))
        res.both = box["r"]
        res.seqs["3"] = gw.mean_running(started + 1.0, started + 1.0 + res.both.last_at)
        # 4: arrivals while the batch holds every slot
        t0, w0 = time.monotonic(), datetime.now(UTC)
        chat = gw.client("chat")
        for _ in range(args.probes):
            # A random extra pause, so that the probes fall at random points of the lines' lives.
            time.sleep(max(0.0, t_end + args.quiet + jitter.uniform(0, 2) - time.monotonic()))
            res.probe_slots.append(gw.running().get("batch", 0.0))
            try:
                res.probes.append(probe(chat, args.max_tokens))
            except Exception as exc:  # counted, and the row goes on
                print(f"probe failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                res.probes_failed += 1
            t_end = time.monotonic()
        walls["probes"] = (w0, datetime.now(UTC))
        res.seqs["4"] = gw.mean_running(t0, t_end)
        res.status["3"] = cancel(client, batch)
    # usage rows, after the gateway wrote the last of them at its SIGTERM
    for row in ("alone", "both", "probes"):
        rows = usage_rows(gw, "interactive", *walls[row])
        res.queue_ms[row] = [q for _, q, _, _ in rows]
        res.served_ms[row] = [ttft - q for _, q, ttft, _ in rows]
    lines = usage_rows(gw, "batch", *walls["probes"])
    res.line_hold_ms = [total - q for _, q, _, total in lines]
    probe_rows = usage_rows(gw, "interactive", *walls["probes"])
    for ended, wait, _, total in probe_rows:
        # Its arrival at the gateway, not its send: a line that ends while the request is still
        # on its way hands its slot to the next batch line queued, as it should.
        arrived = ended - timedelta(milliseconds=total)
        first_end = next((at for at, *_ in lines if at > arrived), None)
        res.probe_waits.append((wait, None if first_end is None else (first_end - arrived).total_seconds() * 1000))
    return res


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms" if value >= 100 else f"{value:.1f} ms"


def report(args: argparse.Namespace, res: Results) -> bool:
    """Prints the table and the goals; True when every goal was met."""
    assert res.alone and res.both and res.batch_alone and res.batch_both
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    rate = args.load * capacity_rps(args.max_tokens)
    print(
        f"\nlaneway batch bench: {platform.machine()} {os.cpu_count()} cores ({cpu}), python "
        f"{platform.python_version()}; laneway serve on core {GATEWAY_CORE}, "
        f"clients on core {CLIENT_CORE}"
    )
    print(f"sim engine: {SIM}; capacity {capacity_rps(args.max_tokens):.1f} req/s of {args.max_tokens} tokens")
    print(
        f"interactive: Poisson {rate:.2f} req/s ({args.load:.0%} of capacity) for {args.duration:g} s, "
        f"max_tokens {args.max_tokens}; batch: {args.lines} lines, max_tokens {args.batch_tokens[0]}-"
        f"{args.batch_tokens[1]} (mean {res.line_tokens:.1f}), "
        f"measured over {args.batch_window:g} s alone; {args.probes} probes {args.quiet:g}-{args.quiet + 2:g} s "
        f"apart; "
        f"LANEWAY_BACKGROUND_RESERVE_SLOTS={args.reserve}\n"
    )
    a, b = res.alone, res.both
    a50, a99, b50, b99 = pct(a.ttft_ms, 0.5), pct(a.ttft_ms, 0.99), pct(b.ttft_ms, 0.5), pct(b.ttft_ms, 0.99)
    share = res.batch_both.tokens_s / res.batch_alone.tokens_s if res.batch_alone.tokens_s else 0.0
    hold50, hold_max = pct(res.line_hold_ms, 0.5), max(res.line_hold_ms, default=None)

    def seqs(row: str) -> str:
        s = res.seqs.get(row, {})
        return f"{s.get('batch', 0.0):.1f} + {sum(v for k, v in s.items() if k != 'batch'):.1f}"

    head = (
        "| row | interactive reqs (failed) | TTFT p50 | TTFT p99 | vs (1) p50 / p99 | slot wait p99 | "
        "TTFT less slot wait p99 | batch lines/s | batch tokens/s | vs (2) | seqs: batch + fg |"
    )
    print(head)
    print("|" + "|".join("---" for _ in head.split("|")[1:-1]) + "|")
    ratio50 = f"{b50 / a50:.2f}x" if a50 and b50 else "-"
    ratio99 = f"{b99 / a99:.2f}x" if a99 and b99 else "-"

    def waits(row: str) -> str:
        return f"{ms(pct(res.queue_ms[row], 0.99))} | {ms(pct(res.served_ms[row], 0.99))}"

    print(
        f"| 1 interactive alone | {len(a.ttft_ms)} ({a.failed}) | {ms(a50)} | {ms(a99)} | 1.00x / 1.00x | "
        f"{waits('alone')} | - | - | - | {seqs('1')} |"
    )
    print(
        f"| 2 batch alone | - | - | - | - | - | - | {res.batch_alone.lines_s:.2f} | {res.batch_alone.tokens_s:.0f} "
        f"| 1.00x | {seqs('2')} |"
    )
    print(
        f"| 3 both | {len(b.ttft_ms)} ({b.failed}) | {ms(b50)} | {ms(b99)} | {ratio50} / {ratio99} | "
        f"{waits('both')} | {res.batch_both.lines_s:.2f} | {res.batch_both.tokens_s:.0f} | {share:.2f}x | "
        f"{seqs('3')} |"
    )
    print(
        f"| 4 arrival, batch on every slot | {len(res.probes)} ({res.probes_failed}) | {ms(pct(res.probes, 0.5))} | "
        f"{ms(max(res.probes, default=None))} (max) | - | {waits('probes')} | - | - | - | {seqs('4')} |"
    )
    print(
        f"\nbatch line service time (slot held, {len(res.line_hold_ms)} lines ended in row 4): p50 {ms(hold50)}, "
        f"max {ms(hold_max)}; batch lines running before each probe: {res.probe_slots}"
    )
    for row, name in (("alone", "1"), ("both", "3")):
        waits_ms = res.queue_ms[row]
        waited = sum(w > WAITED_MS for w in waits_ms)
        print(
            f"row {name}: {waited} of {len(waits_ms)} interactive requests waited more than {WAITED_MS:g} ms for a "
            f"slot; slot wait p90 {ms(pct(waits_ms, 0.9))}, p95 {ms(pct(waits_ms, 0.95))}, "
            f"max {ms(max(waits_ms, default=None))}"
        )
    print(
        f"load generator lateness (max): row 1 {a.late_ms:.1f} ms, row 3 {b.late_ms:.1f} ms; "
        f"batches ended as {res.status}"
    )
    # The share of the engine's output the interactive streams take (tokens a second, against the
    # batch's alone): with every slot busy, what is left for the batch is at most 1 minus this.
    fg_share = b.tokens / max(1e-9, b.last_at) / max(1e-9, res.batch_alone.lines_s * res.line_tokens)
    firsts = [(w, r) for w, r in res.probe_waits if r is not None]
    took_first = sum(w <= r + FIRST_SLOT_SLACK_MS for w, r in firsts)
    print(
        "row 4, each probe's wait for a slot / from its arrival at the gateway to the next batch line's end (ms): "
        + ", ".join(f"{w:.0f}/{r:.0f}" for w, r in firsts)
    )
    goals = [
        ("row 3 TTFT p99 <= 1.2x row 1", bool(a99 and b99 and b99 <= 1.2 * a99), ratio99),
        (
            "row 3 batch throughput >= 0.9 of row 2",
            share >= 0.9,
            f"{share:.2f} (the interactive requests took {fg_share:.2f} of the engine: the most left is "
            f"{1 - fg_share:.2f})",
        ),
        (
            "row 4 arrival waits at most one batch line's remaining time (the first slot freed)",
            bool(firsts) and took_first == len(firsts) == len(res.probes),
            f"{took_first} of {len(res.probes)} probes took the first slot a line freed; arrival -> first token "
            f"max {ms(max(res.probes, default=None))}, a line's service time p50 {ms(hold50)}",
        ),
    ]
    print()
    for name, met, value in goals:
        print(f"goal: {name}: {value} -> {'MET' if met else 'NOT MET'}")
    return all(met for _, met, _ in goals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=150.0, help="seconds of interactive arrivals (rows 1, 3)")
    ap.add_argument("--load", type=float, default=0.25, help="interactive rate as a share of the engine's capacity")
    ap.add_argument("--lines", type=int, default=5000, help="lines per batch (rows 2, 3)")
    ap.add_argument("--batch-window", type=float, default=60.0, help="seconds the batch is measured alone (row 2)")
    ap.add_argument("--probes", type=int, default=8, help="single arrivals while the batch holds every slot (row 4)")
    ap.add_argument("--quiet", type=float, default=QUIET_S, help="seconds without foreground traffic before rows 2, 4")
    ap.add_argument("--max-tokens", type=int, default=32, help="the interactive answers' length")
    ap.add_argument("--batch-tokens", type=int, nargs=2, default=(32, 64), help="a batch line's max_tokens range")
    ap.add_argument("--reserve", type=int, default=0, help="LANEWAY_BACKGROUND_RESERVE_SLOTS (shipped: 0)")
    ap.add_argument(
        "--per-seq-ms",
        type=float,
        default=SIM["decode_ms_per_seq"],
        help="the decode step's cost per running sequence (2: CPU-like; a GPU's step grows far less)",
    )
    args = ap.parse_args()
    SIM["decode_ms_per_seq"] = args.per_seq_ms
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {CLIENT_CORE})  # the load generator, a child, inherits it
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="laneway-batch-bench-") as tmp:
        report(args, run(args, Path(tmp)))
    print(f"\nthe run took {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
