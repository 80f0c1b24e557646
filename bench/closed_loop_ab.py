"""Gateway CPU per request, this tree against another, in a closed loop: for a machine too loaded
for bench/overhead.py's open loop (there, requests late past the generator's timeout, or shed
as overload, fail, and the CPU per successful request swells with them).

The same fake engine and gateways as `bench/overhead.py --ab` (memory limits, pinned as there),
with load shedding off on both; each row sends N requests over C keep-alive connections, each
waiting for its answer before the next (no deadline: every request succeeds), and reads the
gateway's CPU time (utime + stime) across the row. Rows alternate between the trees round after
round (the first tree in a round alternates too); the medians and this tree's ratio.

Run: PYTHONPATH=platform .venv/bin/python bench/closed_loop_ab.py OTHER_TREE [--rounds 5]
     [--requests 1500] [--connections 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import overhead as o  # bench/ is on sys.path: this script's own folder

NO_SHEDDING = {
    "LANEWAY_SHED_LOOP_DELAY_S": "0",
    "LANEWAY_SHED_MAX_PREPARING": "0",
    "LANEWAY_SHED_STANDING_PREPARING": "0",
}
KINDS = {"non-streaming": False, "16-chunk streams": True}


async def closed_loop(port: int, key: str, stream: bool, count: int, connections: int) -> int:
    """Send `count` requests over `connections` keep-alive connections; the non-200 answers."""
    body = json.dumps({**o.BODY, "stream": stream}).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    left, failed = [count], [0]

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while left[0] > 0:
            left[0] -= 1
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if b" 200 " not in head.split(b"\r\n", 1)[0]:
                failed[0] += 1
            if b"chunked" in head.lower():
                got = b""
                while not got.endswith(b"0\r\n\r\n"):
                    got += await reader.read(65536)
            else:
                length = next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
                await reader.readexactly(int(length.split(b":")[1]))
        writer.close()

    await asyncio.gather(*(connection() for _ in range(connections)))
    return failed[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("other", type=Path, help="the baseline tree (its platform/ goes first on PYTHONPATH)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1500, help="per row")
    ap.add_argument("--connections", type=int, default=8)
    args = ap.parse_args()
    other = args.other.resolve() / "platform"
    if not (other / "laneway").is_dir():
        raise SystemExit(f"{args.other} has no platform/laneway")
    trees = {"baseline": {"PYTHONPATH": str(other), **NO_SHEDDING}, "this tree": dict(NO_SHEDDING)}
    got: dict[tuple[str, str], list[float]] = {}
    with o.bench_services() as (work, upstream, _):
        with (
            o.gateway(upstream, work, None, shared_slots=False, env_extra=trees["baseline"]) as base,
            o.gateway(upstream, work, None, shared_slots=False, env_extra=trees["this tree"]) as this,
        ):
            gateways = {"baseline": base, "this tree": this}
            for _, port, key in gateways.values():  # warm: connections, caches, the latency models
                for stream in KINDS.values():
                    asyncio.run(closed_loop(port, key, stream, 300, args.connections))
            for round_ in range(args.rounds):
                order = list(gateways.items()) if round_ % 2 == 0 else list(reversed(gateways.items()))
                for kind, stream in KINDS.items():
                    for tree, (proc, port, key) in order:
                        o.alone_on_core(proc)
                        time.sleep(0.2)
                        before = o.cpu_seconds(proc.pid)
                        failed = asyncio.run(closed_loop(port, key, stream, args.requests, args.connections))
                        time.sleep(0.3)  # the row's usage flush and lease releases
                        used = o.cpu_seconds(proc.pid) - before
                        got.setdefault((kind, tree), []).append(used * 1000 / args.requests)
                        if failed:
                            print(f"{tree}, {kind}: {failed} answers were not 200", file=sys.stderr)
    print(
        f"# bench/closed_loop_ab.py {args.other} --rounds {args.rounds} --requests {args.requests} "
        f"--connections {args.connections} ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})"
    )
    print("\n| kind | tree | gateway CPU / request (median) | vs baseline | every round |\n|---|---|---|---|---|")
    for kind in KINDS:
        base_cpu = statistics.median(got[(kind, "baseline")])
        for tree in trees:
            rows = got[(kind, tree)]
            cpu = statistics.median(rows)
            print(f"| {kind} | {tree} | {cpu:.3f} ms | {cpu / base_cpu:.2f}x | {' '.join(f'{r:.2f}' for r in rows)} |")


if __name__ == "__main__":
    main()
