"""What laneway adds on top of calling the same engine directly.

Engine: the tiny llama.cpp demo model (random weights, end tokens banned so every request
generates exactly --max-tokens tokens), `parallel` slots, on this machine's CPU.
Baseline ("direct"): the same LlamaCppEngine adapter called in-process by this script.
Gateway: `laneway serve` in a subprocess on loopback, called with httpx (HTTP/1.1, pooled),
so the gateway's HTTP, auth, validation, measuring, stop enforcement, SSE framing and
usage accounting are all in the measured path.
Metrics: end-to-end latency of non-streaming requests and time to the first content token
of streaming ones, p50/p99, at concurrency 1 and 32. Ratios matter, not absolute times.

Run: .venv/bin/python bench/overhead.py [--requests 200] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN, write_demo_model
from laneway.engines.llamacpp import LlamaCppEngine
from laneway.types import GenerationRequest

PROMPT = "hello world, the model is a test of the gateway"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_concurrent(n: int, concurrency: int, one) -> list[float]:  # type: ignore[no-untyped-def]
    sem = asyncio.Semaphore(concurrency)
    out: list[float] = []

    async def task(i: int) -> None:
        async with sem:
            out.append(await one(i))

    await asyncio.gather(*(task(i) for i in range(n)))
    return out


def engine_config(model: Path, parallel: int) -> dict[str, object]:
    return {"model_path": str(model), "parallel": parallel, "demo": True, "ban_tokens": [EOS_TOKEN, IM_END_TOKEN]}


async def direct(model: Path, args: argparse.Namespace, concurrency: int, stream: bool) -> list[float]:
    engine = LlamaCppEngine("bench", engine_config(model, args.parallel), max_model_len=512)
    await engine.start()
    tokens = (await engine.measure(prompt=PROMPT)).tokens

    async def one(i: int) -> float:
        t0 = time.perf_counter()
        req = GenerationRequest(
            request_id=str(i), prompt=PROMPT, prompt_tokens=tokens, max_tokens=args.max_tokens, seed=i
        )
        first = None
        async for d in engine.generate(req):
            if first is None and d.text:
                first = time.perf_counter() - t0
        return (first if stream and first is not None else time.perf_counter() - t0) * 1000

    try:
        await run_concurrent(10, concurrency, one)  # warm
        return await run_concurrent(args.requests, concurrency, one)
    finally:
        await engine.close()


async def via_gateway(url: str, key: str, args: argparse.Namespace, concurrency: int, stream: bool) -> list[float]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, limits=limits, timeout=60
    ) as client:

        async def one(i: int) -> float:
            body = {"model": "bench", "prompt": PROMPT, "max_tokens": args.max_tokens, "seed": i, "stream": stream}
            t0 = time.perf_counter()
            if not stream:
                r = await client.post("/v1/completions", json=body)
                r.raise_for_status()
                return (time.perf_counter() - t0) * 1000
            async with client.stream("POST", "/v1/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                        return (time.perf_counter() - t0) * 1000
            raise RuntimeError("stream ended without content")

        await run_concurrent(10, concurrency, one)
        return await run_concurrent(args.requests, concurrency, one)


def start_gateway(data: Path, model: Path, parallel: int, port: int) -> tuple[subprocess.Popen[bytes], str]:
    env = {
        **os.environ,
        "LANEWAY_DATA_DIR": str(data),
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_LOG_LEVEL": "warning",
    }
    exe = str(Path(sys.executable).with_name("laneway"))

    def cli(*a: str) -> str:
        return subprocess.run([exe, *a], env=env, check=True, capture_output=True, text=True).stdout.strip()

    cli(
        "model",
        "set",
        "bench",
        "--engine",
        "llamacpp",
        "--max-model-len",
        "512",
        "--config",
        json.dumps(engine_config(model, parallel)),
    )
    cli("tenant", "create", "bench")
    key = cli("key", "issue", "bench")
    proc = subprocess.Popen([exe, "serve", "--port", str(port)], env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/ready").status_code == 200:
                return proc, key
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("gateway did not become ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--port", type=int, default=18931)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        model = write_demo_model(data / "tiny.gguf")
        proc, key = start_gateway(data, model, args.parallel, args.port)
        url = f"http://127.0.0.1:{args.port}"
        rows = []
        try:
            for concurrency in (1, 32):
                for stream in (False, True):
                    base = asyncio.run(direct(model, args, concurrency, stream))
                    gw = asyncio.run(via_gateway(url, key, args, concurrency, stream))
                    rows.append((concurrency, "stream TTFT" if stream else "non-stream e2e", base, gw))
        finally:
            proc.terminate()
            proc.wait(10)
    print(
        f"\nlaneway overhead: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; "
        f"tiny llama.cpp model, parallel={args.parallel}, max_tokens={args.max_tokens}, "
        f"{args.requests} requests per cell; baseline = same engine adapter called in-process\n"
    )
    head = (
        f"| {'conc':>4} | {'metric':<15} | {'direct p50':>10} | {'direct p99':>10} | {'laneway p50':>11} | "
        f"{'laneway p99':>11} | {'added p50':>9} | {'ratio p50':>9} | {'ratio p99':>9} |"
    )
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for concurrency, metric, base, gw in rows:
        b50, b99, g50, g99 = pct(base, 0.5), pct(base, 0.99), pct(gw, 0.5), pct(gw, 0.99)
        print(
            f"| {concurrency:>4} | {metric:<15} | {b50:>8.2f}ms | {b99:>8.2f}ms | {g50:>9.2f}ms | {g99:>9.2f}ms | "
            f"{g50 - b50:>7.2f}ms | {g50 / b50:>8.2f}x | {g99 / b99:>8.2f}x |"
        )
    print(f"\n(mean direct non-stream at c=1: {statistics.mean(rows[0][2]):.2f} ms)")


if __name__ == "__main__":
    main()
