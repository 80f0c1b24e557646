"""The llama.cpp engine's prefix cache (engines/llamacpp/prefix_cache.py), on the real demo model,
batched and with one context per slot: a slot keeps its last request's cells; a request of the
same cache partition whose prompt starts with them reuses them, another partition never does
(only the warm-up system prompts are shared); a request without reuse takes the least recently
used slot; what is reused decodes what computing it would; a prefill cancelled part way leaves
only the cells it computed."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from laneway.engines.base import PrefixReusingEngine, system_prompt_chat
from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN
from laneway.engines.llamacpp import LlamaCppEngine
from laneway.engines.llamacpp.prefix_cache import MIN_PREFIX_REUSE, Prefix, SlotCache, Start, shared_tokens
from laneway.types import ChatTurn, Delta, GenerationRequest
from support import until

SYSTEM = "you are the model that can answer each user with what is true and not what is said " * 2
PROMPTS = {  # no two share MIN_PREFIX_REUSE leading tokens
    "a": "alpha beta gamma delta " * 8,
    "b": "one two three four five " * 8,
    "c": "red green blue yellow " * 8,
    "d": "north south east west " * 8,
}


def engine(path: Path, **config: Any) -> LlamaCppEngine:
    base = {"model_path": str(path), "parallel": 3, "demo": True, "ban_tokens": [EOS_TOKEN, IM_END_TOKEN]}
    return LlamaCppEngine("tiny", {**base, **config}, max_model_len=512)


@pytest.fixture(params=[True, False], ids=["batched", "per-slot"])
async def llama(request: pytest.FixtureRequest, demo_model_path: Path) -> AsyncIterator[LlamaCppEngine]:
    e = engine(demo_model_path, batching=request.param)
    await e.start()
    yield e
    await e.close()


async def prompt_request(e: LlamaCppEngine, prompt: str, **kw: Any) -> GenerationRequest:
    m = await e.measure(prompt=prompt)
    return GenerationRequest(
        request_id="r",
        prompt=m.text,
        prompt_tokens=m.tokens,
        prompt_ids=m.ids,
        **{"max_tokens": 12, "temperature": 0, **kw},
    )


async def chat(e: LlamaCppEngine, turns: list[ChatTurn], **kw: Any) -> GenerationRequest:
    m = await e.measure(messages=turns)
    return GenerationRequest(
        request_id="r",
        prompt=m.text,
        prompt_tokens=m.tokens,
        prompt_ids=m.ids,
        **{"max_tokens": 16, "temperature": 0, **kw},
    )


async def run(e: LlamaCppEngine, r: GenerationRequest) -> list[tuple[int, str, str | None]]:
    """What `r` decoded, once its slot is back (the moment after its last delta): the next
    request may start from its cells, as a client's next turn would."""
    deltas: list[Delta] = [d async for d in e.generate(r)]
    await idle(e)
    return [(d.index, d.text, d.finish_reason) for d in deltas]


async def reused_by(e: LlamaCppEngine, r: GenerationRequest) -> tuple[int, list[tuple[int, str, str | None]]]:
    """The prompt tokens `r` started from cached cells, and what it decoded."""
    before = e.prefix_tokens_reused
    out = await run(e, r)
    return e.prefix_tokens_reused - before, out


async def idle(e: LlamaCppEngine) -> None:
    await until(lambda: not e.active_slots, within=5, step=0.001, what="every slot free")


def text(out: list[tuple[int, str, str | None]]) -> str:
    return "".join(t for _, t, _ in out)


def ids(tokens: tuple[int, ...] | None) -> np.ndarray:
    assert tokens is not None
    return np.asarray(tokens, dtype=np.int32)


async def test_a_second_turn_reuses_the_first_turns_cells_within_its_partition(llama: LlamaCppEngine) -> None:
    turns = [ChatTurn("system", SYSTEM), ChatTurn("user", "how many people see the world")]
    first = await chat(llama, turns, cache_salt="tenant-a")
    reused, answer = await reused_by(llama, first)
    assert reused == 0
    turns += [ChatTurn("assistant", text(answer)), ChatTurn("user", "and who are they")]
    second = await chat(llama, turns, cache_salt="tenant-a")
    shared = shared_tokens(ids(first.prompt_ids), ids(second.prompt_ids))
    assert shared > 40  # the system turn and the first question at least
    reused, _ = await reused_by(llama, second)
    assert shared <= reused < second.prompt_tokens  # the first turn (and its answer's tokens, as decoded)
    assert llama.prefix_hits == 1
    assert llama.prompt_tokens_computed == first.prompt_tokens + second.prompt_tokens - reused


async def test_the_same_prompt_under_another_partition_reuses_nothing(llama: LlamaCppEngine) -> None:
    r = await prompt_request(llama, PROMPTS["a"], cache_salt="tenant-a")
    assert (await reused_by(llama, r))[0] == 0
    assert (await reused_by(llama, r))[0] == r.prompt_tokens - 1  # all but the last: decoded for its logits
    for salt in ("tenant-b", None):  # None is a partition of its own too
        other = await prompt_request(llama, PROMPTS["a"], cache_salt=salt)
        assert (await reused_by(llama, other))[0] == 0
    assert (await reused_by(llama, r))[0] == r.prompt_tokens - 1  # tenant-a's cells, still there for it


async def test_another_partition_shares_only_the_warm_up_system_prompt(demo_model_path: Path) -> None:
    e = engine(demo_model_path, warmup_system_prompts=[SYSTEM])
    await e.start()
    try:
        await e.warmup([])
        turns = [ChatTurn("system", SYSTEM), ChatTurn("user", "what time is it")]
        a = await chat(e, turns, cache_salt="tenant-a")
        warm = shared_tokens(ids((await e.measure(messages=system_prompt_chat(SYSTEM))).ids), ids(a.prompt_ids))
        assert warm >= MIN_PREFIX_REUSE
        assert (await reused_by(e, a))[0] == warm  # the warm-up prefix, copied
        assert (await reused_by(e, a))[0] == a.prompt_tokens - 1  # its own slot's cells
        b = await chat(e, turns, cache_salt="tenant-b")
        assert (await reused_by(e, b))[0] == warm  # the warm-up prefix again, never tenant-a's cells
    finally:
        await e.close()


async def test_a_request_without_reuse_takes_the_least_recently_used_slot(llama: LlamaCppEngine) -> None:
    reqs = {k: await prompt_request(llama, p, cache_salt="t") for k, p in PROMPTS.items()}
    for k in "abc":  # three slots, one conversation each (an empty slot goes before a used one)
        assert (await reused_by(llama, reqs[k]))[0] == 0
    assert (await reused_by(llama, reqs["a"]))[0] > 0  # a used again: b is now the least recent
    assert (await reused_by(llama, reqs["d"]))[0] == 0  # takes b's slot
    assert (await reused_by(llama, reqs["c"]))[0] > 0
    assert (await reused_by(llama, reqs["a"]))[0] > 0
    assert (await reused_by(llama, reqs["b"]))[0] == 0  # evicted


@pytest.mark.parametrize("kw", [{}, {"n": 2}, {"seed": 5, "temperature": 0.8, "n": 2}], ids=["greedy", "n", "seed"])
async def test_reused_cells_decode_what_computing_them_does(llama: LlamaCppEngine, kw: dict[str, Any]) -> None:
    turns = [ChatTurn("system", SYSTEM), ChatTurn("user", "how many people see the world")]
    cold = await run(llama, await chat(llama, turns, cache_salt="cold-1", **kw))
    reused, warm = await reused_by(llama, await chat(llama, turns, cache_salt="cold-1", **kw))
    assert reused > 40 and warm == cold
    turns += [ChatTurn("assistant", text([o for o in cold if o[0] == 0])), ChatTurn("user", "and who are they")]
    reused, warm = await reused_by(llama, await chat(llama, turns, cache_salt="cold-1", **kw))
    assert reused > 40
    assert warm == await run(llama, await chat(llama, turns, cache_salt="cold-2", **kw))  # computed whole


async def test_a_prefill_cancelled_part_way_leaves_only_the_cells_it_computed(demo_model_path: Path) -> None:
    e = engine(demo_model_path, n_batch=16, max_step_ms=0)  # 16 prompt tokens a step
    await e.start()
    try:
        gen, ctx = e._batched, e._batch_ctx
        assert gen is not None and ctx is not None
        # The decoder thread waits after its 4th step until the client has gone: the cancel is
        # seen between steps, 4 x 16 prompt tokens in.
        decode, steps, gone = ctx.decode, [0], threading.Event()

        def held_decode(n_tokens: int) -> None:
            decode(n_tokens)
            steps[0] += 1
            if steps[0] == 4:
                gone.wait(5)

        ctx.decode = held_decode
        long = await prompt_request(e, "the cat sat on the mat " * 40, cache_salt="t")
        assert 300 < long.prompt_tokens < 500
        task = asyncio.ensure_future(run(e, long))
        await until(lambda: steps[0] >= 4, step=0.0005, what="four prefill steps")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        gone.set()
        await idle(e)
        kept = [(s, gen.cache.kept(s).tokens.tolist()) for s in range(3) if len(gen.cache.kept(s).tokens)]
        assert [(slot, len(tokens)) for slot, tokens in kept] == [(kept[0][0], 4 * 16)]
        slot, tokens = kept[0]
        assert tokens == list(long.prompt_ids or ())[: len(tokens)]
        assert ctx.last_position(slot) == len(tokens) - 1  # no cell the index does not know of
        reused, out = await reused_by(e, long)
        assert reused == len(tokens)
        assert out == await run(e, await prompt_request(e, "the cat sat on the mat " * 40, cache_salt="u"))
    finally:
        await e.close()


def test_the_engine_publishes_its_counters_where_the_metrics_read_them(demo_model_path: Path) -> None:
    e, embedder = engine(demo_model_path), engine(demo_model_path, embedding=True)
    assert isinstance(e, PrefixReusingEngine) and e.reuses_prefixes
    assert isinstance(embedder, PrefixReusingEngine) and not embedder.reuses_prefixes


def test_the_index_picks_the_longest_source_and_copies_only_when_a_warm_up_prefix_is_longer() -> None:
    cache = SlotCache(3)
    cache.prefixes.append(Prefix(3, np.arange(40, dtype=np.int32)))
    prompt = list(range(100))
    first = cache.take(prompt, "t")
    assert first == Start(0, 40, copy_from=3)  # nothing cached yet: the warm-up prefix, in the first slot
    cache.give_back(0, np.arange(30, dtype=np.int32), "t")  # cancelled 30 tokens in
    other = cache.take([7] * 50, "t")
    assert other == Start(1)  # shares nothing: the least recently used slot, an unused one first
    cache.give_back(1, np.full(50, 7, dtype=np.int32), "t")
    assert cache.take(prompt, "t") == Start(2, 40, copy_from=3)  # 40 > 30: copied, into the unused slot
    cache.give_back(2, np.arange(100, dtype=np.int32), "t")
    assert cache.take(prompt, "t") == Start(2, 99)  # its own cells, in place (the last token is decoded)
    assert cache.take(prompt, "u") == Start(0, 40, copy_from=3)  # another partition: the least recent slot
