"""A calibrated engine simulator with continuous batching, for scheduler tests and benchmarks.

Not a model: it emits deterministic filler words and says so (`system_fingerprint` of every
response is "laneway-sim"). Its cost model is what makes queueing real:

  step time = decode_ms_base + decode_ms_per_seq * batch size
              + prefill_ms_per_token * prompt tokens of sequences joining this step

Up to `max_concurrency` sequences run at once; the rest wait inside the engine, as they
would in vLLM. Its tokenizer counts one token per 4 characters (at least one).

Fault injection, for proving that one request's failure harms no other: a prompt that
contains `fault_marker` (config, default "<<laneway-sim-fault>>") fails with EngineError
after `fault_after_tokens` tokens (default 2).

Embeddings (config `embeddings: true`; such a deployment only embeds): a deterministic unit
vector of `embedding_dim` (default 64) per input, seeded by its text, after
`prefill_ms_per_token` for each of the inputs' tokens plus `embed_ms` (default 0); an input
that contains `fault_marker` fails the call with EngineError.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from collections import deque
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

import numpy as np

from laneway.engines.adapter import DeploymentFacts, EngineAdapter
from laneway.engines.base import EngineError, run_warmup, unit_rows
from laneway.engines.config import SimConfig
from laneway.engines.demo_model import WORDS
from laneway.types import Delta, EmbeddingRequest, Embeddings, GenerationRequest

SIM_FINGERPRINT = "laneway-sim"


@dataclass(eq=False)
class _Sequence:
    request: GenerationRequest
    rng: random.Random
    out: asyncio.Queue[Delta] = field(default_factory=asyncio.Queue)
    produced: int = 0
    prefilled: bool = False


class SimEngine(EngineAdapter[SimConfig]):
    engine = "sim"
    config_type = SimConfig
    default_quantization = default_gpu_type = "sim"

    def __init__(self, alias: str, config: Mapping[str, Any] | SimConfig, **row: Unpack[DeploymentFacts]) -> None:
        super().__init__(alias, config, **row)
        c = self.config
        self.prefill_ms_per_token = c.prefill_ms_per_token
        self.decode_ms_base = c.decode_ms_base
        self.decode_ms_per_seq = c.decode_ms_per_seq
        self.max_concurrency = c.max_concurrency
        self.fault_marker = c.fault_marker
        self.fault_after_tokens = c.fault_after_tokens
        self.warmup_ms = c.warmup_ms
        self.warmed_prompts = 0
        self.embeddings = c.embeddings
        self.info = self.describe(
            context=self.max_model_len or c.max_model_len, slots=c.max_concurrency, embeddings_only=c.embeddings
        )
        self.embedding_dim = c.embedding_dim
        self.embed_ms = c.embed_ms
        self.embedding_calls = 0  # embed() calls that reached the engine, ever
        self._embedding = 0  # embed() calls running now
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.steps = 0
        self.admitted = 0  # sequences that reached the engine, ever
        self.recent: deque[str] = deque(maxlen=1000)  # their request ids, newest last

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._step_loop(), name=f"sim-{self.alias}")

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass

    @property
    def active_slots(self) -> int:
        return len(self._running) + self._embedding

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def health(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    async def warmup(self, prompts: Sequence[str]) -> None:
        """Runs each prompt for one token; `warmup_ms` (config) stands for an engine's own start-up
        work (CUDA graph capture, cache allocation) so readiness gating can be seen."""
        await asyncio.sleep(self.warmup_ms / 1000.0)
        if self.embeddings:  # nothing to warm in a simulated embedder (and embed_ms may be long)
            self.warmed_prompts += len(prompts)
            return
        self.warmed_prompts += await run_warmup(self, prompts)

    async def measure_inputs(self, inputs: Sequence[str]) -> list[int]:
        return [max(1, (len(t) + 3) // 4) for t in inputs]

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        if not self.embeddings:
            raise EngineError(f"sim deployment for {self.alias} does not embed (config embeddings: false)")
        self.embedding_calls += 1
        self._embedding += 1
        try:  # cancelling this sleep is the cancellation: nothing else is held
            await asyncio.sleep((self.embed_ms + self.prefill_ms_per_token * request.prompt_tokens) / 1000.0)
        finally:
            self._embedding -= 1
        if self.fault_marker and any(self.fault_marker in t for t in request.inputs):
            raise EngineError("simulated engine fault while embedding")
        rows = np.stack(
            [
                np.random.default_rng(zlib.crc32(t.encode("utf-8"))).standard_normal(self.embedding_dim)
                for t in request.inputs
            ]
        ).astype(np.float32)
        return Embeddings(vectors=unit_rows(rows), prompt_tokens=request.prompt_tokens)

    async def _step_loop(self) -> None:
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            joining: list[_Sequence] = []
            while self._waiting and len(self._running) < self.max_concurrency:
                seq = self._waiting.popleft()
                self._running.append(seq)
                joining.append(seq)
            prefill = sum(s.request.prompt_tokens for s in joining)
            step_ms = (
                self.decode_ms_base + self.decode_ms_per_seq * len(self._running) + self.prefill_ms_per_token * prefill
            )
            await asyncio.sleep(step_ms / 1000.0)
            self.steps += 1
            for seq in list(self._running):
                if seq not in self._running:  # cancelled during the step
                    continue
                seq.produced += 1
                word = " " + seq.rng.choice(WORDS)
                if seq.produced >= seq.request.max_tokens:
                    self._running.remove(seq)
                    seq.out.put_nowait(Delta(text=word, tokens=1, finish_reason="length"))
                else:
                    seq.out.put_nowait(Delta(text=word, tokens=1))

    def _forget(self, seq: _Sequence) -> None:
        if seq in self._running:
            self._running.remove(seq)
        elif seq in self._waiting:
            self._waiting.remove(seq)

    async def generate(self, req: GenerationRequest) -> AsyncGenerator[Delta, None]:
        if self.embeddings:  # the registry never routes generation here (info.generates is False)
            raise EngineError(f"sim deployment for {self.alias} serves embeddings only")
        seed = req.seed if req.seed is not None else zlib.crc32(req.prompt.encode("utf-8"))
        seq = _Sequence(request=req, rng=random.Random(seed))
        if req.max_tokens <= 0:
            yield Delta(text="", tokens=0, finish_reason="length")
            return
        self.admitted += 1
        self.recent.append(req.request_id)
        self._waiting.append(seq)
        self._wake.set()
        faulty = bool(self.fault_marker) and self.fault_marker in req.prompt
        try:
            while True:
                delta = await seq.out.get()
                if faulty and seq.produced > self.fault_after_tokens:
                    raise EngineError(f"simulated engine fault after {self.fault_after_tokens} tokens")
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            self._forget(seq)  # closing the stream frees the slot at once
