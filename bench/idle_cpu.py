"""laneway's own CPU: what an idle gateway spends, and what it spends per request at a low
steady rate, where its background work (polls, timers, flushes) is most of the bill.

Setup, all on this machine: `laneway serve` on a fresh SQLite database with one in-process sim
deployment (a few milliseconds a step, no model), pinned to one core (taskset; the load
generator runs on the other). Its CPU is read from /proc (utime + stime of every thread), its
wake-ups as voluntary context switches (/proc/PID/task/*/status).
- idle: no request for --idle-seconds after a settle; CPU milliseconds per second and
  wake-ups per second.
- steady: --rate short non-streamed chat completions a second (bench/loadgen.py: open loop)
  for --seconds; CPU per request, background included (what the rate costs all told).
With `--ab DIR`, a second gateway runs another source tree (its platform/ first on
PYTHONPATH, its database seeded with its own migrations), started and measured beside this
tree's: both idle windows at once, the steady rows one after the other, their order swapped
each round. The table: medians of the rounds and this tree's ratio to the other.

Run: PYTHONPATH=platform .venv/bin/python bench/idle_cpu.py [--rounds 3] [--idle-seconds 30]
     [--rate 8] [--seconds 20] [--ab DIR]
(an older tree to compare: git archive main | tar -x -C /tmp/laneway-before)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's seeding helper and server factory
sys.path.insert(0, str(ROOT / "bench"))

from overhead import GATEWAY_CORE, OTHER_CORE, cpu_seconds, load, pct, pin, seed_with_tree  # noqa: E402
from support import serve, sim_model  # noqa: E402

BODY = {"model": "m", "messages": [{"role": "user", "content": "say hello"}], "max_tokens": 8}
SIM = {"max_concurrency": 8, "decode_ms_base": 2.0, "decode_ms_per_seq": 0.1, "prefill_ms_per_token": 0.0}
SETTLE_S = 5.0  # after start (warm-up, the first polls) and after each steady row


def wakeups(pid: int) -> int:
    """Voluntary context switches of every thread so far: how often the process slept and was woken."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return total


@contextmanager
def gateway(work: Path, name: str, platform_path: str | None) -> Iterator[tuple[subprocess.Popen[bytes], int, str]]:
    """`laneway serve` of one tree on its own SQLite database, pinned to the gateway core."""
    url = f"sqlite+aiosqlite:///{work / f'{name}.db'}"
    what = {"models": {"m": sim_model("m", **SIM)}, "tenants": {"bench": {}}}
    keys = seed_with_tree(url, what, platform_path or str(ROOT / "platform"))
    env = {
        **os.environ,
        "LANEWAY_DATA_DIR": str(work / f"data-{name}"),
        "LANEWAY_DATABASE_URL": url,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_LOG_LEVEL": "warning",
    }
    # This tree's code, not the installed laneway's (an editable install may be another checkout's).
    env["PYTHONPATH"] = platform_path or str(ROOT / "platform")
    proc, port = serve(env)
    pin(proc, GATEWAY_CORE)
    try:
        yield proc, port, keys["bench"]
    finally:
        proc.terminate()
        proc.wait(30)


def idle(procs: dict[str, subprocess.Popen[bytes]], seconds: float) -> dict[str, dict[str, float]]:
    """Every gateway's CPU (ms/s) and wake-ups (/s) over one window with no request."""
    before = {tree: (cpu_seconds(p.pid), wakeups(p.pid)) for tree, p in procs.items()}
    start = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - start
    out = {}
    for tree, p in procs.items():
        cpu, woken = cpu_seconds(p.pid) - before[tree][0], wakeups(p.pid) - before[tree][1]
        out[tree] = {"cpu_ms_s": cpu * 1000 / elapsed, "wakeups_s": woken / elapsed}
    return out


def steady(proc: subprocess.Popen[bytes], port: int, key: str, rate: float, seconds: float) -> dict[str, float]:
    """CPU per successful request (background included) at `rate` for `seconds`."""
    before = cpu_seconds(proc.pid)
    res = load(f"http://127.0.0.1:{port}/v1/chat/completions", rate, seconds, key, False, BODY)
    used = cpu_seconds(proc.pid) - before
    ok = len(res["latencies"].get("200", []))
    return {
        "cpu_ms_req": used * 1000 / max(1, ok),
        "ok": ok / max(1, res["sent"]),
        "p50": pct(res["latencies"].get("200", []), 0.5),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=8.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--ab", help="another source tree (a checkout or an archive of one) to measure beside this one")
    args = ap.parse_args()
    trees: dict[str, str | None] = {}
    if args.ab:
        other = Path(args.ab).resolve() / "platform"
        if not (other / "laneway").is_dir():
            raise SystemExit(f"{args.ab} has no platform/laneway")
        trees["baseline"] = str(other)
    trees["this tree"] = None
    got: dict[tuple[str, str], list[float]] = {}
    work = Path(tempfile.mkdtemp(prefix="lw-idle-cpu-"))
    with ExitStack() as stack:
        gws = {tree: stack.enter_context(gateway(work, f"gw{i}", path)) for i, (tree, path) in enumerate(trees.items())}
        time.sleep(SETTLE_S)
        for n in range(args.rounds):
            for tree, row in idle({t: g[0] for t, g in gws.items()}, args.idle_seconds).items():
                got.setdefault((tree, "idle cpu"), []).append(row["cpu_ms_s"])
                got.setdefault((tree, "idle wakeups"), []).append(row["wakeups_s"])
            order = list(gws) if n % 2 == 0 else list(reversed(gws))
            for tree in order:
                proc, port, key = gws[tree]
                row = steady(proc, port, key, args.rate, args.seconds)
                got.setdefault((tree, "cpu/req"), []).append(row["cpu_ms_req"])
                got.setdefault((tree, "ok"), []).append(row["ok"])
                got.setdefault((tree, "p50"), []).append(row["p50"])
                time.sleep(SETTLE_S)  # the recorder's flush and the like: not the next row's
    report(args, trees, got)
    print("\n```json\n" + json.dumps({f"{t} / {k}": v for (t, k), v in got.items()}) + "\n```")


def report(args: argparse.Namespace, trees: dict[str, str | None], got: dict[tuple[str, str], list[float]]) -> None:
    base = "baseline" if "baseline" in trees else "this tree"
    print(
        f"# bench/idle_cpu.py{f' --ab {args.ab}' if args.ab else ''} on {platform.node()} ({os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}); gateways pinned to core {GATEWAY_CORE}, the load generator to core "
        f"{OTHER_CORE}; {args.idle_seconds:g} s idle windows (all gateways at once), {args.rate:g} req/s for "
        f"{args.seconds:g} s (one gateway at a time, the order swapped each round); medians of {args.rounds} "
        "rounds\n"
    )
    print(
        "| tree | idle CPU (ms/s) | vs baseline | idle wake-ups (/s) | vs baseline | CPU / request at "
        f"{args.rate:g}/s (ms) | vs baseline | success | p50 (ms) | every round: idle ms/s; ms/request |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    med = {key: pct(values, 0.5) for key, values in got.items()}
    for tree in trees:
        every = " / ".join(
            f"{i:.1f}; {r:.2f}" for i, r in zip(got[(tree, "idle cpu")], got[(tree, "cpu/req")], strict=True)
        )
        print(
            f"| {tree} | {med[(tree, 'idle cpu')]:.2f} | {ratio(med, tree, base, 'idle cpu')} "
            f"| {med[(tree, 'idle wakeups')]:.0f} | {ratio(med, tree, base, 'idle wakeups')} "
            f"| {med[(tree, 'cpu/req')]:.2f} | {ratio(med, tree, base, 'cpu/req')} "
            f"| {med[(tree, 'ok')] * 100:.1f} % | {med[(tree, 'p50')]:.1f} | {every} |"
        )


def ratio(med: dict[tuple[str, str], Any], tree: str, base: str, key: str) -> str:
    baseline = med[(base, key)]
    return f"{med[(tree, key)] / baseline:.2f}x" if baseline else "-"


if __name__ == "__main__":
    main()
