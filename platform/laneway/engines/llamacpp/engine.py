"""LlamaCppEngine: loads a GGUF model in-process and serves it in one of three modes (the
package's modules say how each works):

- batched (the default): one context of `parallel` sequences decoded together by one thread
  (batched.py, batch_decoder.py), with warm-up system prompts kept computed for prefix reuse;
- one context per slot (`batching: false`), each decoding one request in a worker thread
  (per_slot.py);
- embeddings only (`embedding: true`; embedding.py).

Both generating modes keep each slot's cells when its request ends and start a request of the
same cache partition from them when its prompt begins with the same tokens (prefix_cache.py).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from laneway.engines.adapter import DeploymentFacts, EngineAdapter, PromptParts
from laneway.engines.base import EngineError, run_embedding_warmup, run_warmup, system_prompt_chat
from laneway.engines.chat_template import CHATML, render_chat
from laneway.engines.config import LlamaCppConfig
from laneway.engines.demo_model import BANNED_BYTE_TOKENS
from laneway.engines.llamacpp.batch_decoder import BatchDecoder
from laneway.engines.llamacpp.batched import BatchedGeneration
from laneway.engines.llamacpp.embedding import POOLING_TYPES, POOLING_UNSPECIFIED, Embedder, input_tokens
from laneway.engines.llamacpp.loading import load_contexts
from laneway.engines.llamacpp.lowlevel import BatchContext
from laneway.engines.llamacpp.per_slot import SlotDecoding
from laneway.engines.llamacpp.plan import DecodePlan, TokenBiases, decode_plan
from laneway.engines.tool_calls import with_tools
from laneway.types import CAPABILITIES as ALL_CAPABILITIES
from laneway.types import (
    EXTENSIONS,
    Delta,
    EmbeddingRequest,
    Embeddings,
    GenerationRequest,
    PromptMeasure,
)

# Prompts longer than this are templated and tokenized in a worker thread (llama.cpp's
# tokenizer releases the GIL): the loop time a long one takes is time every other request
# would wait for.
OFF_LOOP_PROMPT_CHARS = 8192
# What one context does beyond text: tools and JSON through grammars, logprobs from its
# logits, n choices decoded one after another in the request's slot.
# Of the sampling extensions, those llama.cpp's sampler has (core/capabilities.py refuses the rest by name).
SAMPLER_EXTENSIONS = frozenset({"top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens"})
CAPABILITIES = (frozenset(ALL_CAPABILITIES) - {"embeddings"} - frozenset(EXTENSIONS)) | SAMPLER_EXTENSIONS


class LlamaCppEngine(EngineAdapter[LlamaCppConfig]):
    """Config: LlamaCppConfig (engines/config.py)."""

    engine = "llamacpp"
    config_type = LlamaCppConfig
    default_gpu_type = "none"

    def __init__(self, alias: str, config: Mapping[str, Any] | LlamaCppConfig, **row: Unpack[DeploymentFacts]) -> None:
        super().__init__(alias, config, **row)
        c = self.config
        self.model_path = Path(c.model_path)
        self.parallel = max(1, c.parallel)
        self.n_ctx = c.n_ctx if c.n_ctx is not None else (self.max_model_len or 2048)
        self.embedding = c.embedding
        self.batching = c.batching and not self.embedding
        if c.n_threads is not None:
            self.n_threads = c.n_threads
        elif self.batching:  # one context decodes for every slot: all cores
            self.n_threads = os.cpu_count() or 1
        else:
            self.n_threads = max(1, (os.cpu_count() or 1) // self.parallel)
        self.n_gpu_layers = c.n_gpu_layers
        self.n_batch = max(16, c.n_batch)
        # A short prompt arriving while a long one prefills waits for the step in flight: about
        # this long at most (docs/engines/README.md says why).
        self.max_step_ms = c.max_step_ms
        self._biases = TokenBiases.of(c.logit_bias, [*c.ban_tokens, *(BANNED_BYTE_TOKENS if c.demo else ())])
        # One reserved sequence of the batch context per warm-up system prompt, for prefix reuse.
        self.system_prompts = list(c.warmup_system_prompts) if self.batching else []
        self._prefixes_warmed = 0
        self._pooling = POOLING_UNSPECIFIED if c.pooling is None else POOLING_TYPES[c.pooling]
        self.info = self.describe(
            context=self.n_ctx,
            slots=self.parallel,
            capabilities=CAPABILITIES,
            embeddings_only=self.embedding,
            continues=True,
        )
        self.n_embd = 0  # the vector length, known once loaded
        self._contexts: list[Any] = []  # Llama objects: the first tokenizes; per slot, each decodes
        self._template = CHATML
        self._n_vocab = 0
        self._eog_ids: np.ndarray = np.zeros(0, dtype=np.int64)  # end-of-generation tokens, once loaded
        self._batch_ctx: BatchContext | None = None
        self._decoder: BatchDecoder | None = None
        self._batched: BatchedGeneration | None = None
        self._slots: SlotDecoding | None = None
        self._embedder: Embedder | None = None
        self.warmed_prompts = 0

    async def start(self) -> None:
        if not self.model_path.is_file():
            raise EngineError(f"llama.cpp model file not found: {self.model_path}")
        import llama_cpp  # the kind's extra: checked before it is built (engines/kinds.py)

        contexts = 1 if self.batching else self.parallel
        try:
            self._contexts = await asyncio.to_thread(
                load_contexts,
                self.model_path,
                contexts,
                n_ctx=self.n_ctx,
                n_threads=self.n_threads,
                n_gpu_layers=self.n_gpu_layers,
                embedding=self.embedding,
                pooling=self._pooling,
            )
        except Exception as exc:  # llama.cpp raises ValueError on a bad file
            raise EngineError(f"llama.cpp could not load {self.model_path}: {exc}") from exc
        first = self._contexts[0]
        self.n_embd = int(first.n_embd())
        self._template = str(first.metadata.get("tokenizer.chat_template") or CHATML)
        vocab = llama_cpp.llama_model_get_vocab(first.model)

        def eog(tok: int) -> bool:
            return bool(llama_cpp.llama_vocab_is_eog(vocab, tok))

        self._n_vocab = int(first.n_vocab())
        self._eog_ids = np.array([t for t in range(self._n_vocab) if eog(t)], dtype=np.int64)
        name = f"llamacpp-{self.alias}"
        if self.embedding:
            self._embedder = Embedder(self._contexts, n_embd=self.n_embd, name=name)
        elif not self.batching:
            self._slots = SlotDecoding(self._contexts, n_vocab=self._n_vocab, eog=eog, name=name)
        else:
            sequences = self.parallel + len(self.system_prompts)
            try:
                self._batch_ctx = await asyncio.to_thread(
                    BatchContext,
                    first,
                    sequences=sequences,
                    n_ctx=self.n_ctx,
                    n_batch=self.n_batch,
                    n_threads=self.n_threads,
                )
            except Exception as exc:
                raise EngineError(f"llama.cpp could not make a context of {self.parallel} sequences: {exc}") from exc
            self._decoder = BatchDecoder(
                self._batch_ctx,
                n_batch=self.n_batch,
                eog=eog,
                name=f"llamacpp-batch-{self.alias}",
                max_step_s=self.max_step_ms / 1000,
            )
            self._batched = BatchedGeneration(self._decoder, self.parallel)

    async def close(self) -> None:
        if self._decoder is not None:
            await asyncio.to_thread(self._decoder.stop)
            self._decoder = None
        if self._batch_ctx is not None:
            self._batch_ctx.close()
            self._batch_ctx = None
        for mode in (self._slots, self._embedder):
            if mode is not None:
                mode.close()
        for ctx in self._contexts:
            ctx.close()
        self._contexts = []

    @property
    def active_slots(self) -> int:
        return sum(m.active for m in (self._batched, self._slots, self._embedder) if m is not None)

    async def count_prompt(self, parts: PromptParts) -> PromptMeasure:
        size = len(parts.prompt or "") + sum(len(m.content) for m in parts.messages or ())
        if size > OFF_LOOP_PROMPT_CHARS or parts.tools or parts.response_format:  # a long template's work: off the loop
            return await asyncio.to_thread(self.count_now, parts)
        return self.count_now(parts)

    def count_now(self, parts: PromptParts) -> PromptMeasure:
        """The prompt templated and tokenized by the model, on the calling thread."""
        # No native tool format here: tools, a schema and earlier calls become text turns.
        if parts.messages is not None:
            text = render_chat(with_tools(parts.messages, parts.tools, parts.response_format), self._template)
        else:
            text = parts.prompt or ""
        ids = self._tokenize(text)
        return PromptMeasure(text=text, tokens=len(ids), ids=tuple(ids))

    def _tokenize(self, text: str) -> list[int]:
        # special=True so the ChatML markers count as the single tokens the model sees.
        return list(self._contexts[0].tokenize(text.encode("utf-8"), add_bos=True, special=True))

    def _continued(self, text: str) -> list[int]:
        """The ids of an answer's text, to follow its prompt. Tokenized behind a newline whose
        own ids are then dropped: a SentencePiece vocabulary puts a space before the text it
        is given (" world" where the model wrote "world"), never after a newline. What the
        model wrote as text stays text (special=False). The ids are the tokenizer's reading of
        the text, which may split a word otherwise than the tokens sampled; greedy text
        continues the same where they agree (the tests check it on SmolLM2 and the demo model)."""
        tokenize = self._contexts[0].tokenize
        behind = list(tokenize(b"\n", add_bos=False, special=False))
        ids = list(tokenize(b"\n" + text.encode("utf-8"), add_bos=False, special=False))
        if ids[: len(behind)] == behind:
            return ids[len(behind) :]
        return list(tokenize(text.encode("utf-8"), add_bos=False, special=False))  # the newline merged with it

    async def health(self) -> bool:
        return bool(self._contexts) and any(m is not None for m in (self._batched, self._slots, self._embedder))

    async def warmup(self, prompts: Sequence[str]) -> None:
        if self.embedding:
            self.warmed_prompts += await run_embedding_warmup(self, prompts)
            return
        while self._batched is not None and self._prefixes_warmed < len(self.system_prompts):
            await self._warm_prefix(self.parallel + self._prefixes_warmed, self.system_prompts[self._prefixes_warmed])
            self._prefixes_warmed += 1
        self.warmed_prompts += await run_warmup(self, prompts)

    async def _warm_prefix(self, seq_id: int, system: str) -> None:
        assert self._batched is not None
        measured = await self.measure(messages=system_prompt_chat(system))
        if measured.tokens > self.n_ctx:
            raise EngineError(f"warm-up system prompt {seq_id - self.parallel} is longer than the context")
        req = GenerationRequest(
            request_id=f"prefix-{seq_id}",
            prompt=measured.text,
            prompt_tokens=measured.tokens,
            max_tokens=1,
            prompt_ids=measured.ids,
        )
        ids = list(measured.ids) if measured.ids is not None else self._tokenize(measured.text)
        await self._batched.warm_prefix(seq_id, req, self._plan(req), ids)

    @property
    def reuses_prefixes(self) -> bool:
        """Whether it keeps KV cells for later prompts (every generating mode)."""
        return not self.embedding

    @property
    def prefix_hits(self) -> int:
        """Requests that started from cached cells: a warm-up system prompt's, or an earlier
        request's of the same cache partition."""
        mode = self._decoder or self._slots
        return mode.prefix_hits if mode is not None else 0

    @property
    def prefix_tokens_reused(self) -> int:
        """Prompt tokens those requests did not compute."""
        mode = self._decoder or self._slots
        return mode.prefix_tokens_reused if mode is not None else 0

    @property
    def prompt_tokens_computed(self) -> int:
        """Prompt tokens requests started without cached cells for (reused / (reused + these):
        the hit rate)."""
        mode = self._decoder or self._slots
        return mode.prompt_tokens_computed if mode is not None else 0

    async def measure_inputs(self, inputs: Sequence[str]) -> list[int]:
        if sum(len(t) for t in inputs) > OFF_LOOP_PROMPT_CHARS:
            return await asyncio.to_thread(input_tokens, self._contexts[0], inputs)
        return input_tokens(self._contexts[0], inputs)

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        return await self._started_embedder().embed(request)

    def _started_embedder(self) -> Embedder:
        if not self.embedding:
            raise EngineError(f"deployment for {self.alias} is not in embedding mode")
        if self._embedder is None:
            raise EngineError(f"deployment for {self.alias} is not started")
        return self._embedder

    def _plan(self, req: GenerationRequest) -> DecodePlan:
        return decode_plan(req, self._biases, self._n_vocab, self._eog_ids)

    async def generate(self, req: GenerationRequest) -> AsyncGenerator[Delta, None]:
        if self.embedding:  # the registry never routes generation here (info.generates is False)
            raise EngineError(f"deployment for {self.alias} serves embeddings only")
        if self._batched is None and self._slots is None:
            raise EngineError(f"deployment for {self.alias} is not started")
        # Checked before a slot is taken: a bad token id or schema is the client's error. A
        # schema's grammar is built off the loop (its first conversion costs milliseconds).
        plan = await asyncio.to_thread(self._plan, req) if req.tools or req.response_format else self._plan(req)
        if req.prompt_ids is not None:
            prompt = list(req.prompt_ids)
        elif len(req.prompt) > OFF_LOOP_PROMPT_CHARS:
            prompt = await asyncio.to_thread(self._tokenize, req.prompt)
        else:
            prompt = self._tokenize(req.prompt)
        if req.continuation is not None and req.continuation.text:
            # An answer another replica began: this one decodes on from the prompt followed by
            # the answer so far (core/pipeline/continuation.py), as if it had generated it.
            prompt += self._continued(req.continuation.text)
        if self._batched is not None:
            stream = self._batched.generate(req, plan, prompt)
        else:
            assert self._slots is not None
            stream = self._slots.generate(req, plan, prompt)
        try:
            async for delta in stream:
                yield delta
        finally:  # closing this stream closes the mode's at once: its slot is let go
            await stream.aclose()
