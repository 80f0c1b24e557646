"""vLLM through its OpenAI-compatible HTTP server (httpx, pooled connections, streaming).

- Chat requests go to /v1/chat/completions with the messages, so vLLM applies the model's
  own chat template; completions go to /v1/completions. laneway's stop sequences, seed,
  sampling and priority (vLLM's `--scheduling-policy priority`) are passed through; the
  request id travels as X-Request-Id.
- Closing the stream closes the HTTP response: vLLM aborts the request when its client
  goes away, so the engine slot is freed.
- Tokens are counted with vLLM's /tokenize when `tokenize` is on (the model's tokenizer),
  otherwise estimated at 4 characters a token.
- A background poller reads /metrics (vllm:num_requests_waiting, KV-cache usage): a replica
  over `max_waiting` or `max_kv_cache_usage` reports itself overloaded, and the registry
  sends new requests to its siblings while it is.

Config: base_url (required), model (the served model name; default: the alias), api_key,
tokenize (bool), max_concurrency, max_waiting, max_kv_cache_usage, metrics_poll_s,
timeout_s, extra_body (dict merged into every request).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import httpx

from laneway.engines.base import EngineError, run_warmup
from laneway.types import ChatTurn, Delta, EngineInfo, FinishReason, GenerationRequest, PromptMeasure

log = logging.getLogger("laneway.engines.vllm")

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "cancelled"}


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
        self.use_tokenize = bool(config.get("tokenize", True))
        self.max_waiting = float(config.get("max_waiting", 32))
        self.max_kv_usage = float(config.get("max_kv_cache_usage", 0.98))
        self.metrics_poll_s = float(config.get("metrics_poll_s", 1.0))
        self.timeout_s = float(config.get("timeout_s", 600))
        self.extra_body: dict[str, Any] = dict(config.get("extra_body", {}))
        self.api_key = config.get("api_key")
        self.info = EngineInfo(
            engine="vllm",
            model=alias,
            quantization=quantization,
            gpu_type=gpu_type,
            max_model_len=int(max_model_len or config.get("max_model_len", 4096)),
            max_concurrency=int(config.get("max_concurrency", 64)),
        )
        self._client: httpx.AsyncClient | None = None
        self._poller: asyncio.Task[None] | None = None
        self._active = 0
        self.waiting = 0.0  # vllm:num_requests_waiting at the last poll
        self.kv_cache_usage = 0.0

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=self.info.max_concurrency + 8, max_keepalive_connections=64),
        )
        if not await self.health():
            await self._client.aclose()
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
            cards = (await self._http().get("/v1/models", timeout=5.0)).json().get("data", [])
        except (httpx.HTTPError, ValueError):
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
        if self._client is not None:
            await self._client.aclose()

    @property
    def active_slots(self) -> int:
        return self._active

    @property
    def overloaded(self) -> bool:
        return self.waiting > self.max_waiting or self.kv_cache_usage > self.max_kv_usage

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            raise EngineError(f"deployment for {self.alias} is not started")
        return self._client

    async def health(self) -> bool:
        try:
            return (await self._http().get("/health", timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def _poll_metrics(self) -> None:
        while True:
            try:
                r = await self._http().get("/metrics", timeout=5.0)
                values = parse_prometheus(r.text)
                self.waiting = values.get("vllm:num_requests_waiting", 0.0)
                self.kv_cache_usage = values.get(
                    "vllm:kv_cache_usage_perc", values.get("vllm:gpu_cache_usage_perc", 0.0)
                )
            except httpx.HTTPError as exc:
                log.warning("reading %s/metrics failed: %s", self.base_url, exc)
            await asyncio.sleep(self.metrics_poll_s)

    async def measure(self, *, prompt: str | None = None, messages: Sequence[ChatTurn] | None = None) -> PromptMeasure:
        text = prompt or ""
        if messages is not None:  # vLLM renders the chat itself; the text is only for estimates
            text = "\n".join(f"{m.role}: {m.content}" for m in messages)
        if not self.use_tokenize:
            return PromptMeasure(text=text, tokens=max(1, (len(text) + 3) // 4))
        body: dict[str, Any] = {"model": self.model}
        if messages is not None:
            body.update(messages=[{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True)
        else:
            body["prompt"] = text
        try:
            r = await self._http().post("/tokenize", json=body, timeout=10.0)
            r.raise_for_status()
            return PromptMeasure(text=text, tokens=int(r.json()["count"]))
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise EngineError(f"vLLM /tokenize failed: {exc}") from exc

    async def warmup(self, prompts: Sequence[str]) -> None:
        await run_warmup(self, prompts)

    def _body(self, req: GenerationRequest) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.extra_body,
        }
        if req.seed is not None:
            body["seed"] = req.seed
        if req.stop:
            body["stop"] = list(req.stop)
        if req.priority:
            body["priority"] = req.priority
        if req.messages is not None:
            body["messages"] = [{"role": m.role, "content": m.content} for m in req.messages]
            return "/v1/chat/completions", body
        body["prompt"] = req.prompt
        return "/v1/completions", body

    async def generate(self, req: GenerationRequest) -> AsyncGenerator[Delta, None]:
        path, body = self._body(req)
        self._active += 1
        counted = 0
        finish: FinishReason | None = None
        usage_tokens: int | None = None
        try:
            async with self._http().stream("POST", path, json=body, headers={"X-Request-Id": req.request_id}) as r:
                if not r.is_success:
                    detail = (await r.aread()).decode("utf-8", "replace")[:500]
                    raise EngineError(f"vLLM answered {r.status_code}: {detail}")
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise EngineError(f"vLLM error: {chunk['error']}")
                    if chunk.get("usage"):
                        usage_tokens = int(chunk["usage"].get("completion_tokens", counted))
                    for choice in chunk.get("choices", []):
                        text = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                        if text:
                            counted += 1
                            yield Delta(text=text, tokens=1)
                        if choice.get("finish_reason"):
                            finish = _FINISH.get(choice["finish_reason"], "stop")
            # The usage chunk is authoritative: chunks and tokens need not be one to one.
            extra = max(0, (usage_tokens or counted) - counted)
            yield Delta(text="", tokens=extra, finish_reason=finish or "length")
        except httpx.HTTPError as exc:
            raise EngineError(f"vLLM request failed: {exc}") from exc
        finally:
            self._active -= 1
