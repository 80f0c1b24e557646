"""A stand-in for vLLM's OpenAI-compatible server, on a real loopback HTTP port.

Serves /v1/completions and /v1/chat/completions (SSE streaming, one word a token, a final
usage chunk), /v1/embeddings (a deterministic vector per text, deliberately not of unit
length, optionally after `embed_delay_s`; a client that leaves first is recorded as
cancelled), /tokenize (one token per word), /metrics (vllm:num_requests_waiting and
vllm:kv_cache_usage_perc, settable), /health. It records every request and every stream
its client abandoned, so tests can prove an abort reaches the engine, and the most requests
it ever had in flight, so tests can prove gateway replicas together never exceed its capacity.
"""

from __future__ import annotations

import asyncio
import json
import random
import zlib
from collections.abc import AsyncIterator
from typing import Any

from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.response import Stream

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


class VLLMStandIn:
    def __init__(self, token_delay_s: float = 0.002) -> None:
        self.token_delay_s = token_delay_s
        self.requests: list[dict[str, Any]] = []  # bodies, with the X-Request-Id as "_request_id"
        self.cancelled: list[str] = []
        self.finished: list[str] = []
        self.tokenize_calls = 0
        self.healthy = True
        self.fail_generation = False
        self.waiting = 0.0
        self.kv_usage = 0.1
        self.running = 0
        self.max_running = 0  # the most requests it ever generated for at once
        self.prompt_tokens = 1  # what its usage reports for every prompt
        self.embedding_dim = 8
        self.embed_delay_s = 0.0
        self.app = self._build()

    def _build(self) -> Litestar:
        standin = self

        @get("/health", sync_to_thread=False)
        def health() -> Response[str]:
            return Response("", status_code=200 if standin.healthy else 503)

        @get("/metrics", media_type=MediaType.TEXT, sync_to_thread=False)
        def metrics() -> str:
            return (
                "# HELP vllm:num_requests_waiting Requests waiting.\n# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{model_name="m"}} {standin.waiting}\n'
                f'vllm:num_requests_running{{model_name="m"}} {standin.running}\n'
                f'vllm:kv_cache_usage_perc{{model_name="m"}} {standin.kv_usage}\n'
            )

        @get("/v1/models", sync_to_thread=False)
        def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 4096}]}

        @post("/tokenize", status_code=200)
        async def tokenize(request: Request) -> dict[str, Any]:  # type: ignore[type-arg]
            standin.tokenize_calls += 1
            body = await request.json()
            if "messages" in body:
                count = sum(len(m["content"].split()) + 4 for m in body["messages"]) + 3
            else:
                count = len(body["prompt"].split())
            return {"count": count, "tokens": list(range(count)), "max_model_len": 4096}

        async def generate(request: Request, chat: bool) -> Response[str] | Stream:  # type: ignore[type-arg]
            body = await request.json()
            rid = request.headers.get("x-request-id", "")
            standin.requests.append({**body, "_request_id": rid, "_path": request.url.path})
            if standin.fail_generation:
                return Response(json.dumps({"error": {"message": "engine crashed"}}), status_code=500)
            if not body.get("stream"):  # one JSON answer, as vLLM gives a non-streaming client
                text, finish, produced = "", "length", 0
                async for event in standin._events(body, rid, chat):
                    data = event[6:].strip()
                    if data == b"[DONE]":
                        continue
                    parsed = json.loads(data)
                    for choice in parsed["choices"]:
                        text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                        finish = choice.get("finish_reason") or finish
                    produced = parsed.get("usage", {}).get("completion_tokens", produced)
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                          if chat else {"index": 0, "text": text, "finish_reason": finish})  # fmt: skip
                usage = {"prompt_tokens": standin.prompt_tokens, "completion_tokens": produced,
                         "total_tokens": produced + standin.prompt_tokens}  # fmt: skip
                return Response(json.dumps({"id": rid, "choices": [choice], "usage": usage}),
                                media_type=MediaType.JSON)  # fmt: skip
            return Stream(standin._events(body, rid, chat), media_type="text/event-stream")

        @post("/v1/completions", status_code=200)
        async def completions(request: Request) -> Response[str] | Stream:  # type: ignore[type-arg]
            return await generate(request, chat=False)

        @post("/v1/chat/completions", status_code=200)
        async def chat(request: Request) -> Response[str] | Stream:  # type: ignore[type-arg]
            return await generate(request, chat=True)

        @post("/v1/embeddings", status_code=200)
        async def embeddings(request: Request) -> Response[str]:  # type: ignore[type-arg]
            body = await request.json()
            rid = request.headers.get("x-request-id", "")
            standin.requests.append({**body, "_request_id": rid, "_path": request.url.path})
            if standin.fail_generation:
                return Response(json.dumps({"error": {"message": "engine crashed"}}), status_code=500)
            if standin.embed_delay_s:
                gone = asyncio.ensure_future(_disconnected(request))
                done, _ = await asyncio.wait({gone}, timeout=standin.embed_delay_s)
                if gone in done:
                    standin.cancelled.append(rid)  # vLLM aborts the request here
                    return Response("", status_code=499)
                gone.cancel()
            texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
            data = [{"object": "embedding", "index": i, "embedding": standin.vector(t)} for i, t in enumerate(texts)]
            data.reverse()  # the index says which input a vector belongs to, not the position
            tokens = sum(len(t.split()) for t in texts)
            usage = {"prompt_tokens": tokens, "total_tokens": tokens}
            standin.finished.append(rid)
            return Response(json.dumps({"object": "list", "data": data, "model": body["model"], "usage": usage}),
                            media_type=MediaType.JSON)  # fmt: skip

        return Litestar([health, metrics, models, tokenize, completions, chat, embeddings])

    def vector(self, text: str) -> list[float]:
        """The stand-in's embedding of `text`: deterministic, and of length 3 per component on
        average (an adapter must scale it to unit length)."""
        rng = random.Random(zlib.crc32(text.encode()))
        return [rng.uniform(-3, 3) for _ in range(self.embedding_dim)]

    async def _events(self, body: dict[str, Any], rid: str, chat: bool) -> AsyncIterator[bytes]:
        rng = random.Random(body.get("seed", 0))
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        produced, finish, text_so_far = 0, "length", ""
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        generating = True
        try:
            while produced < body["max_tokens"]:
                await asyncio.sleep(self.token_delay_s)
                word = " " + rng.choice(WORDS)
                produced += 1
                text_so_far += word
                if any(s in text_so_far for s in stops):
                    finish = "stop"
                    break
                choice = {"index": 0, "delta": {"content": word}} if chat else {"index": 0, "text": word}
                yield b"data: " + json.dumps({"id": rid, "choices": [choice]}).encode() + b"\n\n"
            # Generation is over (as vLLM counts it) before the last chunks go out.
            self.running -= 1
            generating = False
            end = (
                {"index": 0, "delta": {}, "finish_reason": finish}
                if chat
                else {"index": 0, "text": "", "finish_reason": finish}
            )
            yield b"data: " + json.dumps({"id": rid, "choices": [end]}).encode() + b"\n\n"
            usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": produced,
                     "total_tokens": produced + self.prompt_tokens}  # fmt: skip
            yield b"data: " + json.dumps({"id": rid, "choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            self.finished.append(rid)
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.append(rid)  # vLLM aborts the request here
            raise
        finally:
            if generating:
                self.running -= 1


async def _disconnected(request: Request) -> None:  # type: ignore[type-arg]
    while (await request.receive())["type"] != "http.disconnect":
        pass
