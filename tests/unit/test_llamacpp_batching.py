"""llama.cpp with continuous batching (engines/llamacpp/batch_decoder.py): one model and one context of
`parallel` sequences; each step decodes every running sequence's next token together with a
chunk of a waiting prompt; a cancelled sequence leaves between steps, its slot keeping the
cells of the steps that completed; a warmed system prompt's cells are copied into a sequence
whose prompt starts with it (the slot cache itself: test_llamacpp_prefix_cache.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from laneway.engines.base import system_prompt_chat
from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN
from laneway.engines.llamacpp import LlamaCppEngine
from laneway.engines.llamacpp.batch_decoder import MIN_STEP_PROMPT_TOKENS as FLOOR
from laneway.engines.llamacpp.batch_decoder import WHOLE_PROMPT_TOKENS, step_prompt_tokens
from laneway.types import ChatTurn, Delta, GenerationRequest
from support import until


def engine(path: Path, **config: Any) -> LlamaCppEngine:
    base = {"model_path": str(path), "parallel": 4, "demo": True, "ban_tokens": [EOS_TOKEN, IM_END_TOKEN]}
    return LlamaCppEngine("tiny", {**base, **config}, max_model_len=512)


@pytest.fixture
async def batched(demo_model_path: Path) -> AsyncIterator[LlamaCppEngine]:
    e = engine(demo_model_path, n_batch=16)  # small steps: a prompt is fed in several chunks
    await e.start()
    yield e
    await e.close()


async def request(e: LlamaCppEngine, prompt: str = "hello world", **kw: Any) -> GenerationRequest:
    m = await e.measure(prompt=prompt)
    return GenerationRequest(
        request_id="r", prompt=m.text, prompt_tokens=m.tokens, prompt_ids=m.ids, **{"max_tokens": 24, "seed": 3, **kw}
    )


async def run(e: LlamaCppEngine, r: GenerationRequest) -> list[Delta]:
    return [d async for d in e.generate(r)]


async def idle(e: LlamaCppEngine) -> None:
    await until(lambda: not e.active_slots, within=5, step=0.001, what="every slot free")


def text(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


async def test_one_copy_of_the_weights_and_sequences_decoded_together(batched: LlamaCppEngine) -> None:
    assert len(batched._contexts) == 1 and batched._decoder is not None  # not one Llama per slot
    results = await asyncio.gather(*[run(batched, await request(batched, seed=i)) for i in range(4)])
    assert [sum(d.tokens for d in r) for r in results] == [24] * 4
    decoder = batched._decoder
    assert decoder.max_batched_sequences == 4
    assert decoder.steps < 4 * 24  # far fewer decode calls than tokens: the four shared them
    await idle(batched)


async def test_the_same_seed_decodes_the_same_text_as_one_context_per_slot(demo_model_path: Path) -> None:
    per_slot = engine(demo_model_path, batching=False)
    batched = engine(demo_model_path)
    await per_slot.start()
    await batched.start()
    try:
        for kw in ({"seed": 11, "temperature": 0.9}, {"temperature": 0}, {"seed": 2, "n": 2}):
            a = await run(per_slot, await request(per_slot, **kw))
            b = await run(batched, await request(batched, **kw))
            assert [(d.index, d.text, d.finish_reason) for d in a] == [(d.index, d.text, d.finish_reason) for d in b]
    finally:
        await per_slot.close()
        await batched.close()


async def test_a_long_prompt_is_fed_in_chunks_between_the_others_decode_steps(batched: LlamaCppEngine) -> None:
    decoder = batched._decoder
    assert decoder is not None
    short = asyncio.ensure_future(run(batched, await request(batched, max_tokens=200)))
    await until(lambda: decoder.steps >= 3, step=0.001, what="the short one decoding")
    long = await request(batched, prompt="word " * 150, max_tokens=4)
    assert long.prompt_tokens > 100
    before = decoder.mixed_steps
    await run(batched, long)
    # 16 tokens a step: the long prompt took several steps, each also carrying the short one's token
    assert decoder.mixed_steps - before >= long.prompt_tokens // 16 - 1
    assert not short.done()
    short.cancel()


async def test_a_short_prompt_behind_a_long_one_is_fed_first(batched: LlamaCppEngine) -> None:
    decoder = batched._decoder
    assert decoder is not None
    long = await request(batched, prompt="the " * 470, max_tokens=1)
    assert 400 < long.prompt_tokens < 500  # 16 tokens a step: 30 steps of prefill, in a sequence's 512 cells
    start = decoder.steps
    task = asyncio.ensure_future(run(batched, long))
    await until(lambda: decoder.steps >= start + 2, step=0.0005, what="the long one prefilling")
    stream = batched.generate(await request(batched, prompt="hello", max_tokens=2))
    first = await stream.__anext__()
    assert first.tokens == 1 and not task.done()  # its first token came before the long prompt was in
    await stream.aclose()
    await task


async def test_a_cancelled_sequence_leaves_with_its_slot_back_holding_only_what_the_cache_says(
    batched: LlamaCppEngine,
) -> None:
    r = await request(batched, max_tokens=400)
    stream = batched.generate(r)
    got = [await stream.__anext__() for _ in range(3)]
    assert all(d.finish_reason is None for d in got)
    await stream.aclose()
    await idle(batched)
    ctx, gen = batched._batch_ctx, batched._batched
    assert ctx is not None and gen is not None
    kept = [gen.cache.kept(s).tokens.tolist() for s in range(4)]
    held = [s for s in range(4) if kept[s]]
    assert len(held) == 1 and kept[held[0]][: r.prompt_tokens] == list(r.prompt_ids or ())
    assert len(kept[held[0]]) > r.prompt_tokens  # and the tokens decoded before it left
    assert [ctx.last_position(s) for s in range(4)] == [len(k) - 1 for k in kept]  # no cell beyond
    again = await run(batched, await request(batched, max_tokens=5))
    assert sum(d.tokens for d in again) == 5


async def test_n_choices_reuse_the_prompts_cells_and_differ_by_seed(batched: LlamaCppEngine) -> None:
    deltas = await run(batched, await request(batched, n=3, max_tokens=8, seed=5))
    by_choice = {i: text([d for d in deltas if d.index == i]) for i in range(3)}
    assert len(set(by_choice.values())) == 3
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["length"] * 3
    await idle(batched)


def test_a_steps_prompt_tokens_fit_its_time_budget_between_the_floor_and_n_batch() -> None:
    # 2 ms a token, 100 ms a step: 50 tokens, less the decoding sequences' own
    assert step_prompt_tokens(0.002, 0.1, 0, 512) == 50
    assert step_prompt_tokens(0.002, 0.1, 8, 512) == 42
    assert step_prompt_tokens(0.02, 0.1, 8, 512) == FLOOR  # slow hardware: never below the floor
    assert step_prompt_tokens(0.02, 0.1, 500, 512) == 12  # nor beyond what n_batch leaves
    assert step_prompt_tokens(0.00001, 0.1, 8, 512) == 504  # fast hardware: full chunks
    assert step_prompt_tokens(None, 0.1, 0, 512) == FLOOR  # nothing measured: a short first step
    assert step_prompt_tokens(None, 0.0, 3, 512) == step_prompt_tokens(0.02, 0.0, 3, 512) == 509  # no budget


@pytest.mark.parametrize(("max_step_ms", "chunk"), [(1e-6, FLOOR), (1e9, 512), (0, 512)])
async def test_a_long_prompt_alone_is_fed_in_chunks_sized_to_the_step_budget(
    demo_model_path: Path, max_step_ms: float, chunk: int
) -> None:
    e = engine(demo_model_path, max_step_ms=max_step_ms)  # n_batch 512
    await e.start()
    try:
        decoder = e._decoder
        assert decoder is not None
        await run(e, await request(e, max_tokens=2))  # a token's cost measured
        long = await request(e, prompt="the " * 470, max_tokens=1)
        assert long.prompt_tokens > 400
        before = decoder.steps
        await run(e, long)  # one token: sampled in the step that ends the prompt
        # a tiny budget: floor-sized chunks; a huge one, or none: n_batch
        assert decoder.steps - before == -(-long.prompt_tokens // chunk)
    finally:
        await e.close()


async def test_a_short_prompt_goes_whole_into_one_step_even_past_the_budget(demo_model_path: Path) -> None:
    e = engine(demo_model_path, max_step_ms=1e-6)  # a budget of the floor, 32 tokens
    await e.start()
    try:
        decoder = e._decoder
        assert decoder is not None
        await run(e, await request(e, max_tokens=2))
        short = await request(e, prompt="the " * 50, max_tokens=1)
        assert FLOOR < short.prompt_tokens <= WHOLE_PROMPT_TOKENS
        before = decoder.steps
        await run(e, short)
        assert decoder.steps - before == 1  # not 32 + the rest: one step, whole
    finally:
        await e.close()


async def test_the_step_budget_only_cuts_the_prompt_into_smaller_chunks(demo_model_path: Path) -> None:
    # llama.cpp's sums depend on the chunk size (a seeded choice can tell n_batch 32 from 512),
    # so the budget's text is the text of floor-sized chunks without it; greedy, that of full ones
    engines = [
        engine(demo_model_path, max_step_ms=1e-6),
        engine(demo_model_path, max_step_ms=0, n_batch=FLOOR),
        engine(demo_model_path, max_step_ms=0),
    ]
    for e in engines:
        await e.start()
    try:
        for kw in ({"seed": 11, "temperature": 0.9}, {"temperature": 0}, {"seed": 2, "n": 2}):
            a, b, c = [
                [(d.index, d.text) for d in await run(e, await request(e, prompt="the cat " * 120, **kw))]
                for e in engines
            ]
            assert a == b
            if kw.get("temperature") == 0:
                assert a == c
        small = engines[0]._decoder
        assert small is not None and small.prompt_budget == FLOOR
    finally:
        for e in engines:
            await e.close()


SYSTEM = "you are the model that can answer each user with what is true and not what is said " * 2


async def chat(e: LlamaCppEngine, user: str, **kw: Any) -> GenerationRequest:
    m = await e.measure(messages=[ChatTurn("system", SYSTEM), ChatTurn("user", user)])
    return GenerationRequest(
        request_id="r", prompt=m.text, prompt_tokens=m.tokens, prompt_ids=m.ids, **{"max_tokens": 24, "seed": 3, **kw}
    )


@pytest.fixture
async def warmed(demo_model_path: Path) -> AsyncIterator[LlamaCppEngine]:
    e = engine(demo_model_path, n_batch=16, warmup_system_prompts=[SYSTEM])
    await e.start()
    await e.warmup([])
    yield e
    await e.close()


async def test_a_warmed_system_prompt_is_reused_and_decodes_what_the_cold_prompt_does(
    warmed: LlamaCppEngine, demo_model_path: Path
) -> None:
    cold = engine(demo_model_path, n_batch=16)
    await cold.start()
    try:
        warm_ids = (await warmed.measure(messages=system_prompt_chat(SYSTEM))).ids
        # each in a cache partition of its own: only the warm-up prefix is shared
        for i, kw in enumerate(({"seed": 11, "temperature": 0.9}, {"temperature": 0}, {"seed": 2, "n": 2})):
            r = await chat(warmed, "how many people see the world", cache_salt=f"t{i}", **kw)
            shared = next(i for i, (a, b) in enumerate(zip(warm_ids, r.prompt_ids or (), strict=False)) if a != b)
            before = warmed.prefix_tokens_reused
            a = await run(warmed, r)
            b = await run(cold, await chat(cold, "how many people see the world", cache_salt=f"t{i}", **kw))
            assert [(d.index, d.text, d.finish_reason) for d in a] == [(d.index, d.text, d.finish_reason) for d in b]
            assert warmed.prefix_tokens_reused - before == shared > 40  # the system turn and the user marker
        assert warmed.prefix_hits == 3 and cold.prefix_hits == 0
    finally:
        await cold.close()


async def test_reserved_sequences_come_beside_the_slots_and_all_slots_share_the_prefix(warmed: LlamaCppEngine) -> None:
    assert warmed._batch_ctx is not None and warmed._batch_ctx.sequences == 4 + 1
    results = await asyncio.gather(*[run(warmed, await chat(warmed, f"test {i}", seed=i)) for i in range(4)])
    assert [sum(d.tokens for d in r) for r in results] == [24] * 4
    assert warmed.prefix_hits == 4
    assert warmed._decoder is not None and warmed._decoder.max_batched_sequences == 4
    await idle(warmed)


async def test_a_short_prompt_sharing_only_a_few_tokens_is_computed_in_full(warmed: LlamaCppEngine) -> None:
    deltas = await run(warmed, await request(warmed, prompt="<|im_start|>system\nyou"))
    assert sum(d.tokens for d in deltas) == 24
    assert warmed.prefix_hits == 0  # a few shared tokens are not worth a copy of the whole stream


async def test_cancelling_a_sequence_that_reused_the_prefix_leaves_the_prefix_for_the_next(
    warmed: LlamaCppEngine,
) -> None:
    ctx = warmed._batch_ctx
    assert ctx is not None
    prefix_end = ctx.last_position(4)
    assert prefix_end == len((await warmed.measure(messages=system_prompt_chat(SYSTEM))).ids) - 1
    first = text(await run(warmed, await chat(warmed, "what time is it")))
    stream = warmed.generate(await chat(warmed, "what time is it", max_tokens=400, cache_salt="cancelled"))
    got = [await stream.__anext__() for _ in range(3)]
    assert all(d.finish_reason is None for d in got)
    await stream.aclose()
    await idle(warmed)
    assert ctx.last_position(4) == prefix_end  # the shared prefix: whole
    again = text(await run(warmed, await chat(warmed, "what time is it", cache_salt="other")))
    assert again == first and warmed.prefix_hits == 3  # another partition: from the warm-up prefix


async def test_warm_up_itself_runs_the_system_prompts_chat_from_the_prefix(demo_model_path: Path) -> None:
    e = engine(demo_model_path, warmup_system_prompts=[SYSTEM, SYSTEM.upper()])
    await e.start()
    try:
        prompts = [(await e.measure(messages=system_prompt_chat(s))).text for s in e.system_prompts]
        await e.warmup(["hello", *prompts])
        assert e.warmed_prompts == 3 and e.prefix_hits == 2
        lengths = [(await e.measure(prompt=p)).tokens for p in prompts]
        assert e.prefix_tokens_reused == sum(n - 1 for n in lengths)  # all but the last token, for its logits
    finally:
        await e.close()
