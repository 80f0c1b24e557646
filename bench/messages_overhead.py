"""Anthropic's Messages API against chat completions: the gateway's CPU per request for the same
conversation on each surface (issue: "CPU per request of /v1/messages within 10 % of chat
completions'").

The setup is bench/overhead.py's: a fake OpenAI-protocol engine that answers at once
(bench/upstream.py, 16 tokens), one `laneway serve` pinned to one core in front of it as a vLLM
deployment, the open-loop load generator on the other core. Both surfaces reach the engine's
/v1/chat/completions (laneway translates a Messages request into the chat intent), so the
difference is laneway's own translation: the Messages body in, Anthropic's answer or event
stream out. Rows interleave round after round; the table shows medians and each round.

Run: .venv/bin/python bench/messages_overhead.py [--rounds 3] [--rate 300] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import platform
from typing import Any

from overhead import alone_on_core, bench_services, cpu_seconds, every, fmt, gateway, load, pct, row, settle

CONVERSATION = [{"role": "user", "content": "hello there, how are you"}]
SURFACES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat completions": ("/v1/chat/completions", {"model": "m", "messages": CONVERSATION, "max_tokens": 16}),
    "messages": ("/v1/messages", {"model": "m", "messages": CONVERSATION, "max_tokens": 16}),
}


def measure_surface(
    port: int, proc: Any, key: str, path: str, body: dict[str, Any], rate: float, seconds: float, stream: bool
) -> dict[str, Any]:
    alone_on_core(proc)
    before = cpu_seconds(proc.pid)
    res = load(f"http://127.0.0.1:{port}{path}", rate, seconds, key, stream, body)
    used = cpu_seconds(proc.pid) - before
    ok = len(res["latencies"].get("200", []))
    return row(path, rate, res, used * 1000 / max(1, ok))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=300.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    got: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    with (
        bench_services() as (work, up_url, _redis),
        gateway(up_url, work, None, shared_slots=False) as (proc, port, key),
    ):
        for path, body in SURFACES.values():  # warm both paths before measuring
            load(f"http://127.0.0.1:{port}{path}", 100, 1, key, False, body)
        for _ in range(args.rounds):
            for stream in (False, True):
                for surface, (path, body) in SURFACES.items():
                    settle(port, quiet_s=0.3)
                    r = measure_surface(port, proc, key, path, body, args.rate, args.seconds, stream)
                    got.setdefault((surface, stream), []).append(r)
    print(
        f"# bench/messages_overhead.py --rounds {args.rounds} --rate {args.rate:g} --seconds {args.seconds:g} "
        f"on {platform.node()} ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}); medians of interleaved rounds"
    )
    print("\n| answer | surface | p50 | p99 | success | gateway CPU / request | vs chat completions | every round |")
    print("|---|---|---|---|---|---|---|---|")
    for stream in (False, True):
        base = pct([r["cpu_ms"] for r in got[("chat completions", stream)]], 0.5)
        for surface in SURFACES:
            rs = got[(surface, stream)]
            cpu = pct([r["cpu_ms"] for r in rs], 0.5)
            print(
                f"| {'16-token stream' if stream else 'whole'} | {surface} | {fmt(pct([r['p50'] for r in rs], 0.5))} "
                f"| {fmt(pct([r['p99'] for r in rs], 0.5))} | {pct([r['success'] for r in rs], 0.5) * 100:.1f} % "
                f"| {fmt(cpu)} | {cpu / base:.2f}x | {every(rs)} |"
            )


if __name__ == "__main__":
    main()
