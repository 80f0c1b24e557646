"""What tracing costs per request: off (the default) against on, and off against the code
before tracing existed (run this same script with that tree's PYTHONPATH).

Setup, in one process on this machine: the app (create_app) driven through Litestar's
AsyncTestClient (in-memory ASGI, no sockets, so the numbers are the app's own), a sim
deployment that answers at once (decode_ms_base 0), SQLite, memory rate limits. For each
mode, N sequential requests after a warm-up; per request: the mean wall time and the CPU
time of the whole process (time.process_time: the exporter's thread included).
- off: no OTLP endpoint (no SDK import, no middleware: one branch per stage).
- on: spans for every request, exported by the BatchSpanProcessor over OTLP/HTTP to a
  receiver thread on loopback that acknowledges without decoding.
Baseline: "off" of the tree before tracing, from the same script (it skips "on" there).
Then the pipeline alone (prepare, lease, acquire, run, release of a sim request, no HTTP), in
this thread: the event loop's own cost of a request's spans, without the exporter's thread.

Run: PYTHONPATH=platform .venv/bin/python bench/tracing.py [--requests 3000] [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's seeding helper

import laneway  # noqa: E402
from laneway.app import create_app  # noqa: E402
from laneway.core.pipeline import GenerationIntent  # noqa: E402
from laneway.settings import Settings  # noqa: E402
from litestar.testing import AsyncTestClient  # noqa: E402
from support import seed, sim_model  # noqa: E402


class _Ack(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


async def measure(settings: Settings, key: str, n: int, stream: bool) -> tuple[float, float]:
    body = {"model": "sim", "prompt": "hello there", "max_tokens": 4, "stream": stream}
    headers = {"Authorization": f"Bearer {key}"}
    async with AsyncTestClient(create_app(settings)) as client:
        for _ in range(200):  # warm-up: caches, the first spans' imports
            await client.post("/v1/completions", json=body, headers=headers)
        walls = []
        cpu0 = time.process_time()
        for _ in range(n):
            t = time.perf_counter()
            r = await client.post("/v1/completions", json=body, headers=headers)
            walls.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
        cpu = time.process_time() - cpu0
    return statistics.fmean(walls) * 1e6, cpu / n * 1e6


async def pipeline(n: int, traced: bool) -> float:
    """CPU time (us) of one request through the pipeline, its spans included when traced."""
    from laneway.core.pipeline import Gateway
    from laneway.core.policy import PolicyStore
    from laneway.db.repositories import DeploymentSpec
    from laneway.engines.registry import EngineRegistry
    from laneway.types import TenantSnapshot
    from laneway.usage import UsageRecorder

    registry = EngineRegistry()
    await registry.load(
        [
            DeploymentSpec(
                1,
                "sim-1",
                "sim",
                "sim",
                {"decode_ms_base": 0.0, "decode_ms_per_seq": 0.0, "prefill_ms_per_token": 0.0, "max_concurrency": 64},
                "sim",
                "sim",
                4096,
            )
        ]
    )
    gw = Gateway(registry, PolicyStore(None), sinks=[UsageRecorder(None, interval_s=3600)])  # type: ignore[arg-type]
    tenant = TenantSnapshot(id=1, name="acme", api_key_id=1)
    tracer = None
    if traced:
        from laneway.tracing.otel import Tracing
        from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

        class Dropped(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        tracer = Tracing("http://unused", exporter=Dropped())
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}

    async def one() -> None:
        trace = tracer.begin("completions", scope) if tracer is not None else None  # type: ignore[arg-type]
        if trace is not None:
            await trace.auth(asyncio.sleep(0, tenant))
        call = await gw.prepare(
            tenant, GenerationIntent(endpoint="completions", alias="sim", stream=False, prompt="hi", max_tokens=4)
        )
        lease = gw.lease(call)
        if trace is not None:
            trace.bind(call)
        try:
            await gw.acquire(lease)
            async for _ in gw.run(lease):
                pass
        finally:
            lease.release()

    for _ in range(200):
        await one()
    t = time.process_time()
    for _ in range(n):
        await one()
    elapsed = (time.process_time() - t) / n * 1e6
    if tracer is not None:
        await tracer.stop()
    await registry.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="laneway-bench-tracing-"))
    url = f"sqlite+aiosqlite:///{data / 'laneway.db'}"
    keys = asyncio.run(
        seed(
            url,
            models={
                "sim": sim_model(
                    "sim", decode_ms_base=0.0, decode_ms_per_seq=0.0, prefill_ms_per_token=0.0, max_concurrency=64
                )
            },
            tenants={"acme": {}},
        )
    )
    base = Settings(
        data_dir=data, database_url=url, bootstrap_demo=False, shed_loop_delay_s=0, usage_flush_interval_s=0.5
    )
    modes: list[tuple[str, Settings]] = [("off", base)]
    traced = "otlp_traces_endpoint" in {f.name for f in dataclasses.fields(Settings)}
    if traced:
        receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Ack)
        threading.Thread(target=receiver.serve_forever, daemon=True).start()
        endpoint = f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces"
        modes.append(("on", dataclasses.replace(base, otlp_traces_endpoint=endpoint)))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"laneway from {Path(laneway.__file__).parent}; {args.requests} sequential "
        f"{'streamed' if args.stream else 'non-streaming'} /v1/completions, 4 tokens, sim engine"
    )
    print(f"{'mode':<6} {'wall us/request':>16} {'CPU us/request':>15}")
    for name, settings in modes:
        wall, cpu = asyncio.run(measure(settings, keys["acme"], args.requests, args.stream))
        print(f"{name:<6} {wall:>16.0f} {cpu:>15.0f}")
    print(f"\npipeline alone, {args.requests} requests: {'traced':<8} {'CPU us/request':>14}")
    for label, flag in (("off", False), ("on", True))[: 2 if traced else 1]:
        print(f"{'':<40}{label:<8} {asyncio.run(pipeline(args.requests, flag)):>14.1f}")
    if not traced:
        print("(this tree has no tracing: the 'off' rows are the baseline)")
        return
    os.environ.update(OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.1")
    print(f"{'':<40}{'on, 10 % sampled':<8} {asyncio.run(pipeline(args.requests, True)):>6.1f}")


if __name__ == "__main__":
    main()
