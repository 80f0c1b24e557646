"""llama.cpp's embedding mode (config `embedding: true`): contexts made with embeddings on and
a pooling type, serving embeddings only, as llama-server does with --embeddings (generating in
an embedding context computes an output for every prompt token, and llama.cpp does not
promise logits beside pooled embeddings). Inputs are embedded one after another in a worker
thread, which checks a cancel flag between inputs; each vector is scaled to unit length, as
OpenAI's are."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from laneway.engines.base import EngineError, unit_rows
from laneway.engines.slots import SlotPool
from laneway.types import EmbeddingRequest, Embeddings

# Config `pooling` -> llama.cpp's LLAMA_POOLING_TYPE_* (none and rank give no one-vector-per-input).
POOLING_TYPES = {"mean": 1, "cls": 2, "last": 3}
POOLING_NONE, POOLING_RANK, POOLING_UNSPECIFIED = 0, 4, -1


def input_tokens(llama: Any, inputs: Sequence[str]) -> list[int]:
    """Each input's token count as Llama.embed() tokenizes: BOS, and special-token text taken
    as plain text."""
    return [len(llama.tokenize(t.encode("utf-8"), add_bos=True, special=False)) for t in inputs]


class _EmbeddingCancelled(Exception):
    """The caller went away: the worker thread stopped between inputs."""


class Embedder:
    """The embedding contexts (one a slot) and the threads that embed in them."""

    def __init__(self, contexts: Sequence[Any], *, n_embd: int, name: str) -> None:
        self.n_embd = n_embd
        self._free: SlotPool[Any] = SlotPool(list(contexts))
        self._pool = ThreadPoolExecutor(max_workers=len(contexts), thread_name_prefix=name)
        self.active = 0

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _embed_loop(self, ctx: Any, inputs: tuple[str, ...], cancel: threading.Event) -> tuple[Any, int]:
        """Runs in a worker thread: (unit-length float32 rows, tokens embedded)."""
        rows = np.empty((len(inputs), self.n_embd), dtype=np.float32)
        tokens = 0
        for i, text in enumerate(inputs):
            if cancel.is_set():
                raise _EmbeddingCancelled
            # truncate=False: an input longer than a batch is an error, never a silently cut text
            # (the gateway refuses inputs beyond the context before they get here).
            vector, count = ctx.embed(text, truncate=False, return_count=True)
            rows[i] = vector
            tokens += int(count)
        return unit_rows(rows), tokens

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        loop = asyncio.get_running_loop()
        ctx = await self._free.acquire()
        self.active += 1
        cancel = threading.Event()
        released = False

        def release(done: asyncio.Future[Any] | None = None) -> None:
            nonlocal released
            if done is not None and not done.cancelled():
                done.exception()  # retrieved: a caller that left is not told, and nothing is logged
            if not released:
                released = True
                self.active -= 1
                self._free.release(ctx)

        try:
            future = loop.run_in_executor(self._pool, self._embed_loop, ctx, request.inputs, cancel)
        except BaseException:
            release()
            raise
        # The context goes back to the pool when the thread has let go of it, not when the
        # caller stops waiting (the shield keeps a cancellation from completing `future`).
        future.add_done_callback(release)
        try:
            vectors, tokens = await asyncio.shield(future)
        except asyncio.CancelledError:
            cancel.set()
            raise
        except Exception as exc:
            raise EngineError(f"llama.cpp embedding failed: {exc}") from exc
        return Embeddings(vectors=vectors, prompt_tokens=tokens)
