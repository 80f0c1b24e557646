"""A stand-in for vLLM's OpenAI-compatible server, on a real loopback HTTP port.

Serves /v1/completions and /v1/chat/completions (SSE streaming, one word a token, a final
usage chunk; n choices interleaved, tool calls streamed as fragments for `tools` with
tool_choice required or named, logprobs in both endpoints' shapes, a JSON object for
response_format), /v1/embeddings (a deterministic vector per text, deliberately not of unit
length, optionally after `embed_delay_s`; a client that leaves first is recorded as
cancelled), /tokenize (one token per word), /metrics (vllm:num_requests_waiting and
vllm:kv_cache_usage_perc, settable), /health. It records every request and every stream
its client abandoned, so tests can prove an abort reaches the engine, and the most requests
it ever had in flight, so tests can prove gateway replicas together never exceed its capacity.

For continuation (issue 39): with `markov` set its words are a deterministic model's, each
chosen by the word before it (the prompt's last, or the continued assistant message's), so a
continued answer is word for word an unbroken one; `die_after_tokens` drops the connection
mid-stream after that many tokens, `error_after_tokens` sends an error event there, and
`stall_after_tokens` stops sending until its client leaves; `signal_at_tokens` makes the
process send itself `signal_number` (a bench's SIGKILL or SIGSTOP, timed by the replica).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.response import Stream

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def vllm_config(standin: VLLMStandIn, **extra: Any) -> dict[str, Any]:
    """A vLLM deployment's config pointing at the stand-in."""
    return {"base_url": standin.base_url, "model": "m", "metrics_poll_s": 0.05, **extra}


class VLLMStandIn:
    def __init__(self, token_delay_s: float = 0.002) -> None:
        self.base_url = ""  # set once it is served
        self.token_delay_s = token_delay_s
        # Bodies, with the X-Request-Id as "_request_id" and the W3C traceparent as "_traceparent".
        self.requests: list[dict[str, Any]] = []
        self.cancelled: list[str] = []
        self.finished: list[str] = []
        self.tokenize_calls = 0
        self.healthy = True
        self.fail_generation = False
        self.fail_status = 500  # what a failing generation answers (500: the engine's fault; 400: the request's)
        self.waiting = 0.0
        self.kv_usage = 0.1
        self.running = 0
        self.max_running = 0  # the most requests it ever generated for at once
        self.prompt_tokens = 1  # what its usage reports for every prompt
        self.embedding_dim = 8
        self.embed_delay_s = 0.0
        self.markov = False
        self.die_after_tokens: int | None = None
        self.error_after_tokens: int | None = None
        self.stall_after_tokens: int | None = None
        self.progress: dict[str, int] = {}  # the tokens each stream in flight has produced so far
        # A bench's fault, timed by the stand-in itself however loaded the machine: the process
        # sends itself this signal (SIGKILL, SIGSTOP) when a stream has produced this many tokens.
        self.signal_at_tokens: int | None = None
        self.signal_number = 9
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
            standin.requests.append(
                {
                    **body,
                    "_request_id": rid,
                    "_path": request.url.path,
                    "_traceparent": request.headers.get("traceparent"),
                }
            )
            if standin.fail_generation:
                said = "engine crashed" if standin.fail_status >= 500 else "the request is invalid"
                return Response(json.dumps({"error": {"message": said}}), status_code=standin.fail_status)
            if not body.get("stream"):  # one JSON answer, as vLLM gives a non-streaming client
                return Response(json.dumps(await standin._whole(body, rid, chat)), media_type=MediaType.JSON)
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
            standin.requests.append(
                {
                    **body,
                    "_request_id": rid,
                    "_path": request.url.path,
                    "_traceparent": request.headers.get("traceparent"),
                }
            )
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
            return Response(
                json.dumps({"object": "list", "data": data, "model": body["model"], "usage": usage}),
                media_type=MediaType.JSON,
            )

        return Litestar([health, metrics, models, tokenize, completions, chat, embeddings])

    def vector(self, text: str) -> list[float]:
        """The stand-in's embedding of `text`: deterministic, and of length 3 per component on
        average (an adapter must scale it to unit length)."""
        rng = random.Random(zlib.crc32(text.encode()))
        return [rng.uniform(-3, 3) for _ in range(self.embedding_dim)]

    async def _whole(self, body: dict[str, Any], rid: str, chat: bool) -> dict[str, Any]:
        """The streamed events merged into one answer, choice by choice."""
        merged: dict[int, dict[str, Any]] = {}
        usage: dict[str, Any] = {}
        async for event in self._events(body, rid, chat):
            data = event[6:].strip()
            if data == b"[DONE]":
                continue
            parsed = json.loads(data)
            usage = parsed.get("usage") or usage
            for c in parsed["choices"]:
                m = merged.setdefault(c["index"], {"text": "", "calls": {}, "logprobs": [], "finish": "length"})
                delta = c.get("delta") or {}
                m["text"] += c.get("text") or delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    known = m["calls"].setdefault(
                        call["index"],
                        {"id": call.get("id"), "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    fn = call.get("function") or {}
                    known["function"]["name"] += fn.get("name") or ""
                    known["function"]["arguments"] += fn.get("arguments") or ""
                if c.get("logprobs"):
                    m["logprobs"].append(c["logprobs"])
                m["finish"] = c.get("finish_reason") or m["finish"]
        choices = []
        for i, m in sorted(merged.items()):
            if chat:
                message: dict[str, Any] = {"role": "assistant", "content": m["text"] or None}
                if m["calls"]:
                    message["tool_calls"] = [c for _, c in sorted(m["calls"].items())]
                lp = {"content": [t for x in m["logprobs"] for t in x["content"]]} if m["logprobs"] else None
                choices.append({"index": i, "message": message, "finish_reason": m["finish"], "logprobs": lp})
            else:
                lp = None
                if m["logprobs"]:
                    lp = {
                        k: [v for x in m["logprobs"] for v in x[k]]
                        for k in ("tokens", "token_logprobs", "top_logprobs")
                    }
                choices.append({"index": i, "text": m["text"], "finish_reason": m["finish"], "logprobs": lp})
        return {"id": rid, "choices": choices, "usage": usage}

    async def _events(self, body: dict[str, Any], rid: str, chat: bool) -> AsyncIterator[bytes]:
        n = int(body.get("n", 1))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        generating = True
        choices = [self._choice(body, i, chat) for i in range(n)]
        produced = 0
        try:
            while choices:  # the choices' chunks interleaved, as vLLM streams them
                await asyncio.sleep(self.token_delay_s)
                for gen in list(choices):
                    chunk = next(gen, None)
                    if chunk is None:
                        choices.remove(gen)
                        continue
                    produced += chunk.pop("_tokens", 0)
                    self.progress[rid] = produced
                    if self.signal_at_tokens is not None and produced >= self.signal_at_tokens:
                        os.kill(os.getpid(), self.signal_number)
                    if self.die_after_tokens is not None and produced > self.die_after_tokens:
                        raise ConnectionAbortedError("the stand-in died mid-stream")  # the connection drops
                    if self.error_after_tokens is not None and produced > self.error_after_tokens:
                        yield b'data: {"error": {"message": "engine died", "code": 500}}\n\n'
                        return
                    if self.stall_after_tokens is not None and produced > self.stall_after_tokens:
                        await asyncio.sleep(3600)  # stalled, until its client leaves
                    yield b"data: " + json.dumps({"id": rid, "choices": [chunk]}).encode() + b"\n\n"
            # Generation is over (as vLLM counts it) before the last chunks go out.
            self.running -= 1
            generating = False
            usage = {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": produced,
                "total_tokens": produced + self.prompt_tokens,
            }
            yield b"data: " + json.dumps({"id": rid, "choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            self.finished.append(rid)
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.append(rid)  # vLLM aborts the request here
            raise
        finally:
            self.progress.pop(rid, None)
            if generating:
                self.running -= 1

    def _choice(self, body: dict[str, Any], index: int, chat: bool) -> Iterator[dict[str, Any]]:
        """One choice's chunks, each with the tokens it stands for under "_tokens"."""
        rng = random.Random(body.get("seed", 0) + index)
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        tools = body.get("tools") or []
        choice = body.get("tool_choice")
        if tools and choice not in (None, "none", "auto"):
            name = choice["function"]["name"] if isinstance(choice, dict) else tools[0]["function"]["name"]
            call_id = f"chatcmpl-tool-{index}"
            yield {
                "index": index,
                "_tokens": 1,
                "delta": {
                    "tool_calls": [
                        {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
                    ]
                },
            }
            for piece in ('{"city": ', '"' + rng.choice(WORDS) + '"}'):
                yield {
                    "index": index,
                    "_tokens": 1,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]},
                }
            yield {"index": index, "delta": {}, "finish_reason": "tool_calls"}
            return
        top = body.get("top_logprobs", 0) if chat else (body.get("logprobs") or 0)
        want_logprobs = bool(body.get("logprobs")) if chat else body.get("logprobs") is not None
        if (body.get("response_format") or {}).get("type") in ("json_object", "json_schema"):
            words = ["{", '"answer"', ": ", '"' + rng.choice(WORDS) + '"', "}"]
        elif self.markov:
            words = _markov(body, index)
        else:
            words = [" " + rng.choice(WORDS) for _ in range(body["max_tokens"])]
        produced, finish, text_so_far = 0, "length", ""
        for word in words[: body["max_tokens"]]:
            produced += 1
            text_so_far += word
            if any(s in text_so_far for s in stops):
                finish = "stop"
                break
            chunk: dict[str, Any] = {"index": index, "_tokens": 1}
            chunk.update({"delta": {"content": word}} if chat else {"text": word})
            if want_logprobs:
                alternatives = [(word, -0.25)] + [(w, -2.0 - k) for k, w in enumerate(WORDS[: max(0, top - 1)])]
                if chat:
                    chunk["logprobs"] = {
                        "content": [
                            {
                                "token": word,
                                "logprob": -0.25,
                                "bytes": list(word.encode()),
                                "top_logprobs": [
                                    {"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in alternatives[:top]
                                ],
                            }
                        ]
                    }
                else:
                    chunk["logprobs"] = {
                        "tokens": [word],
                        "token_logprobs": [-0.25],
                        "top_logprobs": [dict(alternatives[:top])],
                        "text_offset": [0],
                    }
            yield chunk
        if len(words) < body["max_tokens"] and finish == "length":
            finish = "stop"
        yield (
            {"index": index, "delta": {}, "finish_reason": finish}
            if chat
            else {"index": index, "text": "", "finish_reason": finish}
        )


def _markov(body: dict[str, Any], index: int) -> list[str]:
    """A deterministic model's answer: each word chosen by the one before it, starting from the
    context's last word (a continued assistant message's, when the body continues one)."""
    context = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
    prev = (context.split() or [""])[-1]
    words = []
    for _ in range(body["max_tokens"]):
        prev = WORDS[zlib.crc32(f"{body.get('seed', 0)}:{index}:{prev}".encode()) % len(WORDS)]
        words.append(" " + prev)
    return words


async def _disconnected(request: Request) -> None:  # type: ignore[type-arg]
    while (await request.receive())["type"] != "http.disconnect":
        pass
