"""Fair admission under a flood, and one engine's slots shared by 1, 2 and 3 gateway replicas.

(a) Fair admission (one `laneway serve`, the sim engine: 4 sequences, then 8, 2 ms a decode
    step; interactive lane of depth 64, 2 s queue timeout). Tenant B sends one short stream at
    a time (8 tokens); tenant F keeps 100 short streams (40 tokens, then 64) in flight. B's time to first
    token, unloaded (F idle) and during F's flood, in the same run; B's refusals.
    Goal: loaded p50/p99 <= 1.5x unloaded, 0 refused. --pin puts F's client process (100
    clients parsing thousands of SSE lines a second: a core's worth of Python) on the last
    core and the gateway and B on the others; by default they all share every core. --rounds
    N repeats each row, interleaved, and pools B's samples.
(b) Shared slots (1, 2, 3 `laneway serve` replicas on one Redis, in front of one remote engine:
    the vLLM protocol stand-in, 8 slots, 10 ms a token, in this process; it records the most
    requests it ever had in flight). 80 concurrent clients (10x its slots) spread over the
    replicas, in a child process, for a fixed time; a refused client waits 50 ms before its
    next request (SDKs back off; without it the refusals, not the slots, set the pace).
    Reported: the engine's in-flight maximum vs its cap, and
    completed requests per second vs one replica.
    Goal: never over the cap; throughput within 10 % of one replica's.
(c) The same replicas with a noisy tenant spread over all of them (long prompts, 300 tokens
    each, in the standard lane: at most 6 of the 8 slots) while a short-prompt client streams
    through replica 1: its TTFT p99 vs unloaded (the same client alone), in the same run.
    Goal: <= 1.5x.

Run: .venv/bin/python bench/scaleout.py [--seconds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's seeding helper, server factory, stand-in

from standins.vllm_server import VLLMStandIn  # noqa: E402
from support import (  # noqa: E402
    PrivateRedis,
    ServerThread,
    seed,
    serve,
    sim_model,
)

INTERACTIVE = {
    "name": "interactive",
    "priority": 0,
    "match_max_prompt_tokens": 511,
    "match_stream": True,
    "max_concurrency": 8,
    "max_queue_depth": 64,
    "queue_timeout_s": 2.0,
    "max_unacked_tokens": 100_000,
}
STANDARD = {
    "name": "standard",
    "priority": 1,
    "max_concurrency": 6,
    "max_queue_depth": 512,
    "queue_timeout_s": 60.0,
    "max_unacked_tokens": 100_000,
}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def stream_ttft(c: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[int, str | None, float | None]:
    started = time.perf_counter()
    async with c.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, r.json().get("error", {}).get("code"), None
        ttft = None
        async for line in r.aiter_lines():
            if ttft is None and line.startswith("data: {") and ('"text":" ' in line or '"content":" ' in line):
                ttft = time.perf_counter() - started
        return 200, None, ttft


class BackgroundLoad:
    """Clients in a child process (`--load`), so their work never slows the measuring client."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def outcomes(self) -> Counter[str]:
        out, _ = self.proc.communicate(timeout=300)
        return Counter(json.loads(out.strip().splitlines()[-1]))


def background_load(
    urls: list[str],
    key: str,
    body: dict[str, Any],
    *,
    clients: int,
    seconds: float,
    retry_s: float = 0.01,
    cores: set[int] | None = None,
) -> BackgroundLoad:
    spec = json.dumps(
        {"urls": urls, "key": key, "body": body, "clients": clients, "seconds": seconds, "retry_s": retry_s}
    )
    proc = subprocess.Popen(
        [sys.executable, __file__, "--load", spec],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_pin_to(cores or set()),
    )
    return BackgroundLoad(proc)


def _pin_to(cores: set[int]) -> Any:
    return (lambda: os.sched_setaffinity(0, cores)) if cores else None


def pin(enabled: bool) -> tuple[set[int], str]:
    """--pin: this process (B's client, and the gateways it starts) on every core but the last;
    -> the cores for the flooding clients (none: anywhere) and how the cores were shared."""
    cores = sorted(os.sched_getaffinity(0))
    if not enabled or len(cores) < 2:
        return set(), "unpinned: the gateway, B and F's clients share every core"
    os.sched_setaffinity(0, set(cores[:-1]))
    return {cores[-1]}, f"pinned: the gateway and B on cores {cores[:-1]}, F's client process on core {cores[-1]}"


def run_load(spec: dict[str, Any]) -> None:
    """The child: keep `clients` requests in flight (a refused one retries after retry_s)."""

    async def go() -> Counter[str]:
        outcomes: Counter[str] = Counter()
        limits = httpx.Limits(max_connections=spec["clients"] + 10)
        async with httpx.AsyncClient(
            headers={"Authorization": f"Bearer {spec['key']}"}, timeout=120, limits=limits
        ) as c:
            end = time.monotonic() + spec["seconds"]

            async def client(i: int) -> None:
                url = spec["urls"][i % len(spec["urls"])]
                while time.monotonic() < end:
                    try:
                        if spec["body"].get("stream"):
                            status, code, _ = await stream_ttft(c, url, spec["body"])
                        else:
                            r = await c.post(url, json=spec["body"])
                            status, code = r.status_code, None if r.is_success else r.json()["error"]["code"]
                    except httpx.HTTPError as exc:
                        status, code = 0, type(exc).__name__
                    outcomes[code or str(status)] += 1
                    if status != 200:
                        await asyncio.sleep(spec.get("retry_s", 0.01))

            await asyncio.gather(*(client(i) for i in range(spec["clients"])))
        return outcomes

    print(json.dumps(asyncio.run(go())))


# ---- (a) fair admission ---------------------------------------------------------------------


def fair_admission(
    seconds: float,
    work: Path,
    slots: int = 4,
    flood_tokens: int = 40,
    rounds: int = 1,
    flood_cores: set[int] | None = None,
) -> list[str]:
    url = f"sqlite+aiosqlite:///{work / f'fair-{slots}.db'}"
    model = sim_model("sim", max_concurrency=slots, decode_ms_base=2.0, decode_ms_per_seq=0.0)
    lanes = [{**INTERACTIVE, "max_concurrency": slots}, STANDARD]
    keys = asyncio.run(seed(url, models={"sim": model}, lanes=lanes, tenants={"f": {}, "b": {}}))
    env = {
        **os.environ,
        "LANEWAY_DATA_DIR": str(work / f"fair-{slots}"),
        "LANEWAY_DATABASE_URL": url,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_LOG_LEVEL": "error",
    }
    proc, port = serve(env)
    base = f"http://127.0.0.1:{port}/v1/completions"

    body_b = {"model": "sim", "prompt": "hello", "max_tokens": 8, "stream": True}
    body_f = {"model": "sim", "prompt": "flood", "max_tokens": flood_tokens, "stream": True}

    async def b_for(duration: float) -> tuple[list[float], Counter[str]]:
        ttfts: list[float] = []
        refused: Counter[str] = Counter()
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {keys['b']}"}, timeout=30) as b:
            end = time.monotonic() + duration
            while time.monotonic() < end:
                status, code, ttft = await stream_ttft(b, base, body_b)
                if ttft is not None:
                    ttfts.append(ttft)
                else:
                    refused[code or str(status)] += 1
                await asyncio.sleep(0.02)
        return ttfts, refused

    rows = {
        "unloaded": None,
        "F floods, retrying at once (10 ms)": 0.01,
        "F floods, retrying after its Retry-After (1 s)": 1.0,
    }
    ttfts: dict[str, list[float]] = {label: [] for label in rows}
    b_refused: dict[str, Counter[str]] = {label: Counter() for label in rows}
    f_outcomes: dict[str, Counter[str]] = {label: Counter() for label in rows}
    try:
        for _ in range(rounds):  # rows interleaved, round after round: the machine's drift hits each alike
            for label, retry_s in rows.items():
                flood = None
                if retry_s is not None:
                    # The flood runs in its own process: its 100 clients must not slow B's own event loop.
                    flood = background_load(
                        [base], keys["f"], body_f, clients=100, seconds=seconds + 2, retry_s=retry_s, cores=flood_cores
                    )
                    time.sleep(1.0)
                loaded, refused = asyncio.run(b_for(seconds))
                ttfts[label] += loaded
                b_refused[label] += refused
                if flood is not None:
                    f_outcomes[label] += flood.outcomes()
    finally:
        proc.terminate()
        proc.wait(30)
    out = [
        "| tenant B | requests | TTFT p50 | TTFT p99 | ratio p50 / p99 | B refused | F served / refused |",
        "|---|---|---|---|---|---|---|",
    ]
    base_ttft = ttfts["unloaded"]
    for label, values in ttfts.items():
        ratio = f"{pct(values, 0.5) / pct(base_ttft, 0.5):.2f}x / {pct(values, 0.99) / pct(base_ttft, 0.99):.2f}x"
        outcomes = f_outcomes[label]
        f_refused = sum(n for k, n in outcomes.items() if k != "200")
        f_cell = "-" if rows[label] is None else f"{outcomes['200']} / {f_refused}"
        refused_b = sum(b_refused[label].values())
        codes = f" ({', '.join(f'{k} {n}' for k, n in b_refused[label].items())})" if refused_b else ""
        out.append(
            f"| {label} | {len(values) + refused_b} | {pct(values, 0.5) * 1000:.1f} ms "
            f"| {pct(values, 0.99) * 1000:.1f} ms | {ratio} | {refused_b}{codes} | {f_cell} |"
        )
    out.append("\nGoal: B's TTFT <= 1.5x unloaded, 0 refused.")
    return out


# ---- (b) and (c): replicas sharing one remote engine -----------------------------------------


@contextmanager
def replicas(
    n: int, engine: VLLMStandIn, work: Path, *, shared: bool = True
) -> Iterator[tuple[list[int], dict[str, str]]]:
    redis = PrivateRedis().start()
    url = f"sqlite+aiosqlite:///{work / f'replicas-{uuid.uuid4().hex[:6]}.db'}"
    config = {
        "base_url": engine.base_url,
        "model": "m",
        "max_concurrency": 8,
        "metrics_poll_s": 0,
        "tokenize": False,  # type: ignore[attr-defined]
        "shared_slots": shared,
    }
    models = {"m": [{"name": "m-vllm", "engine_kind": "vllm", "max_model_len": 100_000, "config": config}]}
    tenants = {"load": {"max_concurrency": 10_000}, "short": {}, "noisy": {"max_concurrency": 10_000}}
    keys = asyncio.run(seed(url, models=models, lanes=[INTERACTIVE, STANDARD], tenants=tenants))
    procs: list[subprocess.Popen[bytes]] = []
    ports = []
    try:
        for i in range(n):
            env = {
                **os.environ,
                "LANEWAY_DATA_DIR": str(work / f"r{i}-{uuid.uuid4().hex[:4]}"),
                "LANEWAY_DATABASE_URL": url,
                "LANEWAY_BOOTSTRAP_DEMO": "false",
                "LANEWAY_REDIS_URL": redis.url,
                "LANEWAY_DEFAULT_MAX_TOKENS": "100000",
                "LANEWAY_LOG_LEVEL": "error",
            }
            proc, port = serve(env)
            procs.append(proc)
            ports.append(port)
        yield ports, keys
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        redis.stop()


def load(ports: list[int], key: str, clients: int, seconds: float) -> tuple[int, float]:
    """`clients` concurrent clients (round-robin over the replicas) sending 20-token streams for
    `seconds`, in a child process (the engine stand-in runs in this one: sharing its GIL with 80
    clients would slow the engine, not the gateway); a refused client waits 50 ms, as SDKs back
    off. (completed, requests per second)."""
    urls = [f"http://127.0.0.1:{p}/v1/completions" for p in ports]
    body = {"model": "m", "prompt": "go", "max_tokens": 20, "stream": True}
    outcomes = background_load(urls, key, body, clients=clients, seconds=seconds, retry_s=0.05).outcomes()
    done = outcomes.get("200", 0)
    return done, done / seconds  # (the child's start-up is not in its measured window)


def short_ttfts(port: int, key: str, seconds: float) -> list[float]:
    async def run() -> list[float]:
        out: list[float] = []
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
            end = time.monotonic() + seconds
            url = f"http://127.0.0.1:{port}/v1/completions"
            body = {"model": "m", "prompt": "hi", "max_tokens": 4, "stream": True}
            while time.monotonic() < end:
                _, _, ttft = await stream_ttft(c, url, body)
                if ttft is not None:
                    out.append(ttft)
                await asyncio.sleep(0.02)
        return out

    return asyncio.run(run())


def scale_out(seconds: float, work: Path) -> list[str]:
    engine = VLLMStandIn(token_delay_s=0.01)
    server = ServerThread(engine.app).start(wait_ready=False)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the stand-in's app logs at INFO: not each request
    engine.base_url = server.base_url  # type: ignore[attr-defined]
    rows_b = [
        "| replicas | slots shared | engine in flight max / cap | completed | req/s | vs 1 replica |",
        "|---|---|---|---|---|---|",
    ]
    rows_c = [
        "| replicas | short-prompt TTFT p50 unloaded | p99 unloaded | p50 noisy | p99 noisy | p99 ratio |",
        "|---|---|---|---|---|---|",
    ]
    base_rps = None
    try:
        for n, shared in ((1, True), (2, True), (3, True), (2, False)):
            with replicas(n, engine, work, shared=shared) as (ports, keys):
                engine.max_running = 0
                done, rps = load(ports, keys["load"], 80, seconds)  # streams: the interactive lane, 8 slots
                base_rps = base_rps or rps
                rows_b.append(
                    f"| {n} | {'yes' if shared else 'no (per-replica slots)'} | {engine.max_running} / 8 "
                    f"| {done} | {rps:.1f} | {rps / base_rps:.2f}x |"
                )
                if not shared:
                    continue
                calm = short_ttfts(ports[0], keys["short"], seconds)
                urls = [f"http://127.0.0.1:{p}/v1/completions" for p in ports]
                long_body = {"model": "m", "prompt": "word " * 3000, "max_tokens": 30}
                noisy_load = background_load(urls, keys["noisy"], long_body, clients=24, seconds=seconds + 2)
                time.sleep(1.0)
                noisy = short_ttfts(ports[0], keys["short"], seconds)
                noisy_load.outcomes()
                rows_c.append(
                    f"| {n} | {pct(calm, 0.5) * 1000:.1f} ms | {pct(calm, 0.99) * 1000:.1f} ms "
                    f"| {pct(noisy, 0.5) * 1000:.1f} ms | {pct(noisy, 0.99) * 1000:.1f} ms "
                    f"| {pct(noisy, 0.99) / pct(calm, 0.99):.2f}x |"
                )
    finally:
        server.stop()
    return [
        "(b) one engine (8 slots) behind N replicas, 80 concurrent clients",
        *rows_b,
        "",
        "(c) short prompts through replica 1 while a noisy tenant sends long prompts through all",
        *rows_c,
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--only", choices=("a", "bc"), help="run only part (a), or only (b) and (c)")
    ap.add_argument("--rounds", type=int, default=1, help="(a): each row again, interleaved; samples pooled")
    ap.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="(a): F's clients on the last core, the gateway and B on the others",
    )
    ap.add_argument("--load", help=argparse.SUPPRESS)  # internal: run background clients
    args = ap.parse_args()
    if args.load:
        run_load(json.loads(args.load))
        return
    work = Path(tempfile.mkdtemp(prefix="lw-scaleout-"))
    print(
        f"# bench/scaleout.py on {platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()}), "
        f"{args.seconds:g} s per measurement"
    )
    if args.only != "bc":
        every = os.sched_getaffinity(0)
        flood_cores, shared = pin(args.pin)
        print(f"\n(a) cores: {shared}; {args.rounds} round(s), rows interleaved")
        for slots, tokens in ((4, 40), (8, 64)):
            print(
                f"\n(a) fair admission: tenant B while tenant F floods the interactive lane "
                f"({slots} slots, F's streams {tokens} tokens)"
            )
            print("\n".join(fair_admission(args.seconds, work, slots, tokens, args.rounds, flood_cores)))
        os.sched_setaffinity(0, every)
        print()
    if args.only != "a":
        print("\n".join(scale_out(args.seconds, work)))


if __name__ == "__main__":
    main()
