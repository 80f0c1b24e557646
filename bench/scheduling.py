"""Does laneway keep short-prompt TTFT flat when a noisy tenant sends 4K-token prompts?

Engine: the calibrated simulator (engines/sim.py), 2 replicas of one model, each running
up to 32 sequences with continuous batching; prefill 0.05 ms per prompt token (a 4K prompt
stalls its replica's decode step by ~200 ms), decode step 10 ms + 0.5 ms per sequence.
Workload (seeded Poisson arrivals, the same in every run):
  short: 3 tenants x 4 req/s, ~100-token prompts, streaming, max_tokens 32
  noisy: 1 tenant x 3 req/s, ~4K-token prompts, non-streaming, max_tokens 128
Configurations:
  FIFO     what a forwarding proxy does: each request goes straight to the replica with the
           fewest outstanding requests and waits inside the engine, first come first served.
  laneway  the gateway's own pipeline (admission, lane queues, fair scheduling): short
           streaming prompts take the `interactive` lane, served by replica 0 (dedicated to it)
           and, when that one is full, by replica 1; the rest take `standard` (at most 8
           running), which only replica 1 serves; weighted deficit round robin within lanes.
Each is run without the noisy tenant (its "unloaded" baseline) and with it.
Metric: time to first token of the short prompts, measured at the caller. The goal printed
at the end: laneway's loaded p99 within 1.5x of the unloaded p99.

Run: .venv/bin/python bench/scheduling.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import time
from dataclasses import dataclass
from typing import Any

from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import Gateway, GenerationIntent
from laneway.core.policy import LanePolicy, PolicySnapshot, PolicyStore
from laneway.db.repositories import DeploymentSpec
from laneway.engines.registry import EngineRegistry
from laneway.types import GenerationRequest, TenantSnapshot
from laneway.usage import UsageRecorder

SIM = {"max_concurrency": 32, "prefill_ms_per_token": 0.05, "decode_ms_base": 10.0, "decode_ms_per_seq": 0.5}
SHORT_PROMPT = "short question " * 27  # ~100 sim tokens
LONG_PROMPT = "long document " * 1170  # ~4K sim tokens
LANES = (
    LanePolicy(
        "interactive",
        priority=0,
        match_max_prompt_tokens=511,
        match_stream=True,
        max_concurrency=32,
        max_queue_depth=256,
        queue_timeout_s=30,
    ),
    LanePolicy("standard", priority=1, max_concurrency=8, max_queue_depth=256, queue_timeout_s=30),
)
TENANTS = {name: TenantSnapshot(id=i, name=name, api_key_id=i) for i, name in enumerate(["a", "b", "c", "noisy"])}


@dataclass
class Arrival:
    at: float
    tenant: str
    short: bool


def workload(seconds: float, noisy: bool, seed: int = 7) -> list[Arrival]:
    rng = random.Random(seed)
    out: list[Arrival] = []
    streams = [(t, 4.0, True) for t in ("a", "b", "c")] + ([("noisy", 3.0, False)] if noisy else [])
    for tenant, rate, short in streams:
        t = rng.expovariate(rate)
        while t < seconds:
            out.append(Arrival(t, tenant, short))
            t += rng.expovariate(rate)
    return sorted(out, key=lambda a: a.at)


async def build(dedicated: bool) -> EngineRegistry:
    registry = EngineRegistry()
    # laneway: replica 0 is dedicated to the interactive lane, replica 1 serves every lane: short
    # prompts take replica 0 while it has free slots and overflow onto replica 1 beyond that.
    lanes: list[dict[str, Any]] = [{"lanes": ["interactive"]}, {}] if dedicated else [{}, {}]
    await registry.load(
        [
            DeploymentSpec(i, f"m-{i}", "m", "sim", {**SIM, **extra}, "sim", "sim", 16384)
            for i, extra in enumerate(lanes)
        ]
    )
    return registry


async def fifo_one(registry: EngineRegistry, arrival: Arrival, n: int) -> float | None:
    deployment = registry.resolve("m")  # least outstanding, no lanes
    deployment.outstanding += 1
    prompt = SHORT_PROMPT if arrival.short else LONG_PROMPT
    engine = deployment.engine
    req = GenerationRequest(
        request_id=str(n),
        prompt=prompt,
        prompt_tokens=(await engine.measure(prompt=prompt)).tokens,
        max_tokens=32 if arrival.short else 128,
        seed=n,
    )
    t0 = time.perf_counter()
    ttft = None
    try:
        async for d in engine.generate(req):
            if ttft is None and d.text:
                ttft = time.perf_counter() - t0
    finally:
        deployment.outstanding -= 1
    return ttft


async def laneway_one(gateway: Gateway, arrival: Arrival, n: int) -> float | None:
    t0 = time.perf_counter()
    call = await gateway.prepare(
        TENANTS[arrival.tenant],
        GenerationIntent(
            endpoint="chat",
            alias="m",
            stream=arrival.short,
            prompt=SHORT_PROMPT if arrival.short else LONG_PROMPT,
            max_tokens=32 if arrival.short else 128,
            seed=n,
        ),
    )
    try:
        lease = await gateway.admit(call)
    except GatewayError:
        return None
    ttft = None
    try:
        async for d in gateway.run(lease):
            if ttft is None and d.text:
                ttft = time.perf_counter() - t0
    finally:
        lease.release()
    return ttft


async def run(config: str, seconds: float, noisy: bool) -> tuple[list[float], int]:
    registry = await build(dedicated=config == "laneway")
    gateway = Gateway(registry, PolicyStore(None, PolicySnapshot(lanes=LANES)), sinks=[UsageRecorder(None)])  # type: ignore[arg-type]
    arrivals = workload(seconds, noisy)
    short_ttft: list[float] = []
    refused = 0
    start = time.perf_counter()

    async def fire(i: int, a: Arrival) -> None:
        nonlocal refused
        await asyncio.sleep(max(0.0, a.at - (time.perf_counter() - start)))
        ttft = await (laneway_one(gateway, a, i) if config == "laneway" else fifo_one(registry, a, i))
        if ttft is None:
            refused += 1
        elif a.short:
            short_ttft.append(ttft * 1000)

    try:
        await asyncio.gather(*(fire(i, a) for i, a in enumerate(arrivals)))
    finally:
        await registry.close()
    return short_ttft, refused


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    results = {}
    for config in ("FIFO", "laneway"):
        for noisy in (False, True):
            results[config, noisy] = asyncio.run(run(config, args.seconds, noisy))
    print(
        f"\nlaneway scheduling: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; "
        f"sim engine x2 replicas, {args.seconds:g} s of seeded Poisson traffic per row; "
        "baseline = each configuration without the noisy tenant\n"
    )
    head = (
        f"| {'config':<8} | {'noisy tenant':<12} | {'short reqs':>10} | {'TTFT p50':>9} | {'TTFT p95':>9} | "
        f"{'TTFT p99':>9} | {'p99 vs unloaded':>15} | {'refused':>7} |"
    )
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for (config, noisy), (ttft, refused) in results.items():
        base = pct(results[config, False][0], 0.99)
        p99 = pct(ttft, 0.99)
        print(
            f"| {config:<8} | {'yes' if noisy else 'no':<12} | {len(ttft):>10} | {pct(ttft, 0.5):>7.1f}ms | "
            f"{pct(ttft, 0.95):>7.1f}ms | {p99:>7.1f}ms | {p99 / base:>14.2f}x | {refused:>7} |"
        )
    unloaded = pct(results["FIFO", False][0], 0.99)
    lanes = pct(results["laneway", True][0], 0.99)
    verdict = "MET" if lanes <= 1.5 * unloaded else "NOT MET"
    print(
        f"\ngoal: laneway loaded p99 within 1.5x of the unloaded p99 ({unloaded:.1f} ms, FIFO without the noisy "
        f"tenant): {lanes / unloaded:.2f}x -> {verdict}"
    )


if __name__ == "__main__":
    main()
