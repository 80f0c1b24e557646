"""llama.cpp with one `Llama` context per slot (config `batching: false`): each request's
choices decode in a worker thread of its own, one after another in its slot, so the event
loop never blocks on decode. Deltas cross back to the loop with call_soon_threadsafe. Closing
the stream sets a cancel flag that the decode loop checks before every token; the slot
returns to the pool only when the thread has let go of it.

Prefix reuse: a context keeps the tokens it last computed (`Llama.input_ids[:n_tokens]`, which
llama-cpp-python matches against the next prompt), and the prefix cache (prefix_cache.py)
picks the slot. Before each choice the context's history is cut to what the request may reuse
(`n_tokens`; reset when nothing), so a prompt never starts from another cache partition's
cells, nor from fewer than MIN_PREFIX_REUSE shared tokens, and its last token is always
decoded."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from laneway.engines.llamacpp.choice_text import ChoiceText, token_logprob
from laneway.engines.llamacpp.deltas import DONE, queued_deltas
from laneway.engines.llamacpp.plan import DecodePlan
from laneway.engines.llamacpp.prefix_cache import SlotCache
from laneway.engines.slots import SlotPool
from laneway.types import Delta, GenerationRequest, TokenLogprob

Emit = Callable[[Any], None]


class SlotDecoding:
    """The contexts (one a slot) and the threads that decode in them."""

    def __init__(self, contexts: Sequence[Any], *, n_vocab: int, eog: Callable[[int], bool], name: str) -> None:
        self.n_vocab, self.eog = n_vocab, eog
        self._contexts = list(contexts)
        self.cache = SlotCache(len(self._contexts))
        # A ticket a slot: holding one, a request may take an idle context (which: the cache says).
        self._free: SlotPool[None] = SlotPool([None] * len(self._contexts))
        self._pool = ThreadPoolExecutor(max_workers=len(contexts), thread_name_prefix=name)
        self.active = 0
        self.prefix_hits = 0  # requests that started from their context's kept tokens
        self.prefix_tokens_reused = 0  # prompt tokens they did not compute
        self.prompt_tokens_computed = 0  # prompt tokens requests started without cached cells

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    async def generate(
        self, req: GenerationRequest, plan: DecodePlan, prompt: list[int]
    ) -> AsyncGenerator[Delta, None]:
        loop = asyncio.get_running_loop()
        await self._free.acquire()
        start = self.cache.take(prompt, req.cache_salt)
        ctx = self._contexts[start.slot]
        self.active += 1
        self.prompt_tokens_computed += len(prompt) - start.reuse
        if start.reuse:
            self.prefix_hits += 1
            self.prefix_tokens_reused += start.reuse
        cancel = threading.Event()
        out: asyncio.Queue[Any] = asyncio.Queue()
        released = False

        def release(kept: np.ndarray | None) -> None:
            nonlocal released
            if not released:
                released = True
                self.active -= 1
                self.cache.give_back(start.slot, kept, req.cache_salt)
                self._free.release(None)

        def emit(item: Any) -> None:
            loop.call_soon_threadsafe(out.put_nowait, item)

        try:
            future = loop.run_in_executor(
                self._pool, self._decode_loop, ctx, prompt, start.reuse, req, plan, cancel, emit
            )
        except BaseException:
            release(None)
            raise
        # The slot is free once the decode thread has returned, whoever stops first.
        future.add_done_callback(lambda f: release(None if f.cancelled() or f.exception() else f.result()))
        try:
            async for delta in queued_deltas(out, req.n):
                yield delta
        finally:
            cancel.set()

    def _decode_loop(
        self,
        ctx: Any,
        ids: list[int],
        reuse: int,
        req: GenerationRequest,
        plan: DecodePlan,
        cancel: threading.Event,
        emit: Emit,
    ) -> np.ndarray | None:
        """Runs in a worker thread: each of the request's n choices in turn, in this slot.
        Emits Delta objects, then DONE (or the exception). Returns the token ids the context's
        cells hold (None: not known, after a failure)."""
        try:
            _cut(ctx, reuse)  # first, so even a request stopped now leaves only its own tokens
            for index in range(req.n):
                if cancel.is_set():
                    break
                if index:  # a later choice: all but the prompt's last token
                    _cut(ctx, len(ids) - 1)
                seed = req.seed + index if req.seed is not None else random.getrandbits(32)
                ctx.set_seed(seed & 0xFFFFFFFF)
                self._one_choice(ctx, ids, req, plan, index, cancel, emit)
            return np.array(ctx.input_ids[: ctx.n_tokens], dtype=np.int32)
        except BaseException as exc:  # surfaced on the loop as EngineError
            ctx.reset()
            emit(exc)
            return None
        finally:
            emit(DONE)

    def _one_choice(
        self,
        ctx: Any,
        ids: list[int],
        req: GenerationRequest,
        plan: DecodePlan,
        index: int,
        cancel: threading.Event,
        emit: Emit,
    ) -> None:
        bias_ids, bias_vals = plan.bias_ids, plan.bias_vals
        sampled = 0  # tokens drawn for this choice: the processor runs once before each

        def apply_bias(_: Any, scores: np.ndarray) -> np.ndarray:
            nonlocal sampled
            if len(bias_ids):
                scores[bias_ids] += bias_vals
            if sampled < plan.hold_eog and plan.eog_ids is not None:
                scores[plan.eog_ids] = -np.inf
            sampled += 1
            return scores

        choice = ChoiceText(req, plan.mode, plan.tools, index, emit)
        for tok in ctx.generate(
            ids,
            temp=max(req.temperature, 0.0),
            top_p=req.top_p,
            top_k=plan.top_k,
            min_p=plan.min_p,
            repeat_penalty=plan.repeat_penalty,
            reset=True,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            logits_processor=[apply_bias],
            grammar=plan.grammar,
        ):
            if cancel.is_set():
                choice.finish("cancelled")
                return
            if self.eog(tok):
                choice.finish("stop")
                return
            logprobs = (self._logprob(ctx, tok, req.logprobs, plan),) if req.logprobs is not None else ()
            if choice.token(ctx.detokenize([tok]), logprobs):
                return
        choice.finish("length")

    def _logprob(self, ctx: Any, tok: int, top: int, plan: DecodePlan) -> TokenLogprob:
        from llama_cpp import llama_get_logits_ith

        def piece(token: int) -> bytes:
            return bytes(ctx.detokenize([token]))

        logits = llama_get_logits_ith(ctx.ctx, -1)
        return token_logprob(logits, self.n_vocab, tok, top, plan.bias_ids, plan.bias_vals, piece)


def _cut(ctx: Any, keep: int) -> None:
    """The context's history to its first `keep` tokens (llama-cpp-python's next generate()
    drops the cells past them), or none."""
    if keep:
        ctx.n_tokens = min(ctx.n_tokens, keep)
    else:
        ctx.reset()
