"""What the early stops (core/early_stops.py) save on SmolLM2, and what they change.

SmolLM2-135M-Instruct (Q4_1, the demo model, model_fetch.py; fetched once into
LANEWAY_TEST_MODEL_CACHE, default ~/.cache/laneway/models) on llama.cpp, driven in-process
through the pipeline (core Gateway: prepare -> admit -> run, the early stops where they run in
production), one request at a time, temperature 0. Each prompt of the default tasks (chat,
extract with and without response_format json_object, reason, batch; max_tokens from
policies/tasks.yaml) is answered twice, in alternation:
  without   the task policies with the early stops off (repetition_ngram null, json_stop false);
  with      policies/tasks.yaml as shipped.
Every request is a cache partition of its own (its own tenant), so neither answer starts from
the other's computed cells: the two decode the same prompt the same way.

Rows:
  decode tokens   completion tokens of all answers, without and with; the share saved
                  (goal, issue 26: >= 20 %);
  changed         answers whose text with the stops is not the text without them up to the
                  stop point (goal: 0);
  cut short       answers the repetition rule stopped whose answer without the stops ended on
                  its own before max_tokens (a loop that ended, or text that was no loop);
  saved metric    laneway_decode_tokens_saved_total (estimated against max_tokens) beside the
                  tokens really saved;
  sweep           the repetition rule replayed on the recorded answers without stops, for
                  other n-grams and counts: share saved, answers cut short.

Run: flock /tmp/laneway-bench.lock .venv/bin/python bench/stops.py [--threads 1] [--limit N] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml
from laneway.core.early_stops import RepetitionStop
from laneway.core.pipeline import Gateway, GatewayConfig, GenerationIntent
from laneway.core.policy import PolicySnapshot, PolicyStore, TaskPolicy
from laneway.db.repositories import DeploymentSpec
from laneway.engines.model_fetch import SMOLLM2, fetch_model
from laneway.engines.registry import EngineRegistry
from laneway.metrics import GatewayMetrics
from laneway.types import ChatTurn, TenantSnapshot
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
JSON_MODE = {"type": "json_object"}

CHAT = [
    "Write a short poem about the sea.",
    "What is the capital of France? Explain its history.",
    "List ten tips for better sleep.",
    "Explain how a bicycle works.",
    "Describe your favourite colour.",
    "What are the benefits of drinking water?",
    "Write a Python function that reverses a string.",
    "Tell me a story about a dragon who learns to read.",
    "How do I make a cup of tea?",
    "What is the difference between weather and climate?",
    "Give me five ideas for a rainy weekend.",
    "Why is the sky blue?",
    "Write a haiku about autumn leaves.",
    "What should I pack for a week-long hiking trip?",
    "Explain what a neural network is to a ten-year-old.",
    "Describe a typical day of a lighthouse keeper.",
    "What are the rules of chess in brief?",
    "Write a thank-you note to a teacher.",
    "How can I learn a new language quickly?",
    "What is photosynthesis?",
]
EXTRACT = [
    "Extract the names of people from: 'Alice met Bob and Carol in Paris on Monday.'",
    "List the dates mentioned in: 'The meeting moved from 3 May to 10 June, then to 1 July 2025.'",
    "What city and country are in this text? 'Our new office opens in Lisbon, Portugal next spring.'",
    "Extract the product and its price: 'The blue kettle costs 39 euros at the corner shop.'",
    "Which programming languages are named here? 'We rewrote the Perl scripts in Go and kept the Rust core.'",
    "Find the email address in: 'Write to support at help@example.org for a refund.'",
]
EXTRACT_JSON = [
    "Return JSON with keys name and age for: 'Maria is 34 years old.'",
    "Return a JSON object with the fields city and temperature from: 'It is 21 degrees in Madrid today.'",
    "Give the people in this sentence as JSON with a list under 'people': 'Tom, Ana and Lee went home.'",
    'Return JSON {"title": ..., "year": ...} for: \'Casablanca was released in 1942.\'',
    "As a JSON object, give the colour and the size from: 'a large red umbrella'.",
    "Return JSON with keys sentiment and reason for the review: 'The soup was cold and the bread stale.'",
]
REASON = [
    "If a train travels 60 km in 1.5 hours, what is its speed? Think step by step.",
    "A shop sells pens at 3 for 2 euros. How much do 12 pens cost? Explain.",
    "Tom is taller than Ann, and Ann is taller than Ben. Who is the shortest? Reason it out.",
    "What is 17 times 23? Show your working.",
    "If today is Wednesday, what day is it in 10 days? Explain step by step.",
    "A rectangle is 8 cm long and 5 cm wide. What are its area and perimeter?",
    "Is 91 a prime number? Explain why or why not.",
    "I have 3 apples and buy twice as many, then eat 2. How many are left? Think step by step.",
    "Which is heavier, a kilogram of feathers or a kilogram of iron? Explain.",
    "Solve for x: 2x + 6 = 20. Show each step.",
    "A car uses 6 litres per 100 km. How much fuel does it need for 250 km?",
    "Three friends share a bill of 45 euros equally, with a 10 percent tip. What does each pay?",
]
BATCH = [
    "Summarize in two sentences: 'The city council voted to extend the tram line to the airport. "
    "Construction starts next year and should take three years. The cost is shared with the region.'",
    "Translate into French: 'The library opens at nine and closes at six.'",
    "Rewrite more formally: 'hey, can u send me the report asap? thx'",
    "Classify the sentiment (positive, negative, neutral): 'The delivery was quick and the box intact.'",
    "Write a product description for a wooden desk lamp.",
    "Summarize the main idea of the story of the tortoise and the hare.",
    "Turn these notes into a paragraph: meeting Monday; budget approved; hire two engineers; launch in May.",
    "Write three frequently asked questions and answers about a bike rental service.",
    "Correct the grammar: 'She don't like apples and he have two cats.'",
    "Write a short email announcing an office move to a new building.",
    "Describe the water cycle for a school textbook.",
    "Generate a list of ten names for a coffee shop.",
]


@dataclass(frozen=True)
class Prompt:
    task: str
    text: str
    json_mode: bool = False


PROMPTS = [
    *(Prompt("chat", p) for p in CHAT),
    *(Prompt("extract", p) for p in EXTRACT),
    *(Prompt("extract", p, json_mode=True) for p in EXTRACT_JSON),
    *(Prompt("reason", p) for p in REASON),
    *(Prompt("batch", p) for p in BATCH),
]


@dataclass
class Answer:
    text: str
    tokens: int
    finish: str | None
    early_stop: str | None
    saved_estimate: int
    deltas: list[tuple[str, int]] = field(default_factory=list)
    seconds: float = 0.0


def shipped_tasks() -> dict[str, TaskPolicy]:
    rows = yaml.safe_load((ROOT / "policies" / "tasks.yaml").read_text())["tasks"]
    fields = set(TaskPolicy.__dataclass_fields__)
    return {
        r["task"]: TaskPolicy(**{k: tuple(v) if k == "stop" else v for k, v in r.items() if k in fields}) for r in rows
    }


_tenants = iter(range(1, 1_000_000))


async def ask(gw: Gateway, prompt: Prompt, record: bool) -> Answer:
    tenant = TenantSnapshot(id=next(_tenants), name="bench", api_key_id=1)  # its own cache partition
    intent = GenerationIntent(
        endpoint="chat",
        alias="smollm2",
        stream=False,
        task=prompt.task,
        temperature=0.0,
        seed=0,
        messages=[ChatTurn("user", prompt.text)],
        response_format=JSON_MODE if prompt.json_mode else None,
    )
    call = await gw.prepare(tenant, intent)
    lease = await gw.admit(call)
    t0 = time.perf_counter()
    deltas: list[tuple[str, int]] = []
    try:
        async for d in gw.run(lease):
            deltas.append((d.text, d.tokens))
    finally:
        lease.release()
    return Answer(
        text="".join(t for t, _ in deltas),
        tokens=call.completion_tokens,
        finish=call.finish_reason,
        early_stop=call.early_stop,
        saved_estimate=call.tokens_saved,
        deltas=deltas if record else [],
        seconds=time.perf_counter() - t0,
    )


def saved_metric(metrics: GatewayMetrics) -> float:
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        if family.name == "laneway_decode_tokens_saved":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


def replay(deltas: list[tuple[str, int]], ngram: int, count: int) -> int | None:
    """Tokens decoded when the repetition rule fires on these deltas (as generate.py feeds
    it), or None when it does not."""
    rule, tokens = RepetitionStop(ngram, count), 0
    for text, n in deltas:
        tokens += n
        if text and rule.feed(text) is not None:
            return tokens
    return None


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads (1: no OpenMP stalls on a busy VM)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts (0: all)")
    ap.add_argument("--json", type=Path, help="write every answer here")
    args = ap.parse_args()
    cache = Path(os.environ.get("LANEWAY_TEST_MODEL_CACHE", Path.home() / ".cache" / "laneway" / "models"))
    model = fetch_model(SMOLLM2, cache)
    prompts = PROMPTS[: args.limit] if args.limit else PROMPTS

    shipped = shipped_tasks()
    off = {k: replace(v, repetition_ngram=None, json_stop=False) for k, v in shipped.items()}
    registry = EngineRegistry()
    await registry.load(
        [
            DeploymentSpec(
                id=1,
                name="smollm2-llamacpp",
                alias="smollm2",
                engine_kind="llamacpp",
                config={"model_path": str(model), "parallel": 1, "n_threads": args.threads},
                quantization="Q4_1",
                gpu_type="cpu",
                max_model_len=2048,
            )
        ]
    )
    metrics = GatewayMetrics()
    store = PolicyStore(None, PolicySnapshot(tasks=shipped))
    gw = Gateway(registry, store, sinks=[metrics], config=GatewayConfig(default_max_tokens=384))
    rows: list[tuple[Prompt, Answer, Answer]] = []
    started = time.perf_counter()
    try:
        for i, prompt in enumerate(prompts):
            store.current = PolicySnapshot(tasks=off)
            without = await ask(gw, prompt, record=True)
            store.current = PolicySnapshot(tasks=shipped)
            with_ = await ask(gw, prompt, record=False)
            rows.append((prompt, without, with_))
            print(
                f"[{i + 1}/{len(prompts)}] {prompt.task:8} without {without.tokens:4} ({without.finish}) "
                f"with {with_.tokens:4} ({with_.early_stop or with_.finish})",
                flush=True,
            )
    finally:
        await registry.close()
    report(rows, shipped, saved_metric(metrics), time.perf_counter() - started, args.threads)
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "task": p.task,
                        "json_mode": p.json_mode,
                        "prompt": p.text,
                        "without": {**vars(a), "deltas": a.deltas},
                        "with": vars(b),
                    }
                    for p, a, b in rows
                ],
                indent=1,
            )
        )


def report(
    rows: list[tuple[Prompt, Answer, Answer]], tasks: dict[str, TaskPolicy], metric: float, seconds: float, threads: int
) -> None:
    def cap(p: Prompt) -> int:
        return tasks[p.task].max_tokens

    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} cores; SmolLM2-135M-Instruct Q4_1, llama.cpp "
        f"{threads} thread(s); {len(rows)} prompts; temperature 0; {seconds:.0f} s"
    )
    print("\n| task | prompts | decode tokens without | with | saved | early stops | changed | cut short |")
    print("|---|---|---|---|---|---|---|---|")
    groups = [("chat", False), ("extract", False), ("extract", True), ("reason", False), ("batch", False)]
    totals = [0, 0, 0, 0, 0, 0]
    for task, json_mode in [*groups, ("all", False)]:
        chosen = [r for r in rows if task == "all" or (r[0].task == task and r[0].json_mode == json_mode)]
        if not chosen:
            continue
        a = sum(w.tokens for _, w, _ in chosen)
        b = sum(s.tokens for _, _, s in chosen)
        stops = sum(1 for _, _, s in chosen if s.early_stop)
        changed = sum(1 for _, w, s in chosen if not w.text.startswith(s.text))
        cut = sum(1 for p, w, s in chosen if s.early_stop == "repetition" and w.finish != "length")
        name = "all" if task == "all" else task + (" (json_object)" if json_mode else "")
        if task != "all":
            totals = [t + x for t, x in zip(totals, [len(chosen), a, b, stops, changed, cut], strict=True)]
        share = f"{(a - b) / a:.0%}" if a else "-"
        print(f"| {name} | {len(chosen)} | {a} | {b} | {share} | {stops} | {changed} | {cut} |")
    really = sum(w.tokens - s.tokens for _, w, s in rows)
    print(f"\nsaved metric (estimated against max_tokens): {metric:.0f} tokens; really saved: {really} tokens")
    reasons: dict[str, int] = {}
    for _, _, s in rows:
        if s.early_stop:
            reasons[s.early_stop] = reasons.get(s.early_stop, 0) + 1
    print(f"early stops by rule: {reasons}")
    print(f"answers without stops that ran to max_tokens: {sum(1 for _, w, _ in rows if w.finish == 'length')}")

    print("\nsweep: the repetition rule replayed on the answers without stops (JSON-mode answers left out)")
    print("\n| n-gram | count | share saved | early stops | cut short |")
    print("|---|---|---|---|---|")
    plain = [(p, w) for p, w, _ in rows if not p.json_mode]
    total = sum(w.tokens for _, w in plain)
    for ngram in (4, 6, 8, 10, 12):
        for count in (2, 3, 4):
            fired = [(p, w, replay(w.deltas, ngram, count)) for p, w in plain]
            hit = [(p, w, t) for p, w, t in fired if t is not None]
            saved = sum(w.tokens - t for _, w, t in hit)
            cut = sum(1 for _, w, _ in hit if w.finish != "length")
            print(f"| {ngram} | {count} | {saved / total:.0%} | {len(hit)} | {cut} |")


if __name__ == "__main__":
    asyncio.run(main())
