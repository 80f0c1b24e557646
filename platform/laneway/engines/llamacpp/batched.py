"""The event loop's side of continuous batching: each request is a sequence of the batch
context (its id is the slot, chosen by the prefix cache and given back, with what its cells
then hold, when the decoder thread is done with it, however the stream ends), and each warm-up
system prompt is computed once into a reserved sequence whose cells later prompts starting
with the same tokens reuse (prefix_cache.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from laneway.engines.base import EngineError
from laneway.engines.llamacpp.batch_decoder import BatchDecoder, BatchSequence
from laneway.engines.llamacpp.deltas import DONE, queued_deltas
from laneway.engines.llamacpp.plan import DecodePlan
from laneway.engines.llamacpp.prefix_cache import Prefix, SlotCache
from laneway.engines.slots import SlotPool
from laneway.types import Delta, GenerationRequest


class BatchedGeneration:
    """Sequence ids 0..parallel-1 are the slots; those after them hold warmed prefixes."""

    def __init__(self, decoder: BatchDecoder, parallel: int) -> None:
        self.decoder = decoder
        self.cache = SlotCache(parallel)
        # A ticket a slot: holding one, a request may take an idle slot (which: the cache says).
        self._free: SlotPool[None] = SlotPool([None] * parallel)
        self.active = 0

    async def generate(
        self, req: GenerationRequest, plan: DecodePlan, prompt: list[int]
    ) -> AsyncGenerator[Delta, None]:
        loop = asyncio.get_running_loop()
        await self._free.acquire()
        start = self.cache.take(prompt, req.cache_salt)
        self.active += 1
        out: asyncio.Queue[Any] = asyncio.Queue()

        def exited() -> None:  # on the loop
            self.active -= 1
            self.cache.give_back(start.slot, seq.kept, req.cache_salt)
            self._free.release(None)
            out.put_nowait(DONE)

        def emit(item: Any) -> None:  # from the decoder thread
            loop.call_soon_threadsafe(out.put_nowait, item)

        def on_exit() -> None:  # from the decoder thread
            loop.call_soon_threadsafe(exited)

        seq = BatchSequence(
            start.slot, req, plan, prompt, emit=emit, on_exit=on_exit, reuse=start.reuse, copy_from=start.copy_from
        )
        try:
            self.decoder.submit(seq)
        except BaseException:
            exited()
            raise
        try:
            async for delta in queued_deltas(out, req.n):
                yield delta
        finally:
            seq.cancel.set()
            self.decoder.wake()

    async def warm_prefix(self, seq_id: int, req: GenerationRequest, plan: DecodePlan, prompt: list[int]) -> None:
        """Compute `prompt` (a system prompt's chat, as warm-up renders it) into the reserved
        sequence `seq_id`, where its cells stay for later prompts that start with its tokens."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:  # on the loop
            if done.done():
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(EngineError(f"llama.cpp could not compute a warm-up system prompt: {error}"))

        def emit(error: Any) -> None:  # from the decoder thread: a failed step
            loop.call_soon_threadsafe(settle, error)

        def on_exit() -> None:  # from the decoder thread: the cells are kept (or it was stopped)
            loop.call_soon_threadsafe(settle, None)

        seq = BatchSequence(seq_id, req, plan, prompt, emit=emit, on_exit=on_exit, reserve=True)
        self.decoder.submit(seq)
        try:
            await done
        except asyncio.CancelledError:
            seq.cancel.set()
            self.decoder.wake()
            raise
        if seq.kept is not None:  # not when the decoder stopped before computing it
            self.cache.prefixes.append(Prefix(seq_id, seq.kept))
