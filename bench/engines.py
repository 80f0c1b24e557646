"""What continuous batching and prefix reuse buy the llama.cpp adapter (engines/llamacpp/).

The engines are driven in-process through the Engine protocol (measure, generate, warmup),
no HTTP; times are taken at the caller. Models: the tiny random-weight demo model the tests
use (demo_model.py) and SmolLM2-135M-Instruct Q4_1 (the real demo model, model_fetch.py;
fetched once into LANEWAY_TEST_MODEL_CACHE). Each model is run in two designs, with the same
`parallel` (default 8) and each design's default threads (per slot: cores / parallel each,
batched: every core for the one context) unless --threads sets one for every context:
  per-slot  `batching: false`: one llama.cpp context per slot, each decoding one sequence;
  batched   one context of `parallel` sequences decoded together (engines/llamacpp/batch_decoder.py).
Rows (each measured against its baseline in the same run):
  streams N     N concurrent streams of --tokens tokens each (end of text banned, so every
                stream runs to the cap): aggregate tokens/s and mean TTFT, and tokens per
                CPU-second of the process (fair across designs that use different numbers
                of cores); baseline: the per-slot design. Goal (issue 11): batched >= 3x
                per-slot tokens/s at 8 streams.
  long prompt   TTFT of a short prompt sent while a --long-tokens prompt prefills (the median
                and the worst of --repeat tries, sent from 10 % to 90 % into the long one's
                prefill, so they land at different points of the step in flight); baseline:
                the short prompt's TTFT on the idle engine. Goal: <= 2x (batched). Also for the batched design with
                no step budget (`max_step_ms` 0: every step takes up to n_batch tokens), and
                the long prompt's own TTFT alone in both (what smaller steps cost its
                prefill); baseline: no step budget.
  prefix        TTFT of a chat whose system prompt (--system-tokens) is a warmed
                `warmup_system_prompts` entry; baseline: the same chat on the same design
                without it (cold). Goal: <= 0.5x (batched; per-slot has no reserved sequences).
Latency rows take the median of --repeat tries. On a shared machine whose cores are busy,
--threads 1 avoids OpenMP's barriers between threads of one context, which stall whenever
one of them is descheduled (on a 2-core VM under load, a decode step took ~14x longer with
2 threads than with 1).

Run: .venv/bin/python bench/engines.py [--models tiny smollm2] [--tokens 48] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laneway.engines.adapter import PromptParts
from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN, write_demo_model
from laneway.engines.llamacpp import LlamaCppEngine
from laneway.engines.llamacpp import batch_decoder as llamacpp_batch
from laneway.engines.model_fetch import SMOLLM2, fetch_model
from laneway.types import ChatTurn, GenerationRequest

N_CTX = 2048
STORY = (
    "The harbour town woke slowly. Fishing boats came in with the tide, gulls circled the market, "
    "and the baker on the corner opened her shutters to the smell of rain. "
)


@dataclass(frozen=True)
class Model:
    name: str
    path: Path
    config: dict[str, Any]  # what every deployment of it sets


def models(names: list[str], workdir: Path) -> list[Model]:
    out = []
    for name in names:
        if name == "tiny":
            path = write_demo_model(workdir / "tiny.gguf")
            out.append(Model(name, path, {"demo": True, "ban_tokens": [EOS_TOKEN, IM_END_TOKEN]}))
        elif name.startswith("smollm2"):
            cache = Path(os.environ.get("LANEWAY_TEST_MODEL_CACHE", workdir))
            path = fetch_model(SMOLLM2, cache)
            if name != "smollm2":  # smollm2-q8_0, smollm2-q4_0: the same weights in another type
                path = requantized(path, name.removeprefix("smollm2-").upper())
            # <|endoftext|>, <|im_start|>, <|im_end|>: banned, so every stream runs to its cap
            out.append(Model(name, path, {"ban_tokens": [0, 1, 2]}))
        else:
            raise SystemExit(f"unknown model {name!r} (tiny, smollm2, smollm2-q8_0, smollm2-q4_0)")
    return out


def requantized(src: Path, kind: str) -> Path:
    """The GGUF at `src` requantized to `kind` (Q8_0 or Q4_0: the types llama.cpp's CPU backend
    multiplies as a matrix, tiled, where Q4_1 is one dot product per row and sequence), cached
    beside it. Q8_0 from Q4_1 loses nothing; Q4_0 a little."""
    import llama_cpp

    ftype = {"Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}[kind]
    out = src.with_name(src.name.replace("Q4_1", kind))
    if not out.is_file():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize = ftype, True
        if llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params) != 0:
            raise SystemExit(f"requantizing {src} to {kind} failed")
    return out


THREADS: dict[str, int] = {}  # --threads: n_threads for every context (none: each design's default)
BATCHED: dict[str, Any] = {}  # --n-batch, --max-step-ms: of the batched design (none: its defaults)


NO_BUDGET = {"max_step_ms": 0}  # the batched design as before the step budget: up to n_batch a step


async def started(model: Model, batched: bool, parallel: int, **config: Any) -> LlamaCppEngine:
    config = {**THREADS, **(BATCHED if batched else {}), **config}
    engine = LlamaCppEngine(
        model.name,
        {"model_path": str(model.path), "parallel": parallel, "batching": batched, **model.config, **config},
        max_model_len=N_CTX,
    )
    await engine.start()
    return engine


async def request(
    engine: LlamaCppEngine,
    max_tokens: int,
    seed: int,
    *,
    prompt: str | None = None,
    messages: list[ChatTurn] | None = None,
) -> GenerationRequest:
    m = await engine.measure(prompt=prompt, messages=messages)
    return GenerationRequest(
        request_id=str(seed),
        prompt=m.text,
        prompt_tokens=m.tokens,
        prompt_ids=m.ids,
        max_tokens=max_tokens,
        temperature=0.7,
        seed=seed,
    )


_calls = itertools.count()


async def stream(engine: LlamaCppEngine, req: GenerationRequest) -> tuple[float, int]:
    """(TTFT in seconds, tokens) of one request, timed from the call. Each call is a cache
    partition of its own: the rows measure computing prompts, which the slots' prefix cache
    would otherwise skip for a repeated one (the warm-up prefixes are shared still)."""
    req = dataclasses.replace(req, cache_salt=f"bench-{next(_calls)}")
    t0 = time.perf_counter()
    ttft, tokens = 0.0, 0
    async for d in engine.generate(req):
        if not tokens and d.tokens:
            ttft = time.perf_counter() - t0
        tokens += d.tokens
    return ttft, tokens


async def streams(engine: LlamaCppEngine, n: int, max_tokens: int) -> tuple[float, float, float]:
    """n concurrent streams: (aggregate tokens/s, mean TTFT in seconds, tokens per CPU second of
    this process, every thread's: what the design costs, whatever else the machine runs)."""
    reqs = [
        await request(engine, max_tokens, i, messages=[ChatTurn("user", f"Tell story {i} about a cat.")])
        for i in range(n)
    ]
    t0, cpu0 = time.perf_counter(), time.process_time()
    done = await asyncio.gather(*(stream(engine, r) for r in reqs))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    tokens = sum(t for _, t in done)
    return tokens / wall, statistics.mean(ttft for ttft, _ in done), tokens / cpu


async def median_of(repeat: int, measure: Callable[[], Awaitable[float]]) -> float:
    return statistics.median([await measure() for _ in range(repeat)])


def text_of_tokens(engine: LlamaCppEngine, tokens: int) -> str:
    """The story repeated and cut to about `tokens` tokens of this model."""
    text = STORY * (tokens // 20 + 1)
    while (n := engine.count_now(PromptParts(text)).tokens) > tokens:
        text = text[: len(text) * tokens // n - 1]
    return text


async def short_under_long(engine: LlamaCppEngine, long_tokens: int, repeat: int) -> tuple[float, float, float, float]:
    """(the short prompt's median TTFT on the idle engine; its median and worst TTFT while a long
    prompt prefills; the long prompt's TTFT alone)."""
    short = await request(engine, 1, 1, messages=[ChatTurn("user", "What is the capital of France?")])
    long = await request(engine, 1, 2, prompt=text_of_tokens(engine, long_tokens))
    long_alone = await _ttft(engine, long)

    async def loaded(at: float) -> float:
        task = asyncio.ensure_future(stream(engine, long))
        await asyncio.sleep(long_alone * at)
        ttft, _ = await stream(engine, short)
        await task
        return ttft

    unloaded = await median_of(repeat, lambda: _ttft(engine, short))
    # Arrivals spread over the middle of the prefill, so they land at different points of the
    # step in flight (a step cannot be interrupted: where the short prompt lands decides its wait).
    tries = [await loaded(0.1 + 0.8 * (i + 0.5) / repeat) for i in range(repeat)]
    return unloaded, statistics.median(tries), max(tries), long_alone


async def _ttft(engine: LlamaCppEngine, req: GenerationRequest) -> float:
    return (await stream(engine, req))[0]


async def prefix(model: Model, batched: bool, parallel: int, system_tokens: int, repeat: int) -> tuple[float, float]:
    """(median TTFT of a chat on an engine without its system prompt warmed, with it warmed)."""
    cold = await started(model, batched, parallel)
    system = text_of_tokens(cold, system_tokens)
    warm = await started(model, batched, parallel, warmup_system_prompts=[system])
    try:
        await warm.warmup([])  # the system prompt's cells, computed once
        chat = [ChatTurn("system", system), ChatTurn("user", "Summarise the story in one line.")]
        cold_req, warm_req = await request(cold, 1, 3, messages=chat), await request(warm, 1, 3, messages=chat)
        times: dict[str, list[float]] = {"cold": [], "warm": []}
        for _ in range(repeat):  # interleaved, so drift in the machine's speed hits both alike
            times["cold"].append(await _ttft(cold, cold_req))
            times["warm"].append(await _ttft(warm, warm_req))
        if batched:
            assert warm.prefix_hits == repeat, "the warmed system prompt was not reused"
        return statistics.median(times["cold"]), statistics.median(times["warm"])
    finally:
        await cold.close()
        await warm.close()


Row = tuple[str, str, str, str, str, str]  # model, row, design, value, baseline, ratio


async def bench_model(model: Model, args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    agg: dict[tuple[bool, int], tuple[float, float, float]] = {}
    latency: dict[bool | None, tuple[float, float, float, float]] = {}  # None: batched without a step budget
    for batched in (False, True, None):
        engine = await started(model, bool(batched), args.parallel, **({} if batched is not None else NO_BUDGET))
        try:
            await streams(engine, 1, 4)  # first-call costs out of the way
            if batched is not None:
                for n in args.streams:
                    agg[batched, n] = await streams(engine, n, args.tokens)
            latency[batched] = await short_under_long(engine, args.long_tokens, args.repeat)
        finally:
            await engine.close()
    design = {False: "per-slot", True: "batched", None: "batched, max_step_ms 0"}
    for n in args.streams:
        base_tps, base_ttft, base_cpu = agg[False, n]
        for batched in (False, True):
            tps, ttft, cpu = agg[batched, n]
            rows.append(
                (
                    model.name,
                    f"{n} streams: tokens/s (TTFT)",
                    design[batched],
                    f"{tps:.0f} ({ttft * 1000:.0f} ms)",
                    f"{base_tps:.0f} ({base_ttft * 1000:.0f} ms)",
                    f"{tps / base_tps:.2f}x",
                )
            )
            rows.append(
                (
                    model.name,
                    f"{n} streams: tokens per CPU-second",
                    design[batched],
                    f"{cpu:.0f}",
                    f"{base_cpu:.0f}",
                    f"{cpu / base_cpu:.2f}x",
                )
            )
    for batched in (False, None, True):
        unloaded, loaded, worst, _ = latency[batched]
        rows.append(
            (
                model.name,
                f"short TTFT, {args.long_tokens}-token prompt prefilling",
                design[batched],
                f"{loaded * 1000:.0f} ms",
                f"{unloaded * 1000:.0f} ms idle",
                f"{loaded / unloaded:.2f}x",
            )
        )
        rows.append(
            (
                model.name,
                f"worst short TTFT of {args.repeat}, prefilling",
                design[batched],
                f"{worst * 1000:.0f} ms",
                f"{unloaded * 1000:.0f} ms idle",
                f"{worst / unloaded:.2f}x",
            )
        )
    base_long = latency[None][3]
    for batched in (None, True):
        long = latency[batched][3]
        rows.append(
            (
                model.name,
                f"{args.long_tokens}-token prompt's TTFT alone",
                design[batched],
                f"{long * 1000:.0f} ms",
                f"{base_long * 1000:.0f} ms",
                f"{long / base_long:.2f}x",
            )
        )
    for batched in (False, True) if args.system_tokens else ():
        cold, warm = await prefix(model, batched, args.parallel, args.system_tokens, args.repeat)
        rows.append(
            (
                model.name,
                f"TTFT, {args.system_tokens}-token system prompt warmed",
                design[batched],
                f"{warm * 1000:.0f} ms",
                f"{cold * 1000:.0f} ms cold",
                f"{warm / cold:.2f}x",
            )
        )
    return rows


def goals(rows: list[Row], args: argparse.Namespace) -> list[str]:
    out = []
    for name in dict.fromkeys(r[0] for r in rows):

        def ratio(row: str, name: str = name) -> float | None:
            found = [r for r in rows if r[0] == name and r[1].startswith(row) and r[2] == "batched"]
            return float(found[0][5].rstrip("x")) if found else None  # None: the row was skipped

        top = max(args.streams, default=0)
        for label, value, limit, above in (
            (f"{top} streams batched >= 3x per-slot tokens/s", ratio(f"{top} streams: tokens/s"), 3.0, True),
            ("short TTFT under a long prefill <= 2x idle", ratio("short TTFT"), 2.0, False),
            ("worst short TTFT under a long prefill <= 2x idle", ratio("worst short TTFT"), 2.0, False),
            ("warmed system prompt TTFT <= 0.5x cold", ratio("TTFT, "), 0.5, False),
        ):
            if value is not None:
                ok = value >= limit if above else value <= limit
                out.append(f"{name}: {label}: {value:.2f}x -> {'MET' if ok else 'NOT MET'}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2"])
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--streams", type=int, nargs="*", default=[1, 4, 8], help="none: skip the stream rows")
    ap.add_argument("--tokens", type=int, default=48, help="tokens per stream")
    ap.add_argument("--long-tokens", type=int, default=1500)
    ap.add_argument("--system-tokens", type=int, default=400, help="0: skip the prefix rows")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--n-batch", type=int, default=0, help="tokens per batched step (0: the default, 512)")
    ap.add_argument(
        "--max-step-ms", type=float, default=-1, help="the batched design's step budget (-1: the default, 100; 0: none)"
    )
    ap.add_argument("--threads", type=int, default=0, help="n_threads of every context (0: each design's default)")
    ap.add_argument(
        "--min-step-tokens",
        type=int,
        default=0,
        help="the step budget's floor of prompt tokens (0: MIN_STEP_PROMPT_TOKENS)",
    )
    args = ap.parse_args()
    if args.min_step_tokens:
        llamacpp_batch.MIN_STEP_PROMPT_TOKENS = args.min_step_tokens  # read at each step
    if args.threads:
        THREADS["n_threads"] = args.threads
    if args.n_batch:
        BATCHED["n_batch"] = args.n_batch
    if args.max_step_ms >= 0:
        BATCHED["max_step_ms"] = args.max_step_ms
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in models(args.models, Path(tmp)):
            rows += asyncio.run(bench_model(model, args))
    print(
        f"\nllama.cpp engines: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; "
        f"parallel {args.parallel}, {args.tokens} tokens a stream, latencies the median of {args.repeat}, "
        f"n_threads {args.threads or 'default'}, n_batch {args.n_batch or 'default'}, "
        f"max_step_ms {args.max_step_ms if args.max_step_ms >= 0 else 'default'}, "
        f"floor {llamacpp_batch.MIN_STEP_PROMPT_TOKENS} prompt tokens a step\n"
    )
    head = ("model", "measure", "design", "value", "baseline", "ratio")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    line = "| " + " | ".join(f"{h:<{w}}" for h, w in zip(head, widths, strict=True)) + " |"
    print(line)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=True)) + " |")
    print()
    for g in goals(rows, args):
        print("goal:", g)


if __name__ == "__main__":
    main()
