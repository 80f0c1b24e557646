"""vLLM through its OpenAI-compatible HTTP server (engines/http1.py: pooled keep-alive connections).

- Chat requests go to /v1/chat/completions with the messages, so vLLM applies the model's
  own chat template; completions go to /v1/completions. laneway's stop sequences, seed,
  sampling and priority (vLLM's `--scheduling-policy priority`) are passed through; the
  request id travels as X-Request-Id, and with tracing on the engine span's W3C
  `traceparent` (and `tracestate`): vLLM run with --otlp-traces-endpoint puts its spans in
  the request's trace.
- A streaming client's request streams from vLLM too; a non-streaming one is one plain
  request and one JSON answer (no per-token parsing for an answer nobody watches arrive).
- Closing the stream closes the HTTP response: vLLM aborts the request when its client
  goes away, so the engine slot is freed.
- Prompt tokens, without a round trip on the hot path (config "tokenize"): "auto" (the
  default) estimates 4 characters a token and asks vLLM's /tokenize only for a prompt whose
  estimate comes within a quarter of the context, where the exact count decides; "always"
  asks every time; "never" only estimates. Accounting uses the count vLLM reports in the
  answer's usage, so an estimate never reaches a bill or a rate limit's refund.
- Embeddings (config "embeddings": true, for vLLM serving a pooling model, `--task embed` /
  `--runner pooling`): /v1/embeddings with the texts, float vectors back, scaled to unit
  length. Such a deployment serves embeddings only (a pooling model does not generate).
- A background poller reads /metrics (vllm:num_requests_waiting, KV-cache usage): a replica
  over `max_waiting` or `max_kv_cache_usage` reports itself overloaded, and the registry
  sends new requests to its siblings while it is.

Config: base_url (required; http or https), ca_file (a private CA for https), model (the
served model name; default: the alias), api_key,
tokenize ("auto" | "always" | "never", or a bool), max_concurrency, max_waiting,
max_kv_cache_usage, metrics_poll_s, timeout_s, extra_body (dict merged into every request),
embeddings.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import ssl
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import msgspec
import numpy as np

from laneway.engines.base import EngineError, EngineRequestError, run_embedding_warmup, run_warmup, unit_rows
from laneway.engines.http1 import Http1Pool, Http1Response, UpstreamError
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
    ToolCall,
    TopLogprob,
)

log = logging.getLogger("laneway.engines.vllm")

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "cancelled",
    "tool_calls": "tool_calls",
}
# vLLM's OpenAI server does these itself (guided decoding for JSON, n sequences, logprobs);
# tool calls also need it started with --enable-auto-tool-choice and a --tool-call-parser,
# so they are declared by config ("tool_calling": true).
CAPABILITIES = frozenset({"json_object", "json_schema", "logprobs", "n", "penalties", "logit_bias"})


# The parts of vLLM's answers the adapter reads (msgspec ignores the rest).
class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    index: int = 0
    id: str | None = None
    function: _Function | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Top(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None = None


class _TokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[_Top] = []


class _Logprobs(msgspec.Struct):
    content: list[_TokenLogprob] | None = None  # chat
    tokens: list[str] | None = None  # completions: parallel lists
    token_logprobs: list[float | None] | None = None
    top_logprobs: list[dict[str, float] | None] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    text: str | None = None
    delta: _Message | None = None
    message: _Message | None = None
    finish_reason: str | None = None
    logprobs: _Logprobs | None = None

    @property
    def said(self) -> _Message | None:
        return self.delta or self.message

    def content(self) -> str:
        if self.text is not None:
            return self.text
        said = self.said
        return (said.content or "") if said is not None else ""

    def calls(self) -> tuple[ToolCall, ...]:
        said = self.said
        return tuple(_tool_call(c) for c in said.tool_calls) if said is not None and said.tool_calls else ()

    def token_logprobs(self) -> tuple[TokenLogprob, ...]:
        lp = self.logprobs
        if lp is None:
            return ()
        if lp.content is not None:  # chat
            return tuple(
                TokenLogprob(t.token, t.logprob, _bytes(t.bytes), tuple(_top(a) for a in t.top_logprobs))
                for t in lp.content
            )
        tops = lp.top_logprobs or []  # completions
        out = []
        for i, (tok, value) in enumerate(zip(lp.tokens or [], lp.token_logprobs or [], strict=False)):
            top = (tops[i] if i < len(tops) else None) or {}
            alternatives = tuple(TopLogprob(k, v) for k, v in top.items())
            out.append(TokenLogprob(tok, value if value is not None else 0.0, top=alternatives))
        return tuple(out)


def _bytes(raw: list[int] | None) -> tuple[int, ...] | None:
    return tuple(raw) if raw is not None else None


def _top(a: _Top) -> TopLogprob:
    return TopLogprob(a.token, a.logprob, _bytes(a.bytes))


def _tool_call(c: _ToolCall) -> ToolCall:
    fn = c.function or _Function()
    return ToolCall(id=c.id or "", name=fn.name or "", arguments=fn.arguments or "", index=c.index)


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: Any = None


class _Embedding(msgspec.Struct):
    index: int
    embedding: list[float]


class _EmbeddingList(msgspec.Struct):
    data: list[_Embedding] = []
    usage: _Usage | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_decode_embeddings = msgspec.json.Decoder(_EmbeddingList).decode
_encode = msgspec.json.Encoder().encode


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum each metric over its label sets: {name: value} (enough for vLLM's gauges)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def _tokenize_mode(value: Any) -> str:
    if value is True:
        return "always"
    if value is False:
        return "never"
    mode = str(value)
    if mode not in ("auto", "always", "never"):
        raise EngineError(f"vLLM config: tokenize must be auto, always or never, not {value!r}")
    return mode


class VLLMEngine:
    def __init__(
        self,
        alias: str,
        config: dict[str, Any],
        *,
        quantization: str = "unknown",
        gpu_type: str = "unknown",
        max_model_len: int | None = None,
    ) -> None:
        self.alias = alias
        self.base_url = str(config["base_url"]).rstrip("/")
        self.model = str(config.get("model", alias))
        self.tokenize = _tokenize_mode(config.get("tokenize", "auto"))
        self.max_waiting = float(config.get("max_waiting", 32))
        self.max_kv_usage = float(config.get("max_kv_cache_usage", 0.98))
        self.metrics_poll_s = float(config.get("metrics_poll_s", 1.0))
        self.timeout_s = float(config.get("timeout_s", 600))
        self.extra_body: dict[str, Any] = dict(config.get("extra_body", {}))
        self.api_key = config.get("api_key")
        self.ca_file = config.get("ca_file")  # an https base_url signed by a private CA
        capabilities = CAPABILITIES | ({"tools"} if config.get("tool_calling") else set())
        self.info = EngineInfo(
            engine="vllm",
            model=alias,
            quantization=quantization,
            gpu_type=gpu_type,
            max_model_len=int(max_model_len or config.get("max_model_len", 4096)),
            max_concurrency=int(config.get("max_concurrency", 64)),
            capabilities=frozenset(capabilities),
        )
        self.embeddings = bool(config.get("embeddings", False))
        if self.embeddings:
            self.info = dataclasses.replace(self.info, capabilities=frozenset({"embeddings"}), generates=False)
        self._session: Http1Pool | None = None
        self._poller: asyncio.Task[None] | None = None
        self._active = 0
        self.tokenize_calls = 0  # /tokenize round trips (tests, and a hot-path check)
        self.waiting = 0.0  # vllm:num_requests_waiting at the last poll
        self.kv_cache_usage = 0.0

    async def start(self) -> None:
        headers = [("Authorization", f"Bearer {self.api_key}")] if self.api_key else []
        try:
            tls = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
            self._session = Http1Pool(self.base_url, limit=self.info.max_concurrency + 8, connect_timeout_s=5.0,
                                      read_timeout_s=self.timeout_s, headers=headers, tls=tls)  # fmt: skip
        except (ValueError, OSError) as exc:
            raise EngineError(f"vLLM config: {exc}") from exc
        if not await self.health():
            await self._session.close()
            raise EngineError(f"vLLM at {self.base_url} is not healthy")
        served = await self._served_max_model_len()
        if served is not None and served < self.info.max_model_len:
            # The server's own limit wins: beyond it vLLM would answer 400, not laneway's 413.
            self.info = dataclasses.replace(self.info, max_model_len=served)
        if self.metrics_poll_s > 0:
            self._poller = asyncio.create_task(self._poll_metrics(), name=f"vllm-metrics-{self.alias}")

    async def _served_max_model_len(self) -> int | None:
        """max_model_len of the served model, as vLLM lists it in /v1/models (None if absent)."""
        try:
            _, answer = await self._call("GET", "/v1/models", timeout_s=5.0)
            cards = msgspec.json.decode(answer).get("data", [])
        except (UpstreamError, TimeoutError, msgspec.DecodeError, AttributeError):
            return None
        for card in cards:
            if card.get("id") == self.model and isinstance(card.get("max_model_len"), int):
                return int(card["max_model_len"])
        return None

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._session is not None:
            await self._session.close()

    @property
    def active_slots(self) -> int:
        return self._active

    @property
    def overloaded(self) -> bool:
        return self.waiting > self.max_waiting or self.kv_cache_usage > self.max_kv_usage

    def _http(self) -> Http1Pool:
        if self._session is None:
            raise EngineError(f"deployment for {self.alias} is not started")
        return self._session

    async def _call(self, method: str, path: str, body: bytes = b"", *, timeout_s: float,
                    headers: Sequence[tuple[str, str]] = ()) -> tuple[int, bytes]:  # fmt: skip
        """A request off the hot path, whole: (status, body) within `timeout_s`."""
        async with asyncio.timeout(timeout_s):
            async with await self._http().request(method, path, body, headers) as r:
                return r.status, await r.read()

    async def health(self) -> bool:
        try:
            status, _ = await self._call("GET", "/health", timeout_s=5.0)
        except (UpstreamError, TimeoutError):
            return False
        return status == 200

    async def _poll_metrics(self) -> None:
        while True:
            try:
                _, text = await self._call("GET", "/metrics", timeout_s=5.0)
                values = parse_prometheus(text.decode("utf-8", "replace"))
                self.waiting = values.get("vllm:num_requests_waiting", 0.0)
                self.kv_cache_usage = values.get(
                    "vllm:kv_cache_usage_perc", values.get("vllm:gpu_cache_usage_perc", 0.0)
                )
            except (UpstreamError, TimeoutError) as exc:
                log.warning("reading %s/metrics failed: %s", self.base_url, exc)
            await asyncio.sleep(self.metrics_poll_s)

    async def measure(
        self,
        *,
        prompt: str | None = None,
        messages: Sequence[ChatTurn] | None = None,
        tools: Sequence[dict[str, Any]] = (),
        response_format: dict[str, Any] | None = None,
    ) -> PromptMeasure:
        text = prompt or ""
        if messages is not None:  # vLLM renders the chat itself; the text is only for estimates
            text = "\n".join(f"{m.role}: {m.content}" for m in messages)
        described = len(_encode(list(tools))) if tools else 0  # the template renders the tools too
        estimate = max(1, (len(text) + described + 3) // 4)
        near_limit = estimate * 4 >= self.info.max_model_len * 3  # within a quarter of the context
        if self.tokenize == "never" or (self.tokenize == "auto" and not near_limit):
            return PromptMeasure(text=text, tokens=estimate)
        body: dict[str, Any] = {"model": self.model}
        if messages is not None:
            body.update(messages=[_message(m) for m in messages], add_generation_prompt=True)
            if tools:
                body["tools"] = list(tools)
        else:
            body["prompt"] = text
        self.tokenize_calls += 1
        try:
            status, answer = await self._call("POST", "/tokenize", _encode(body), timeout_s=10.0, headers=_JSON)
            if status != 200:
                raise EngineError(f"vLLM /tokenize answered {status}")
            count = int(msgspec.json.decode(answer)["count"])
        except (UpstreamError, TimeoutError, KeyError, ValueError, TypeError, msgspec.DecodeError) as exc:
            raise EngineError(f"vLLM /tokenize failed: {exc}") from exc
        return PromptMeasure(text=text, tokens=count)

    async def warmup(self, prompts: Sequence[str]) -> None:
        if self.embeddings:
            await run_embedding_warmup(self, prompts)
            return
        await run_warmup(self, prompts)

    async def measure_inputs(self, inputs: Sequence[str]) -> list[int]:
        # Estimates, and /tokenize only for an input near the context (as for prompts); the
        # count billed is the one vLLM reports.
        return [(await self.measure(prompt=text)).tokens for text in inputs]

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        body: dict[str, Any] = {"model": self.model, "input": list(request.inputs), "encoding_format": "float",
                                **self.extra_body}  # fmt: skip
        if request.priority:
            body["priority"] = request.priority
        self._active += 1
        try:  # a cancelled await closes the connection: vLLM aborts the request
            headers = _headers(request.request_id, request.trace_headers)
            r = await self._http().request("POST", "/v1/embeddings", _encode(body), headers)
            async with r:
                if r.status != 200:
                    detail = (await r.read()).decode("utf-8", "replace")[:500]
                    raise EngineError(f"vLLM answered {r.status}: {detail}")
                answer = _decode_embeddings(await r.read())
        except (UpstreamError, TimeoutError, msgspec.DecodeError) as exc:
            raise EngineError(f"vLLM embeddings request failed: {exc}") from exc
        finally:
            self._active -= 1
        rows = sorted(answer.data, key=lambda e: e.index)
        if [e.index for e in rows] != list(range(len(request.inputs))):
            raise EngineError(f"vLLM answered {len(rows)} embeddings for {len(request.inputs)} inputs")
        try:
            vectors = np.array([e.embedding for e in rows], dtype=np.float32)
        except ValueError as exc:  # rows of different lengths
            raise EngineError(f"vLLM answered malformed embeddings: {exc}") from exc
        prompt_tokens = answer.usage.prompt_tokens if answer.usage is not None else 0
        return Embeddings(vectors=unit_rows(vectors), prompt_tokens=prompt_tokens or None)

    def _body(self, req: GenerationRequest) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "stream": req.stream,
            **self.extra_body,
        }
        if req.stream:
            body["stream_options"] = {"include_usage": True}
        if req.seed is not None:
            body["seed"] = req.seed
        if req.stop:
            body["stop"] = list(req.stop)
        if req.priority:
            body["priority"] = req.priority
        if req.n > 1:
            body["n"] = req.n
        if req.presence_penalty:
            body["presence_penalty"] = req.presence_penalty
        if req.frequency_penalty:
            body["frequency_penalty"] = req.frequency_penalty
        if req.logit_bias:
            body["logit_bias"] = {str(k): v for k, v in req.logit_bias.items()}
        if req.messages is not None:
            body["messages"] = [_message(m) for m in req.messages]
            if req.tools:
                body.update(tools=list(req.tools), parallel_tool_calls=req.parallel_tool_calls)
                if req.tool_choice is not None:
                    body["tool_choice"] = req.tool_choice
            if req.response_format is not None:
                body["response_format"] = req.response_format
            if req.logprobs is not None:
                body.update(logprobs=True, top_logprobs=req.logprobs)
            return "/v1/chat/completions", body
        if req.logprobs is not None:
            body["logprobs"] = req.logprobs
        body["prompt"] = req.prompt
        return "/v1/completions", body

    async def generate(self, req: GenerationRequest) -> AsyncGenerator[Delta, None]:
        path, body = self._body(req)
        self._active += 1
        try:
            r = await self._http().request("POST", path, _encode(body), _headers(req.request_id, req.trace_headers))
            async with r:  # closed before its end (the client left, an error): vLLM aborts the request
                if r.status != 200:
                    raise _refused(r.status, await r.read())
                if req.stream:
                    async for delta in self._deltas(r, req.n):
                        yield delta
                    return
                answer = _decode_chunk(await r.read())
            if answer.error is not None:
                raise EngineError(f"vLLM error: {answer.error}")
            usage = answer.usage or _Usage()
            choices = sorted(answer.choices, key=lambda c: c.index) or [_Choice()]
            for k, choice in enumerate(choices):
                last = k == len(choices) - 1  # the usage goes with the last choice
                yield Delta(text=choice.content(), tokens=usage.completion_tokens if last else 0,
                            finish_reason=_FINISH.get(choice.finish_reason or "", "length"),
                            prompt_tokens=(usage.prompt_tokens or None) if last else None, index=choice.index,
                            tool_calls=choice.calls(), logprobs=choice.token_logprobs())  # fmt: skip
        except (UpstreamError, TimeoutError, msgspec.DecodeError) as exc:
            raise EngineError(f"vLLM request failed: {exc}") from exc
        finally:
            self._active -= 1

    async def _deltas(self, r: Http1Response, n: int) -> AsyncGenerator[Delta, None]:
        """The SSE stream: a delta per chunk of a choice (text, tool-call fragments, logprobs),
        then each choice's finish, the last with the usage chunk's counts (authoritative:
        chunks and tokens need not be one to one)."""
        counted = 0
        finish: dict[int, FinishReason] = {}
        usage: _Usage | None = None
        rest = b""  # a line not complete yet
        done = False
        # Whatever has arrived, split into lines here: one await per network read, where
        # readline() costs one per line (two per event, with the blank line between events).
        async for received in r.chunks():
            *lines, rest = (rest + received).split(b"\n")
            for line in lines:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                chunk = _decode_chunk(data)
                if chunk.error is not None:
                    raise EngineError(f"vLLM error: {chunk.error}")
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    text, calls, logprobs = choice.content(), choice.calls(), choice.token_logprobs()
                    if text or calls or logprobs:
                        counted += 1
                        yield Delta(text=text, tokens=1, index=choice.index, tool_calls=calls, logprobs=logprobs)
                    if choice.finish_reason:
                        finish[choice.index] = _FINISH.get(choice.finish_reason, "stop")
            if done:
                break
        total = usage.completion_tokens if usage is not None and usage.completion_tokens else counted
        prompt = usage.prompt_tokens if usage is not None and usage.prompt_tokens else None
        for i in range(n - 1):
            yield Delta(text="", tokens=0, finish_reason=finish.get(i, "length"), index=i)
        yield Delta(text="", tokens=max(0, total - counted), finish_reason=finish.get(n - 1, "length"),
                    prompt_tokens=prompt, index=n - 1)  # fmt: skip


class _ErrorBody(msgspec.Struct):
    message: str = ""


class _ErrorAnswer(msgspec.Struct):
    error: _ErrorBody | None = None


_decode_error = msgspec.json.Decoder(_ErrorAnswer).decode


def _refused(status: int, body: bytes) -> EngineError:
    """vLLM's answer to a generation it did not run. A 400 is about the request's values (a
    prompt over the context by vLLM's own count where laneway's estimate was under it, a value
    out of range): the client's error, a 400 that does not count against the replica's health.
    Anything else is the engine's."""
    detail = body.decode("utf-8", "replace")[:500]
    if status == 400:
        try:
            said = _decode_error(body).error
        except msgspec.DecodeError:
            said = None
        return EngineRequestError(said.message[:500] if said is not None and said.message else detail)
    return EngineError(f"vLLM answered {status}: {detail}")


_JSON = (("Content-Type", "application/json"),)


def _headers(request_id: str, trace_headers: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """A generation's headers: its id (vLLM's request id, in its logs) and, with tracing on,
    the span's W3C headers (vLLM started with --otlp-traces-endpoint joins the trace)."""
    return [("X-Request-Id", request_id), *_JSON, *trace_headers]


def _message(m: ChatTurn) -> dict[str, Any]:
    """A chat turn as vLLM takes it: with its tool calls, or the call a tool result answers."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
        out["content"] = m.content or None
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out
