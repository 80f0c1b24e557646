"""llama.cpp in-process through llama-cpp-python.

One `Llama` context per slot (`parallel` of them, default 2); each generation runs in a
worker thread so the event loop never blocks on decode. Deltas cross back to the loop with
call_soon_threadsafe. Closing the stream sets a cancel flag that the decode loop checks
before every token; the slot returns to the pool only when the thread has let go of it.
"""

from __future__ import annotations

import asyncio
import codecs
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

from laneway.engines.base import EngineError, EngineRequestError, run_warmup
from laneway.engines.chat_template import CHATML, render_chat
from laneway.engines.demo_model import BANNED_BYTE_TOKENS
from laneway.engines.slots import SlotPool
from laneway.engines.tool_calls import call_schema, offered, output_schema, parse_calls, with_tools
from laneway.types import (
    ChatTurn,
    Delta,
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


class LlamaCppEngine:
    """Config keys: model_path (required), parallel, n_ctx, n_threads, demo (ban invalid-UTF-8
    byte tokens), ban_tokens (list of ids), logit_bias ({id: bias})."""

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
        self._contexts: list[Any] = []
        self._free: SlotPool[Any] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._template = CHATML
        self._active = 0
        self.warmed_prompts = 0
        self._eog: Any = None
        self._n_vocab = 0

    async def start(self) -> None:
        if not self.model_path.is_file():
            raise EngineError(f"llama.cpp model file not found: {self.model_path}")
        from llama_cpp import Llama, llama_vocab_is_eog

        def load() -> list[Any]:
            return [
                Llama(
                    model_path=str(self.model_path),
                    n_ctx=self.n_ctx,
                    n_threads=self.n_threads,
                    n_gpu_layers=self.n_gpu_layers,
                    n_batch=min(512, self.n_ctx),
                    verbose=False,
                )
                for _ in range(self.parallel)
            ]

        try:
            self._contexts = await asyncio.to_thread(load)
        except Exception as exc:  # llama.cpp raises ValueError on a bad file
            raise EngineError(f"llama.cpp could not load {self.model_path}: {exc}") from exc
        first = self._contexts[0]
        self._template = str(first.metadata.get("tokenizer.chat_template") or CHATML)
        vocab = first._model.vocab
        self._eog = lambda tok: bool(llama_vocab_is_eog(vocab, tok))
        self._n_vocab = int(first.n_vocab())
        self._free = SlotPool(self._contexts)
        self._pool = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix=f"llamacpp-{self.alias}")

    async def close(self) -> None:
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
        return PromptMeasure(text=text, tokens=len(ids))

    async def health(self) -> bool:
        return bool(self._contexts) and self._free is not None

    async def warmup(self, prompts: Sequence[str]) -> None:
        self.warmed_prompts += await run_warmup(self, prompts)

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

    async def generate(self, req: GenerationRequest) -> AsyncGenerator[Delta, None]:
        if self._free is None or self._pool is None:
            raise EngineError(f"deployment for {self.alias} is not started")
        loop = asyncio.get_running_loop()
        # Checked before a slot is taken: a bad token id or schema is the client's error. A
        # schema's grammar is built off the loop (its first conversion costs milliseconds).
        plan = await asyncio.to_thread(self._plan, req) if req.tools or req.response_format else self._plan(req)
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
        left = req.n  # choices still decoding
        try:
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
        finally:
            cancel.set()
