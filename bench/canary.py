"""Engine swaps (issue 42): a canary's share and stickiness, its automatic rollback, and what a
shadow costs the live requests, on sim engines behind one in-process gateway, with the openai
SDK as the client (streamed chat, TTFT measured at the client's first chunk).

Workload: multi-turn sessions. A session is `--turns` chats, each sent when the previous
answer has arrived, its history growing; every session opens with the same system prompt and
a first question of its own (no prompt_cache_key, no user: the pool is chosen by the
conversation's first user message). `--concurrency` sessions run at once.

Rows (each run `--rounds` times, interleaved, their samples pooled):
- baseline: the alias served by m-a alone (m-b serving nothing: a shadow sampling 0 %);
- canary: m-b a canary at `--weight` % (a sim like m-a);
- rollback: m-b a canary at `--weight` % whose engine answers a third of its requests with an
  error before the first byte (as an upstream 500 is seen), min requests 20, window 60 s:
  rolled back by laneway;
- shadow: m-b a shadow sampling `--sample` % of the live requests.
Reported: requests, each engine's share, sessions kept on one engine, client errors,
failovers (usage rows with tries > 1), when the rollback came (requests and seconds into the
row), TTFT p50/p99 and their ratio to the baseline rows of the same run, the shadow's
comparison (copies compared, dropped, exact-match rate at temperature 0).

Run: PYTHONPATH=platform .venv/bin/python bench/canary.py [--requests 2000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import platform
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's seeding and in-process server helpers

from laneway.engines.base import EngineError  # noqa: E402
from laneway.types import Delta, GenerationRequest  # noqa: E402
from support import Gateway, start_gateway  # noqa: E402

PASSWORD = "bench-admin-password"
SIM = {"max_concurrency": 8, "decode_ms_base": 4.0, "decode_ms_per_seq": 0.5, "prefill_ms_per_token": 0.02}
SYSTEM = "You are a concise assistant for the laneway benchmark. Answer in a few words."


ENGINE: dict[str, Any] = {"kind": "sim", "model": None, "max_tokens": 8, "json_every": 0}


def deployment(name: str, **role: Any) -> dict[str, Any]:
    if ENGINE["kind"] == "sim":
        return {"name": name, "engine_kind": "sim", "quantization": "sim", "gpu_type": "sim", "config": SIM, **role}
    # SmolLM2 on llama.cpp under two engine settings: the incumbent batches its two sequences
    # in one context, the candidate (m-b) runs them one per context (batching off).
    config = {"model_path": ENGINE["model"], "parallel": 2, "batching": name == "m-a"}
    return {
        "name": name,
        "engine_kind": "llamacpp",
        "quantization": "Q4_1",
        "gpu_type": "cpu",
        "max_model_len": 512,  # short chats; a short warm-up (half the context) on a loaded machine
        "config": config,
        **role,
    }


@dataclass
class Row:
    name: str
    requests: int = 0
    errors: int = 0
    ttft: list[float] = field(default_factory=list)
    served: dict[str, str] = field(default_factory=dict)  # request id -> deployment
    sessions: dict[int, set[str]] = field(default_factory=dict)  # session -> its request ids
    failovers: int = 0
    rollback_after: tuple[int, float] | None = None  # (requests sent, seconds) when it came
    shadow: dict[str, Any] | None = None

    def share(self, name: str) -> float:
        return sum(1 for d in self.served.values() if d == name) / max(len(self.served), 1)

    def sticky(self) -> float:
        kept = [len({self.served[i] for i in ids if i in self.served}) == 1 for ids in self.sessions.values()]
        return sum(kept) / max(len(kept), 1)


def failing_every_third(engine: Any) -> None:
    generate, count = engine.generate, itertools.count()

    async def refused(request: GenerationRequest) -> AsyncGenerator[Delta, None]:
        raise EngineError("upstream answered 500")
        yield Delta("")  # makes this a generator

    engine.generate = lambda request: refused(request) if next(count) % 3 == 0 else generate(request)


async def session(
    client: openai.AsyncOpenAI, row: Row, s: int, turns: int, temperature: float | None, watch: Any
) -> None:
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    row.sessions[s] = set()
    for t in range(turns):
        json_mode = ENGINE["json_every"] and (s + t) % ENGINE["json_every"] == 0
        question = f"session {s}: question {t}?"
        if json_mode:
            question = f'Reply with a JSON object {{"answer": ...}} to: what is {s % 50} plus {t}?'
        messages.append({"role": "user", "content": question})
        extra: dict[str, Any] = {} if temperature is None else {"temperature": temperature}
        if json_mode:
            extra["response_format"] = {"type": "json_object"}
        started = time.perf_counter()
        try:
            stream = await client.chat.completions.create(
                model="m",
                messages=messages,
                max_tokens=8,
                stream=True,
                **extra,  # type: ignore[arg-type]
            )
            text, first, rid = [], None, ""
            async for chunk in stream:
                rid = chunk.id
                if first is None:
                    first = time.perf_counter() - started
                if chunk.choices and chunk.choices[0].delta.content:
                    text.append(chunk.choices[0].delta.content)
        except openai.APIError:
            row.errors += 1
            row.requests += 1
            continue
        row.requests += 1
        if first is not None:
            row.ttft.append(first)
        row.sessions[s].add(rid)
        messages.append({"role": "assistant", "content": "".join(text)})
        watch()


async def drive(
    gw: Gateway, row: Row, requests: int, turns: int, concurrency: int, temperature: float | None, offset: int = -1
) -> None:
    client = openai.AsyncOpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
    canary = next((d for d in gw.gateway.registry.replicas("m") if d.spec.name == "m-b"), None)
    started = time.perf_counter()
    armed = canary is not None and canary.role == "canary" and canary.weight > 0

    def watch() -> None:
        if armed and row.rollback_after is None and canary is not None and canary.weight == 0:
            row.rollback_after = (row.requests, time.perf_counter() - started)

    sessions = iter(range(requests // turns))
    if offset < 0:
        offset = hash(row.name) % 1_000_000 * 1000  # each row's sessions are its own
    offset += 1_000_000 if row.name == "shadow" else 0

    async def worker() -> None:
        for s in sessions:
            await session(client, row, offset + s, turns, temperature, watch)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()


def collect(gw: Gateway, row: Row) -> None:
    rows = {r.request_id: r for r in gw.usage_rows("acme")}
    ids = {i for ids in row.sessions.values() for i in ids}
    row.served = {i: rows[i].deployment for i in ids if i in rows}
    row.failovers = sum(1 for i in ids if i in rows and rows[i].tries > 1)


def run_row(kind: str, args: argparse.Namespace, work: Path, n: int) -> Row:
    roles = {
        "baseline": {"role": "shadow", "sample": 0.0},
        "canary": {"role": "canary", "weight": args.weight},
        "rollback": {"role": "canary", "weight": args.weight},
        "shadow": {"role": "shadow", "sample": args.sample},
    }[kind]
    seed = {"models": {"m": [deployment("m-a"), deployment("m-b", **roles)]}, "tenants": {"acme": {}}}
    data = work / f"{kind}-{n}"
    data.mkdir()
    gw = start_gateway(
        data,
        seed_with=seed,
        admin_password=PASSWORD,
        usage_flush_interval_s=0.1,
        canary_min_requests=20,
        canary_window_s=60.0,
        wait_ready=False,
    )
    ready_by = time.monotonic() + 900  # llama.cpp's warm-up on a loaded machine: minutes
    while httpx.get(gw.base_url + "/health/ready").status_code != 200:
        if time.monotonic() > ready_by:
            gw.stop()
            raise TimeoutError("the gateway did not warm up within 900 s")
        time.sleep(0.5)
    row = Row(kind)
    try:
        if kind == "rollback":
            failing_every_third(next(d for d in gw.gateway.registry.replicas("m") if d.spec.name == "m-b").engine)
        temperature = 0.0 if kind == "shadow" else None
        asyncio.run(drive(gw, row, args.requests, args.turns, args.concurrency, temperature))
        time.sleep(0.5)
        collect(gw, row)
        if kind == "shadow":
            row.shadow = gw.gateway.swaps.compare("m")["shadow"]
    finally:
        gw.stop()
    return row


def run_on_one_gateway(args: argparse.Namespace, work: Path) -> dict[str, list[Row]]:
    """--one-gateway: every row on one gateway (engines warmed once, caches shared alike), the
    shadow's sample switched between rows in place: baseline 0 %, shadow `--sample` %."""
    roles = {"role": "shadow", "sample": 0.0}
    seed = {"models": {"m": [deployment("m-a"), deployment("m-b", **roles)]}, "tenants": {"acme": {}}}
    data = work / "one"
    data.mkdir()
    gw = start_gateway(data, seed_with=seed, admin_password=PASSWORD, usage_flush_interval_s=0.1, wait_ready=False)
    results: dict[str, list[Row]] = {"baseline": [], "shadow": []}
    try:
        while httpx.get(gw.base_url + "/health/ready").status_code != 200:
            time.sleep(0.5)
        shadow = next(d for d in gw.gateway.registry.replicas("m") if d.spec.name == "m-b")
        for n in range(args.rounds):
            for kind in ("baseline", "shadow"):
                shadow.sample = args.sample if kind == "shadow" else 0.0
                row = Row(kind)
                asyncio.run(drive(gw, row, args.requests, args.turns, args.concurrency, 0.0, offset=n * 7919))
                time.sleep(1.0)  # the last copies end
                collect(gw, row)
                row.shadow = gw.gateway.swaps.compare("m")["shadow"] if kind == "shadow" else None
                results[kind].append(row)
                print(
                    f"round {n + 1}: {kind}: {row.requests} requests, {row.errors} errors, TTFT p50 "
                    f"{pct(row.ttft, 0.5) * 1000:.1f} ms, p99 {pct(row.ttft, 0.99) * 1000:.1f} ms, shadow "
                    f"{row.shadow}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        gw.stop()
    return results


def pooled(rows: list[Row]) -> Row:
    out = Row(rows[0].name)
    for r in rows:
        out.requests += r.requests
        out.errors += r.errors
        out.ttft += r.ttft
        out.served |= r.served
        out.sessions |= {(id(r), s): ids for s, ids in r.sessions.items()}  # type: ignore[dict-item]
        out.failovers += r.failovers
    out.rollback_after = next((r.rollback_after for r in rows if r.rollback_after), None)
    out.shadow = next((r.shadow for r in rows if r.shadow), None)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--weight", type=float, default=10.0)
    parser.add_argument("--sample", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", default="baseline,canary,rollback,shadow")
    parser.add_argument("--engine", choices=("sim", "llamacpp"), default="sim")
    parser.add_argument("--model", help="llamacpp: the GGUF (SmolLM2-135M-Instruct)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--one-gateway", action="store_true", help="baseline and shadow rows on one gateway")
    parser.add_argument("--json-every", type=int, default=0, help="every Nth turn asks for a JSON object (0: none)")
    args = parser.parse_args()
    ENGINE.update(kind=args.engine, model=args.model, max_tokens=args.max_tokens, json_every=args.json_every)
    kinds = args.rows.split(",")
    results: dict[str, list[Row]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        if args.one_gateway:
            results = run_on_one_gateway(args, Path(tmp))
        for n in range(0 if args.one_gateway else args.rounds):  # interleaved: every kind once per round
            for kind in kinds:
                row = run_row(kind, args, Path(tmp), n)
                results[kind].append(row)
                shadow = row.shadow or {}
                print(  # each row as it ends: a long run cut short still says what it measured
                    f"round {n + 1}: {kind} done: {row.requests} requests, {row.errors} errors, m-b share "
                    f"{row.share('m-b') * 100:.1f} %, TTFT p50 {pct(row.ttft, 0.5) * 1000:.1f} ms, p99 "
                    f"{pct(row.ttft, 0.99) * 1000:.1f} ms, shadow compared {shadow.get('compared')}, exact "
                    f"{shadow.get('exact_match_rate')}, JSON {shadow.get('json_valid_served')}/"
                    f"{shadow.get('json_valid_shadow')} of {shadow.get('json_asked')}",
                    file=sys.stderr,
                    flush=True,
                )
    rows = {k: pooled(v) for k, v in results.items()}
    base = rows.get("baseline")
    print(
        f"machine: {platform.machine()}, {platform.python_version()}; engine {args.engine}; "
        f"{args.requests} requests a row, {args.turns} turns a session, {args.concurrency} sessions at once, "
        f"{args.rounds} rounds pooled"
    )
    print()
    print(
        "| row | requests | m-b share | sessions on one engine | client errors | failovers | "
        "TTFT p50 ms | TTFT p99 ms | p50 / baseline | p99 / baseline | rollback after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, r in rows.items():
        p50, p99 = pct(r.ttft, 0.5) * 1000, pct(r.ttft, 0.99) * 1000
        r50 = p50 / (pct(base.ttft, 0.5) * 1000) if base else float("nan")
        r99 = p99 / (pct(base.ttft, 0.99) * 1000) if base else float("nan")
        each = [x.rollback_after for x in results[kind] if x.rollback_after]
        after = ", ".join(f"{a} req / {s:.1f} s" for a, s in each) or "-"
        print(
            f"| {kind} | {r.requests} | {r.share('m-b') * 100:.1f} % | {r.sticky() * 100:.1f} % | {r.errors} | "
            f"{r.failovers} | {p50:.1f} | {p99:.1f} | {r50:.2f} | {r99:.2f} | {after} |"
        )
    shadow = rows.get("shadow")
    if shadow is not None and shadow.shadow is not None:
        s = shadow.shadow
        print()
        print(
            f"shadow (last round): compared {s['compared']}, dropped {s['dropped']}, failed {s['failed']}, "
            f"exact match at temperature 0 {s['exact_match_rate']}, similarity {s['similarity']}, "
            f"TTFT p50 shadow/served {s['ttft_p50_ratio']}"
        )
    per_round = {k: [f"{pct(x.ttft, 0.99) * 1000:.1f}" for x in v] for k, v in results.items()}
    print()
    print("TTFT p99 ms per round:", "; ".join(f"{k}: {', '.join(v)}" for k, v in per_round.items()))


if __name__ == "__main__":
    main()
