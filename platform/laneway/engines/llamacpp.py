"""llama.cpp in-process through llama-cpp-python.

One `Llama` context per slot (`parallel` of them, default 2); each generation runs in a
worker thread so the event loop never blocks on decode. Deltas cross back to the loop with
call_soon_threadsafe. Closing the stream sets a cancel flag that the decode loop checks
before every token; the slot returns to the pool only when the thread has let go of it.

Embedding mode (config `embedding: true`): the contexts are made with embeddings on and a
pooling type (config `pooling`: mean, cls or last; by default the model's own, and mean for a
model that declares none, since OpenAI gives one vector per input). Such a deployment serves
embeddings only, as llama-server does with --embeddings: generating in an embedding context
computes an output for every prompt token and llama.cpp does not promise logits beside pooled
embeddings. Inputs are embedded one after another in a worker thread, which checks a cancel
flag between inputs; each vector is scaled to unit length, as OpenAI's are.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import json
import os
import random
import threading
from collections.abc import AsyncGenerator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from laneway.engines import extras
from laneway.engines.base import (
    EngineError,
    EngineRequestError,
    run_embedding_warmup,
    run_warmup,
    system_prompt_chat,
    unit_rows,
)
from laneway.engines.chat_template import CHATML, render_chat
from laneway.engines.demo_model import BANNED_BYTE_TOKENS
from laneway.engines.llamacpp_batch import BatchDecoder, BatchSequence
from laneway.engines.slots import SlotPool
from laneway.engines.tool_calls import call_schema, offered, output_schema, parse_calls, with_tools
from laneway.types import (
    ChatTurn,
    Delta,
    EmbeddingRequest,
    Embeddings,
    EngineInfo,
    FinishReason,
    GenerationRequest,
    PromptMeasure,
    TokenLogprob,
    TopLogprob,
)

_DONE = object()
# Prompts longer than this are templated and tokenized in a worker thread (llama.cpp's
# tokenizer releases the GIL): measured 5 ms per 16 KB with the demo model, loop time that
# every other request would wait for.
OFF_LOOP_PROMPT_CHARS = 8192
# What one context does beyond text: tools and JSON through grammars, logprobs from its
# logits, n choices decoded one after another in the request's slot.
CAPABILITIES = frozenset({"tools", "json_object", "json_schema", "logprobs", "n", "penalties", "logit_bias"})


@dataclass(frozen=True, slots=True)
class _Plan:
    bias_ids: np.ndarray
    bias_vals: np.ndarray
    grammar: Any  # a LlamaGrammar, or None
    mode: str  # "text" | "tools" (a call is required) | "auto" (the model may call a tool)
    tools: list[dict[str, Any]]


# llama-cpp-python's converter lets a JSON string hold raw control characters (a newline),
# which no JSON parser accepts; llama.cpp's own converter excludes them, as here.
_LAX_CHAR = r'char ::= [^"\\] |'
_JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'


@lru_cache(maxsize=64)
def _grammar(schema_json: str) -> Any:
    """A schema's grammar, built once: converting a JSON schema to GBNF costs milliseconds."""
    from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

    try:
        gbnf = json_schema_to_gbnf(schema_json).replace(_LAX_CHAR, _JSON_CHAR)
        return LlamaGrammar.from_string(gbnf, verbose=False)
    except Exception as exc:  # the converter raises plain exceptions on schemas it cannot express
        raise EngineRequestError(f"the JSON schema cannot be used to constrain the output: {exc}") from exc


# Batched: a step's prompt tokens are sized to take about this long (config max_step_ms).
DEFAULT_MAX_STEP_MS = 100.0
# Config `pooling` -> llama.cpp's LLAMA_POOLING_TYPE_* (none and rank give no one-vector-per-input).
POOLING_TYPES = {"mean": 1, "cls": 2, "last": 3}
_POOLING_NONE, _POOLING_RANK, _POOLING_UNSPECIFIED = 0, 4, -1


class _EmbeddingCancelled(Exception):
    """The caller went away: the worker thread stopped between inputs."""


class LlamaCppEngine:
    """Config keys: model_path (required), parallel, n_ctx, n_threads, demo (ban invalid-UTF-8
    byte tokens), ban_tokens (list of ids), logit_bias ({id: bias}), embedding (serve
    embeddings only), pooling (mean | cls | last; with embedding), batching (one context of
    `parallel` sequences decoded together: engines/llamacpp_batch.py; otherwise one context
    per slot, each decoding one sequence), n_batch (tokens per batched step), max_step_ms
    (batched: the time a step's prompt tokens are sized to, from the measured cost of a token;
    default 100, 0: every step takes up to n_batch),
    warmup_system_prompts (batched: each is computed once at warm-up and kept in a reserved
    sequence, and a prompt starting with the same tokens reuses its cells)."""

    def __init__(
        self,
        alias: str,
        config: dict[str, Any],
        *,
        quantization: str = "unknown",
        gpu_type: str = "none",
        max_model_len: int | None = None,
    ) -> None:
        self.alias = alias
        self.model_path = Path(str(config["model_path"]))
        self.parallel = max(1, int(config.get("parallel", 2)))
        self.n_ctx = int(config.get("n_ctx", max_model_len or 2048))
        self.n_threads = int(config.get("n_threads", max(1, (os.cpu_count() or 1) // self.parallel)))
        # Layers offloaded to the GPU (-1: all) in a CUDA/Metal build of llama-cpp-python; 0 = CPU.
        self.n_gpu_layers = int(config.get("n_gpu_layers", 0))
        bias: dict[int, float] = {int(k): float(v) for k, v in dict(config.get("logit_bias", {})).items()}
        banned = list(config.get("ban_tokens", []))
        if config.get("demo", False):
            banned += BANNED_BYTE_TOKENS
        for tok in banned:
            bias[int(tok)] = -float("inf")
        self._bias_ids = np.array(sorted(bias), dtype=np.int64)
        self._bias_vals = np.array([bias[i] for i in sorted(bias)], dtype=np.float32)
        self.info = EngineInfo(
            engine="llamacpp",
            model=alias,
            quantization=quantization,
            gpu_type=gpu_type,
            max_model_len=self.n_ctx,
            max_concurrency=self.parallel,
            capabilities=CAPABILITIES,
        )
        self.embedding = bool(config.get("embedding", False))
        self.batching = bool(config.get("batching", True)) and not self.embedding
        self.n_batch = max(16, int(config.get("n_batch", 512)))
        # A short prompt arriving while a long one prefills waits for the step in flight: about
        # this long at most (engines/README.md says why 100 ms).
        self.max_step_ms = float(config.get("max_step_ms", DEFAULT_MAX_STEP_MS))
        if self.batching and "n_threads" not in config:  # one context decodes for every slot: all cores
            self.n_threads = os.cpu_count() or 1
        self._decoder: BatchDecoder | None = None
        self._batch_ctx: Any = None
        # One reserved sequence of the batch context per warm-up system prompt, for prefix reuse.
        self.system_prompts = [str(x) for x in config.get("warmup_system_prompts", ())] if self.batching else []
        self._prefixes_warmed = 0
        pooling = config.get("pooling")
        if pooling is not None and str(pooling) not in POOLING_TYPES:
            raise EngineError(f"llama.cpp config: pooling must be one of {', '.join(POOLING_TYPES)}, not {pooling!r}")
        self._pooling = _POOLING_UNSPECIFIED if pooling is None else POOLING_TYPES[str(pooling)]
        if self.embedding:
            self.info = dataclasses.replace(self.info, capabilities=frozenset({"embeddings"}), generates=False)
        self.n_embd = 0  # the vector length, known once loaded
        self._contexts: list[Any] = []
        self._free: SlotPool[Any] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._template = CHATML
        self._active = 0
        self.warmed_prompts = 0
        self._eog: Any = None
        self._n_vocab = 0

    async def start(self) -> None:
        extras.require(extras.LLAMACPP)  # an optional extra: say which, not ModuleNotFoundError
        if not self.model_path.is_file():
            raise EngineError(f"llama.cpp model file not found: {self.model_path}")
        from llama_cpp import Llama, llama_vocab_is_eog

        # An embedding is pooled over one batch: a whole input (up to the context) in one ubatch.
        n_batch = self.n_ctx if self.embedding else min(512, self.n_ctx)
        n_ubatch = self.n_ctx if self.embedding else 512

        def context(pooling: int) -> Any:
            return Llama(
                model_path=str(self.model_path),
                n_ctx=self.n_ctx,
                n_threads=self.n_threads,
                n_gpu_layers=self.n_gpu_layers,
                n_batch=n_batch,
                n_ubatch=n_ubatch,
                verbose=False,
                embedding=self.embedding,
                pooling_type=pooling,
            )

        def load() -> list[Any]:
            pooling = self._pooling
            contexts = [context(pooling)]
            if self.embedding:
                declared = contexts[0].pooling_type()
                if declared == _POOLING_NONE and pooling == _POOLING_UNSPECIFIED:  # no pooling of its own: mean
                    contexts[0].close()
                    pooling = POOLING_TYPES["mean"]
                    contexts = [context(pooling)]
                elif declared == _POOLING_RANK:
                    contexts[0].close()
                    raise ValueError("the model pools for ranking (a reranker); set `pooling` to embed with it")
            if self.batching:  # the Llama is for tokenizing and metadata; decoding is the batch context's
                return contexts
            return contexts + [context(pooling) for _ in range(self.parallel - 1)]

        try:
            self._contexts = await asyncio.to_thread(load)
        except Exception as exc:  # llama.cpp raises ValueError on a bad file
            raise EngineError(f"llama.cpp could not load {self.model_path}: {exc}") from exc
        first = self._contexts[0]
        self.n_embd = int(first.n_embd())
        self._template = str(first.metadata.get("tokenizer.chat_template") or CHATML)
        vocab = first._model.vocab
        self._eog = lambda tok: bool(llama_vocab_is_eog(vocab, tok))
        self._n_vocab = int(first.n_vocab())
        if self.batching:
            try:
                self._batch_ctx = await asyncio.to_thread(self._batch_context, first)
            except Exception as exc:
                raise EngineError(f"llama.cpp could not make a context of {self.parallel} sequences: {exc}") from exc
            self._decoder = BatchDecoder(first._model, self._batch_ctx, n_batch=self.n_batch, n_vocab=self._n_vocab,
                                         eog=self._eog, name=f"llamacpp-batch-{self.alias}",
                                         max_step_s=self.max_step_ms / 1000)  # fmt: skip
            self._free = SlotPool(list(range(self.parallel)))  # sequence ids
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"llamacpp-{self.alias}")
            return
        self._free = SlotPool(self._contexts)
        self._pool = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix=f"llamacpp-{self.alias}")

    def _batch_context(self, llama: Any) -> Any:
        """One context on the loaded model with a sequence per slot and one per warm-up system
        prompt (after the slots' ids), each its own stream of `n_ctx` cells."""
        import llama_cpp
        from llama_cpp._internals import LlamaContext

        sequences = self.parallel + len(self.system_prompts)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = self.n_ctx * sequences
        params.n_seq_max = sequences
        params.n_batch = params.n_ubatch = self.n_batch
        params.n_threads = params.n_threads_batch = self.n_threads
        return LlamaContext(model=llama._model, params=params, verbose=False)

    async def close(self) -> None:
        if self._decoder is not None:
            await asyncio.to_thread(self._decoder.stop)
            self._decoder = None
        if self._batch_ctx is not None:
            self._batch_ctx.close()
            self._batch_ctx = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        for ctx in self._contexts:
            ctx.close()
        self._contexts = []

    @property
    def active_slots(self) -> int:
        return self._active

    async def measure(
        self,
        *,
        prompt: str | None = None,
        messages: Sequence[ChatTurn] | None = None,
        tools: Sequence[dict[str, Any]] = (),
        response_format: dict[str, Any] | None = None,
    ) -> PromptMeasure:
        size = len(prompt or "") + sum(len(m.content) for m in messages or ())
        if size > OFF_LOOP_PROMPT_CHARS or tools or response_format:  # a long template's work: off the loop
            return await asyncio.to_thread(self._measure, prompt, messages, tools, response_format)
        return self._measure(prompt, messages)

    def _measure(
        self,
        prompt: str | None,
        messages: Sequence[ChatTurn] | None,
        tools: Sequence[dict[str, Any]] = (),
        response_format: dict[str, Any] | None = None,
    ) -> PromptMeasure:
        # No native tool format here: tools, a schema and earlier calls become text turns.
        if messages is not None:
            text = render_chat(with_tools(messages, tools, response_format), self._template)
        else:
            text = prompt or ""
        # special=True so the ChatML markers count as the single tokens the model sees.
        ids = self._contexts[0].tokenize(text.encode("utf-8"), add_bos=True, special=True)
        return PromptMeasure(text=text, tokens=len(ids), ids=tuple(ids))

    async def health(self) -> bool:
        return bool(self._contexts) and self._free is not None

    async def warmup(self, prompts: Sequence[str]) -> None:
        if self.embedding:
            self.warmed_prompts += await run_embedding_warmup(self, prompts)
            return
        while self._decoder is not None and self._prefixes_warmed < len(self.system_prompts):
            await self._warm_prefix(self.parallel + self._prefixes_warmed, self.system_prompts[self._prefixes_warmed])
            self._prefixes_warmed += 1
        self.warmed_prompts += await run_warmup(self, prompts)

    async def _warm_prefix(self, seq_id: int, system: str) -> None:
        """Compute a system prompt's chat, as warm-up renders it, into the reserved sequence
        `seq_id`, where its cells stay for later prompts that start with the same tokens."""
        assert self._decoder is not None
        loop = asyncio.get_running_loop()
        measured = await self.measure(messages=system_prompt_chat(system))
        if measured.tokens > self.n_ctx:
            raise EngineError(f"warm-up system prompt {seq_id - self.parallel} is longer than the context")
        req = GenerationRequest(request_id=f"prefix-{seq_id}", prompt=measured.text, prompt_tokens=measured.tokens,
                                max_tokens=1, prompt_ids=measured.ids)  # fmt: skip
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

        ids = list(measured.ids) if measured.ids is not None else self._tokenize(measured.text)
        seq = BatchSequence(seq_id, req, self._plan(req), ids, emit=emit, on_exit=on_exit, reserve=True)
        self._decoder.submit(seq)
        try:
            await done
        except asyncio.CancelledError:
            seq.cancel.set()
            self._decoder.wake()
            raise

    @property
    def prefix_hits(self) -> int:
        """Requests that started from a warmed system prompt's cells."""
        return self._decoder.prefix_hits if self._decoder is not None else 0

    @property
    def prefix_tokens_reused(self) -> int:
        """Prompt tokens those requests did not compute."""
        return self._decoder.prefix_tokens_reused if self._decoder is not None else 0

    # ---- embeddings (config `embedding: true`) ----
    async def measure_inputs(self, inputs: Sequence[str]) -> list[int]:
        if sum(len(t) for t in inputs) > OFF_LOOP_PROMPT_CHARS:
            return await asyncio.to_thread(self._measure_inputs, inputs)
        return self._measure_inputs(inputs)

    def _measure_inputs(self, inputs: Sequence[str]) -> list[int]:
        # As Llama.embed() tokenizes: BOS, and special-token text taken as plain text.
        tokenize = self._contexts[0].tokenize
        return [len(tokenize(t.encode("utf-8"), add_bos=True, special=False)) for t in inputs]

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
        if not self.embedding:
            raise EngineError(f"deployment for {self.alias} is not in embedding mode")
        if self._free is None or self._pool is None:
            raise EngineError(f"deployment for {self.alias} is not started")
        loop = asyncio.get_running_loop()
        ctx = await self._free.acquire()
        self._active += 1
        cancel = threading.Event()
        released = False

        def release(done: asyncio.Future[Any] | None = None) -> None:
            nonlocal released
            if done is not None and not done.cancelled():
                done.exception()  # retrieved: a caller that left is not told, and nothing is logged
            if not released:
                released = True
                self._active -= 1
                assert self._free is not None
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

    def _plan(self, req: GenerationRequest) -> _Plan:
        """What one request's decoding needs beyond the defaults: its biases, its grammar (a
        required tool call or a JSON answer) and whether its answer is held back to be read
        as tool calls."""
        bias_ids, bias_vals = self._bias_ids, self._bias_vals
        if req.logit_bias:
            merged = dict(zip(bias_ids.tolist(), bias_vals.tolist(), strict=True))
            for tok, value in req.logit_bias.items():
                if not 0 <= tok < self._n_vocab:
                    raise EngineRequestError(
                        f"logit_bias: token id {tok} is not in the vocabulary (0-{self._n_vocab - 1})"
                    )
                if merged.get(tok) != -float("inf"):  # a banned token stays banned
                    merged[tok] = float(value)
            bias_ids = np.array(sorted(merged), dtype=np.int64)
            bias_vals = np.array([merged[i] for i in sorted(merged)], dtype=np.float32)
        tools = offered(req.tools, req.tool_choice)
        schema: dict[str, Any] | None = None
        mode = "text"
        if tools and req.tool_choice not in (None, "auto"):  # "required" or a named function
            schema, mode = call_schema(tools, req.parallel_tool_calls), "tools"
        elif tools:
            mode = "auto"
        else:
            schema = output_schema(req.response_format)
        # Key order is kept: the grammar writes the keys in it (a call's name before its arguments).
        grammar = _grammar(json.dumps(schema)) if schema is not None else None
        return _Plan(bias_ids, bias_vals, grammar, mode, tools)

    def _decode_loop(self, ctx: Any, req: GenerationRequest, plan: _Plan, cancel: threading.Event, emit: Any) -> None:
        """Runs in a worker thread: each of the request's n choices in turn, in this slot.
        Emits Delta objects, then _DONE (or the exception)."""
        try:
            ids = ctx.tokenize(req.prompt.encode("utf-8"), add_bos=True, special=True)
            for index in range(req.n):
                if cancel.is_set():
                    break
                seed = req.seed + index if req.seed is not None else random.getrandbits(32)
                ctx.set_seed(seed & 0xFFFFFFFF)
                self._one_choice(ctx, ids, req, plan, index, cancel, emit)
        except BaseException as exc:  # surfaced on the loop as EngineError
            emit(exc)
        finally:
            emit(_DONE)

    def _one_choice(
        self, ctx: Any, ids: list[int], req: GenerationRequest, plan: _Plan, index: int, cancel: threading.Event,
        emit: Any,
    ) -> None:  # fmt: skip
        bias_ids, bias_vals = plan.bias_ids, plan.bias_vals

        def apply_bias(_: Any, scores: np.ndarray) -> np.ndarray:
            if len(bias_ids):
                scores[bias_ids] += bias_vals
            return scores

        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # Tool modes hold the answer back: it is read as tool calls at the end ("auto": only
        # once it starts like JSON; whitespace before the first character waits to decide).
        holding = plan.mode == "tools"
        deciding = plan.mode == "auto"
        held: list[str] = []
        stops, window = req.stop, max((len(x) for x in req.stop), default=0)
        tail = ""
        produced = 0
        finish: FinishReason = "length"
        for tok in ctx.generate(
            ids,
            temp=max(req.temperature, 0.0),
            top_p=req.top_p,
            top_k=0,
            min_p=0.0,
            reset=True,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            logits_processor=[apply_bias],
            grammar=plan.grammar,
        ):
            if cancel.is_set():
                finish = "cancelled"
                break
            if self._eog(tok):
                finish = "stop"
                break
            logprobs = (self._logprob(ctx, tok, req.logprobs, plan),) if req.logprobs is not None else ()
            produced += 1
            text = decoder.decode(ctx.detokenize([tok]))
            if deciding and text.strip():
                deciding, holding = False, text.lstrip().startswith(("{", "["))
                if not holding:  # plain text after all: what waited goes out with it
                    text, held = "".join(held) + text, []
            if holding or deciding:
                held.append(text)
            elif produced >= req.max_tokens:
                end = text + decoder.decode(b"", final=True)
                emit(Delta(text=end, tokens=1, finish_reason="length", index=index, logprobs=logprobs))
                return
            else:
                emit(Delta(text=text, tokens=1, index=index, logprobs=logprobs))
                if stops:  # this choice ends at a stop (the gateway cuts the text itself)
                    tail = (tail + text)[-(window + len(text)) :]
                    if any(x in tail for x in stops):
                        finish = "stop"
                        break
            if produced >= req.max_tokens:
                break
        rest = decoder.decode(b"", final=True)
        if held or holding:
            answer = "".join(held) + rest
            calls = parse_calls(answer, plan.tools) if finish == "stop" else None
            if calls:
                emit(Delta(text="", tokens=len(held), finish_reason="tool_calls", index=index, tool_calls=calls))
            else:  # not calls after all (or cut short): the text as it came
                emit(Delta(text=answer, tokens=len(held), finish_reason=finish, index=index))
            return
        emit(Delta(text=rest, tokens=0, finish_reason=finish, index=index))

    def _logprob(self, ctx: Any, tok: int, top: int, plan: _Plan) -> TokenLogprob:
        """The chosen token's log probability under the model's distribution with the logit
        biases applied (banned tokens have none), before temperature and penalties, with the
        `top` likeliest alternatives."""
        from llama_cpp import llama_get_logits_ith

        logits = np.ctypeslib.as_array(llama_get_logits_ith(ctx.ctx, -1), shape=(self._n_vocab,))
        if len(plan.bias_ids):
            logits = logits.copy()
            logits[plan.bias_ids] += plan.bias_vals
        peak = float(logits.max())
        log_norm = peak + float(np.log(np.exp(logits - peak).sum()))
        alternatives: tuple[TopLogprob, ...] = ()
        if top:
            best = np.argpartition(-logits, top)[:top]
            best = best[np.argsort(-logits[best])]
            alternatives = tuple(self._top(ctx, int(i), float(logits[i]) - log_norm) for i in best)
        raw = ctx.detokenize([tok])
        return TokenLogprob(raw.decode("utf-8", "replace"), float(logits[tok]) - log_norm, tuple(raw), alternatives)

    @staticmethod
    def _top(ctx: Any, tok: int, logprob: float) -> TopLogprob:
        raw = ctx.detokenize([tok])
        return TopLogprob(raw.decode("utf-8", "replace"), logprob, tuple(raw))

    async def _generate_batched(self, req: GenerationRequest, plan: _Plan) -> AsyncGenerator[Delta, None]:
        """A sequence of the batch context: its id is the slot, given back when the decoder
        thread has cleared its cells (however the stream ends)."""
        assert self._free is not None and self._decoder is not None
        loop = asyncio.get_running_loop()
        if req.prompt_ids is not None:
            prompt = list(req.prompt_ids)
        elif len(req.prompt) > OFF_LOOP_PROMPT_CHARS:
            prompt = await asyncio.to_thread(self._tokenize, req.prompt)
        else:
            prompt = self._tokenize(req.prompt)
        seq_id = await self._free.acquire()
        self._active += 1
        out: asyncio.Queue[Any] = asyncio.Queue()

        def exited() -> None:  # on the loop
            self._active -= 1
            assert self._free is not None
            self._free.release(seq_id)
            out.put_nowait(_DONE)

        def emit(item: Any) -> None:  # from the decoder thread
            loop.call_soon_threadsafe(out.put_nowait, item)

        def on_exit() -> None:  # from the decoder thread
            loop.call_soon_threadsafe(exited)

        seq = BatchSequence(seq_id, req, plan, prompt, emit=emit, on_exit=on_exit)
        try:
            self._decoder.submit(seq)
        except BaseException:
            exited()
            raise
        try:
            async for delta in _deltas(out, req.n):
                yield delta
        finally:
            seq.cancel.set()
            self._decoder.wake()

    def _tokenize(self, text: str) -> list[int]:
        return list(self._contexts[0].tokenize(text.encode("utf-8"), add_bos=True, special=True))

    async def generate(self, req: GenerationRequest) -> AsyncGenerator[Delta, None]:
        if self.embedding:  # the registry never routes generation here (info.generates is False)
            raise EngineError(f"deployment for {self.alias} serves embeddings only")
        if self._free is None or self._pool is None:
            raise EngineError(f"deployment for {self.alias} is not started")
        loop = asyncio.get_running_loop()
        # Checked before a slot is taken: a bad token id or schema is the client's error. A
        # schema's grammar is built off the loop (its first conversion costs milliseconds).
        plan = await asyncio.to_thread(self._plan, req) if req.tools or req.response_format else self._plan(req)
        if self._decoder is not None:
            async for delta in self._generate_batched(req, plan):
                yield delta
            return
        ctx = await self._free.acquire()
        self._active += 1
        cancel = threading.Event()
        out: asyncio.Queue[Any] = asyncio.Queue()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._active -= 1
                assert self._free is not None
                self._free.release(ctx)

        def emit(item: Any) -> None:
            loop.call_soon_threadsafe(out.put_nowait, item)

        try:
            future = loop.run_in_executor(self._pool, self._decode_loop, ctx, req, plan, cancel, emit)
        except BaseException:
            release()
            raise
        # The slot is free once the decode thread has returned, whoever stops first.
        future.add_done_callback(lambda _f: release())
        try:
            async for delta in _deltas(out, req.n):
                yield delta
        finally:
            cancel.set()


async def _deltas(out: asyncio.Queue[Any], n: int) -> AsyncGenerator[Delta, None]:
    """What a decode thread sends, until each of the n choices has finished (or the thread is
    done); an exception from it is the engine's failure."""
    left = n
    while True:
        item = await out.get()
        if item is _DONE:
            return
        if isinstance(item, BaseException):
            raise EngineError(f"llama.cpp generation failed: {item}") from item
        yield item
        if item.finish_reason is not None:
            left -= 1
            if left == 0:
                return
