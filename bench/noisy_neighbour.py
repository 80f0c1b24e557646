"""The noisy neighbour (issue 38): tenant F keeps 100 streams in flight on an 8-sequence
deployment; tenant B sends short streams one after another. Does B's first token stay where
it is when B is alone?

Engine: the simulator (engines/sim.py), one deployment of 8 sequences with a GPU-like step:
8 ms + 0.25 ms a running sequence, prefill 0.1 ms a prompt token (a step that prefills a
300-token prompt takes 30 ms longer).
Workload: B's streams have ~300-token prompts and 16 tokens to generate, sent one after the
other; F's have ~100-token prompts and 256 tokens each (~2.5 s a stream), and F sends a new one
as each ends (100 clients; a refused one waits its Retry-After, at most 1 s, and asks again).
B sends 3 unmeasured streams first (it is an active tenant when F starts), then F fills the
deployment, then B's measured streams run.
Rows (each round runs every row once, in this order, rounds interleaved; each row on a fresh
engine and gateway):
  unloaded  laneway with the shipped lanes, B alone: the baseline
  defaults  laneway with the shipped lanes (no lane caps: the learned limit is the room), F on
  caps 4    laneway with the lanes as shipped before (interactive and standard capped at 4), F on
  floor     no gateway: 7 of F's streams and B's straight into the engine, nothing queued: what
            the engine itself gives B beside 7 running streams (its step in progress, the longer
            steps of a fuller batch, F's prompts joining): the best any scheduler can do
(No FIFO row: F's 100 straight into the engine put B's stream behind ~92 of F's, ~30 s each.)
Metric: B's time to first token at the caller (p50, p99) and its ratio to the unloaded p99 and
to the floor's p99 of the same run; B's refusals. Goal: defaults' p99 <= 1.5x unloaded, 0 of
B's refused (where the floor itself is past 1.5x, the engine is, not the scheduling).

Run: PYTHONPATH=platform .venv/bin/python bench/noisy_neighbour.py [--rounds 3] [--requests 40]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import platform
import time
from collections import defaultdict

import yaml
from laneway.bootstrap import POLICIES_DIR
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import Gateway, GenerationIntent
from laneway.core.policy import LanePolicy, PolicySnapshot, PolicyStore
from laneway.db.repositories import DeploymentSpec
from laneway.engines.registry import EngineRegistry
from laneway.types import GenerationRequest, TenantSnapshot
from laneway.usage import UsageRecorder

SIM = {"max_concurrency": 8, "prefill_ms_per_token": 0.1, "decode_ms_base": 8.0, "decode_ms_per_seq": 0.25}
B_PROMPT = "short question " * 80  # ~300 sim tokens
F_PROMPT = "chatter " * 50  # ~100 sim tokens
B_TOKENS, F_TOKENS, F_CLIENTS = 16, 256, 100
F_TENANT = TenantSnapshot(id=1, name="f", api_key_id=1)
B_TENANT = TenantSnapshot(id=2, name="b", api_key_id=2)
ROWS = ("unloaded", "defaults", "caps 4", "floor")


def shipped_lanes(cap: int | None = None) -> tuple[LanePolicy, ...]:
    """policies/lanes.yaml; `cap`: the foreground lanes capped as they were shipped before."""
    out = []
    for lane in yaml.safe_load((POLICIES_DIR / "lanes.yaml").read_text())["lanes"]:
        tasks = frozenset(lane["match_tasks"]) if "match_tasks" in lane else None
        policy = LanePolicy(**{**lane, "match_tasks": tasks})
        if cap is not None and not policy.background:
            policy = dataclasses.replace(policy, max_concurrency=cap)
        out.append(policy)
    return tuple(out)


class Row:
    """One row's engine, and how its streams reach it (the gateway, or straight in)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.registry = EngineRegistry()
        self.gateway: Gateway | None = None
        self.n = 0

    async def start(self) -> None:
        spec = DeploymentSpec(0, "m-0", "m", "sim", dict(SIM), "sim", "sim", 8192)
        await self.registry.load([spec])
        if self.name != "floor":
            lanes = shipped_lanes(4 if self.name == "caps 4" else None)
            store = PolicyStore(None, PolicySnapshot(lanes=lanes))
            self.gateway = Gateway(self.registry, store, sinks=[UsageRecorder(None)])  # type: ignore[arg-type]

    async def stream(self, tenant: TenantSnapshot, prompt: str, max_tokens: int) -> float:
        """One stream to its end; its TTFT in seconds. GatewayError when refused."""
        self.n += 1
        t0 = time.perf_counter()
        ttft = -1.0
        if self.gateway is None:
            engine = self.registry.deployments()[0].engine
            tokens = (await engine.measure(prompt=prompt)).tokens
            request = GenerationRequest(
                request_id=str(self.n), prompt=prompt, prompt_tokens=tokens, max_tokens=max_tokens
            )
            async for delta in engine.generate(request):
                if ttft < 0 and delta.text:
                    ttft = time.perf_counter() - t0
            return ttft
        intent = GenerationIntent(endpoint="chat", alias="m", stream=True, prompt=prompt, max_tokens=max_tokens)
        call = await self.gateway.prepare(tenant, intent)
        lease = await self.gateway.admit(call)
        try:
            async for delta in self.gateway.run(lease):
                if ttft < 0 and delta.text:
                    ttft = time.perf_counter() - t0
        finally:
            lease.release()
        return ttft

    def running(self) -> int:
        return self.registry.deployments()[0].engine.active_slots  # type: ignore[attr-defined, no-any-return]


async def flood(row: Row, stop: asyncio.Event) -> None:
    """One of F's clients: a new stream as each ends; a refusal waits its Retry-After (<= 1 s)."""
    while not stop.is_set():
        try:
            await row.stream(F_TENANT, F_PROMPT, F_TOKENS)
        except GatewayError as refused:
            await asyncio.sleep(min(float(refused.headers.get("Retry-After", "1")), 1.0))


async def run_row(name: str, requests: int) -> tuple[list[float], int]:
    row = Row(name)
    await row.start()
    stop = asyncio.Event()
    clients: list[asyncio.Task[None]] = []
    ttfts: list[float] = []
    refused = 0
    try:
        for _ in range(3):  # B is an active tenant before F starts
            await row.stream(B_TENANT, B_PROMPT, B_TOKENS)
        if name != "unloaded":
            f_clients = 7 if name == "floor" else F_CLIENTS
            clients = [asyncio.create_task(flood(row, stop)) for _ in range(f_clients)]
            for _ in range(500):  # up to 5 s, until F holds the deployment
                if row.running() >= 7:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)
        for _ in range(requests):
            try:
                ttfts.append(await row.stream(B_TENANT, B_PROMPT, B_TOKENS) * 1000)
            except GatewayError:
                refused += 1
    finally:
        stop.set()
        for task in clients:
            task.cancel()
        for task in clients:
            with contextlib.suppress(asyncio.CancelledError, GatewayError):
                await task
        await row.registry.close()
    return ttfts, refused


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


async def main_async(rounds: int, requests: int) -> None:
    ttfts: dict[str, list[float]] = defaultdict(list)
    refused: dict[str, int] = defaultdict(int)
    for _ in range(rounds):
        for name in ROWS:
            got, no = await run_row(name, requests)
            ttfts[name] += got
            refused[name] += no
    print(
        f"\nnoisy neighbour: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; "
        f"sim engine, 8 sequences; F keeps {F_CLIENTS} streams in flight; B: {requests} sequential short "
        f"streams per row per round, {rounds} rounds interleaved; baseline = unloaded (B alone) of this run\n"
    )
    head = (
        f"| {'row':<9} | {'B streams':>9} | {'TTFT p50':>9} | {'TTFT p99':>9} | {'p99 vs unloaded':>15} | "
        f"{'p99 vs floor':>12} | {'B refused':>9} |"
    )
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    base, floor = pct(ttfts["unloaded"], 0.99), pct(ttfts["floor"], 0.99)
    for name in ROWS:
        p99 = pct(ttfts[name], 0.99)
        print(
            f"| {name:<9} | {len(ttfts[name]):>9} | {pct(ttfts[name], 0.5):>7.1f}ms | {p99:>7.1f}ms | "
            f"{p99 / base:>14.2f}x | {p99 / floor:>11.2f}x | {refused[name]:>9} |"
        )
    ratio = pct(ttfts["defaults"], 0.99) / base
    verdict = "MET" if ratio <= 1.5 and refused["defaults"] == 0 else "NOT MET"
    print(f"\ngoal: defaults' B p99 <= 1.5x unloaded and 0 refused: {ratio:.2f}x, {refused['defaults']} -> {verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=40)
    args = ap.parse_args()
    asyncio.run(main_async(args.rounds, args.requests))


if __name__ == "__main__":
    main()
