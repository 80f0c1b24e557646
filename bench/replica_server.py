"""A real llama.cpp engine behind the HTTP surface of vLLM that routers use, one process per
replica (bench/routing.py, issue 27):

    python bench/replica_server.py --model M.gguf --port P [--cache-bytes N] [--n-ctx 2048]

llama-cpp-python's public API only: a `llama_cpp.Llama` (its context is the live sequence) and a
`llama_cpp.LlamaRAMCache` of saved states, used as llama-cpp-python's own completion path uses
it (the saved state with the longest prefix of the prompt is loaded when it beats the live
context; the state after each answer is saved), driven here so that the prompt tokens not
computed again are known: usage.prompt_tokens_details.cached_tokens, vllm:prefix_cache_hits_total.
Two departures, to behave like vLLM's block cache rather than a list of whole states: a new
state replaces the saved ones it mostly covers (all but a quarter of their tokens), or one hot
system prompt fills the cache with near-copies; a saved state's copy of the logits (batch x
vocabulary floats, not counted in capacity_bytes) is cut to one row, as generation always
computes the prompt's last token again.
cache_salt (laneway sends one per tenant): the cache key is the prompt's tokens behind a marker
for the salt (a negative id, never a token), so a state is found only under its own salt; the
live context is reused only after a request of the same salt.
One request is computed at a time, the rest wait in arrival order. Unknown body fields are
ignored. GET /health, /v1/models, /metrics, /stats; POST /v1/chat/completions (with vLLM's
continue_final_message: the last assistant turn left open and continued), /v1/completions
(streamed or not, the usage chunk with stream_options.include_usage), /tokenize, /reset (the
cache emptied, and resized when the body gives cache_bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import json
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import uvicorn
from litestar import Litestar, Request, Response, get, post
from litestar.response import Stream
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Job:
    tokens: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    salt: str | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)
    cancelled: bool = False

    def emit(self, *event: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class Engine:
    def __init__(self, model: str, *, n_ctx: int, threads: int, n_batch: int, cache_bytes: int) -> None:
        self.llm = llama_cpp.Llama(
            model_path=model, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=n_batch, verbose=False
        )
        self.n_ctx = n_ctx
        self.cache = llama_cpp.LlamaRAMCache(capacity_bytes=cache_bytes)
        eos = self.llm.token_eos()
        self.stop_ids = {eos}
        text = self.llm.detokenize
        self.formatter = Jinja2ChatFormatter(
            self.llm.metadata.get("tokenizer.chat_template") or CHATML,
            eos_token=text([eos], special=True).decode(errors="replace"),
            bos_token=text([self.llm.token_bos()], special=True).decode(errors="replace"),
        )
        self.salts: dict[str | None, int] = {None: 0}
        self.live_salt: str | None = None
        self.live_tokens = 0  # tokens in the context while a request runs (KV usage)
        self.queue: queue.Queue[Job] = queue.Queue()  # FIFO, to the one engine thread
        self.running = 0
        threading.Thread(target=self.work, name="llama", daemon=True).start()
        self.guard = threading.Lock()  # the context and the cache: the worker thread and /reset
        self.counts = {"prompt": 0, "hits": 0, "generation": 0, "stop": 0, "length": 0, "abort": 0}

    # ---- requests -> tokens ----

    def chat_tokens(self, messages: list[dict[str, Any]], *, continue_final: bool = False) -> list[int]:
        """The chat's prompt tokens; `continue_final` (vLLM's continue_final_message, with
        add_generation_prompt false): the last message is an assistant turn left open, its text
        the end of the prompt, so generation continues it."""
        turns = [{**m, "content": _text(m.get("content"))} for m in messages]
        if continue_final and turns[-1].get("role") == "assistant":
            prompt = self.formatter(messages=turns[:-1]).prompt + turns[-1]["content"]
        else:
            prompt = self.formatter(messages=turns).prompt
        return self.llm.tokenize(prompt.encode(), add_bos=False, special=True)

    def prompt_tokens(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string or a list of token ids")
        return self.llm.tokenize(prompt.encode(), add_bos=True, special=True)

    # ---- the worker: one request at a time, in arrival order ----

    def work(self) -> None:
        while True:
            job = self.queue.get()
            if job.cancelled:  # its client left while it waited
                continue
            self.running = 1
            try:
                self.generate(job)
            except Exception as exc:  # the request fails, the replica goes on
                job.emit("error", f"{type(exc).__name__}: {exc}")
            finally:
                self.running = 0

    def _key(self, salt: str | None, tokens: Any) -> tuple[int, ...]:
        marker = self.salts.setdefault(salt, -len(self.salts))
        return (marker, *(int(t) for t in tokens))

    def _reuse(self, job: Job) -> int:
        """Bring the longest cached prefix of the prompt (same salt) into the context; the
        tokens that will not be computed again."""
        llm, longest = self.llm, llama_cpp.Llama.longest_token_prefix
        if job.salt != self.live_salt:
            llm.reset()
        self.live_salt = job.salt
        reused = longest(llm.input_ids[: llm.n_tokens].tolist(), job.tokens)
        key = self._key(job.salt, job.tokens)
        if key in self.cache:
            state = self.cache[key]
            saved = longest(state.input_ids[: state.n_tokens].tolist(), job.tokens)
            if saved > reused:
                llm.load_state(state)
                reused = saved
        return min(reused, len(job.tokens) - 1)  # the last prompt token is always computed

    def _save(self, salt: str | None) -> None:
        llm = self.llm
        key = self._key(salt, llm.input_ids[: llm.n_tokens].tolist())
        for old in list(self.cache.cache_state):
            if len(old) - llama_cpp.Llama.longest_token_prefix(old, key) <= len(old) // 4:
                del self.cache.cache_state[old]  # the new state holds most of it
        state = llm.save_state()
        state.scores = state.scores[-1:].copy()
        self.cache[key] = state

    def generate(self, job: Job) -> None:
        with self.guard:
            self._generate(job)

    def _generate(self, job: Job) -> None:
        llm = self.llm
        cached = self._reuse(job)
        self.counts["prompt"] += len(job.tokens)
        self.counts["hits"] += cached
        if job.seed is not None:
            llm.set_seed(job.seed)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text, sent, produced, finish = "", 0, 0, "length"
        hold = max((len(s) for s in job.stop), default=1) - 1
        self.live_tokens = len(job.tokens)
        try:
            for token in llm.generate(job.tokens, temp=job.temperature, top_p=job.top_p, top_k=0, reset=True):
                if job.cancelled:
                    finish = "abort"
                    break
                if token in self.stop_ids:
                    finish = "stop"
                    break
                produced += 1
                self.live_tokens += 1
                text += decoder.decode(llm.detokenize([token], special=False))
                cut = min((i for i in (text.find(s) for s in job.stop) if i >= 0), default=-1)
                if cut >= 0:
                    text, finish = text[:cut], "stop"
                if len(text) - hold > sent or finish == "stop":
                    end = len(text) if finish == "stop" else len(text) - hold
                    if end > sent:
                        job.emit("text", text[sent:end])
                        sent = end
                if finish == "stop" or produced >= job.max_tokens or llm.n_tokens + 1 >= self.n_ctx:
                    break
        finally:
            self.live_tokens = 0
        if finish != "stop" and len(text) > sent:
            job.emit("text", text[sent:])
        self._save(job.salt)
        self.counts["generation"] += produced
        self.counts[finish] += 1
        n = len(job.tokens)
        usage = {
            "prompt_tokens": n,
            "completion_tokens": produced,
            "total_tokens": n + produced,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        job.emit("end", "length" if finish == "abort" else finish, usage)

    def reset(self, cache_bytes: int | None) -> int:
        with self.guard:
            self.cache = llama_cpp.LlamaRAMCache(capacity_bytes=cache_bytes or self.cache.capacity_bytes)
            self.llm.reset()
            self.live_salt = None
            return int(self.cache.capacity_bytes)

    def metrics(self, name: str) -> str:
        label = f'{{model_name="{name}"}}'
        c = self.counts
        rows = [
            ("vllm:num_requests_running", "gauge", self.running),
            ("vllm:num_requests_waiting", "gauge", self.queue.qsize()),
            ("vllm:kv_cache_usage_perc", "gauge", round(self.live_tokens / self.n_ctx, 4)),  # running only
            ("vllm:prompt_tokens_total", "counter", c["prompt"]),
            ("vllm:generation_tokens_total", "counter", c["generation"]),
            ("vllm:prefix_cache_queries_total", "counter", c["prompt"]),
            ("vllm:prefix_cache_hits_total", "counter", c["hits"]),
            ("replica_prefix_cache_bytes", "gauge", self.cache.cache_size),
            ("replica_prefix_cache_capacity_bytes", "gauge", self.cache.capacity_bytes),
        ]
        out = [f"# TYPE {n} {t}\n{n}{label} {v}" for n, t, v in rows]
        out.append("# TYPE vllm:request_success_total counter")
        out += [
            f'vllm:request_success_total{{model_name="{name}",finished_reason="{r}"}} {c[r]}'
            for r in ("stop", "length", "abort")
        ]
        return "\n".join(out) + "\n"


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts: the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def build(engine: Engine, name: str) -> Litestar:
    def error(status: int, message: str) -> Response[dict[str, Any]]:
        kind = "NotFoundError" if status == 404 else "BadRequestError"
        body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
        return Response(body, status_code=status)

    def job_of(body: dict[str, Any], chat: bool) -> Job:
        if body.get("model") not in (None, name):
            raise BadRequest(f"The model `{body.get('model')}` does not exist.", 404)
        if chat:
            if not isinstance(body.get("messages"), list) or not body["messages"]:
                raise BadRequest("messages must be a non-empty list")
            tokens = engine.chat_tokens(body["messages"], continue_final=bool(body.get("continue_final_message")))
        else:
            tokens = engine.prompt_tokens(body.get("prompt"))
        if not tokens:
            raise BadRequest("the prompt is empty")
        room = engine.n_ctx - len(tokens)
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or room
        if room <= 0 or int(limit) > room:
            raise BadRequest(
                f"This model's maximum context length is {engine.n_ctx} tokens. However, you "
                f"requested {len(tokens) + int(limit)} tokens ({len(tokens)} in the prompt)."
            )
        stop = body.get("stop") or []
        temperature = body.get("temperature")
        return Job(
            tokens=tokens,
            max_tokens=int(limit),
            temperature=1.0 if temperature is None else float(temperature),
            top_p=float(body.get("top_p") or 1.0),
            seed=body.get("seed"),
            stop=[stop] if isinstance(stop, str) else list(stop),
            salt=body.get("cache_salt"),
            loop=asyncio.get_running_loop(),
        )

    def shape(chat: bool, rid: str, text: str | None, finish: str | None, delta: bool) -> dict[str, Any]:
        if not chat:
            choice: dict[str, Any] = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        elif delta:
            choice = {
                "index": 0,
                "delta": {} if text is None else {"content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        kind = ("chat.completion.chunk" if delta else "chat.completion") if chat else "text_completion"
        return {"id": rid, "object": kind, "created": int(time.time()), "model": name, "choices": [choice]}

    async def stream(job: Job, chat: bool, rid: str, with_usage: bool) -> AsyncIterator[bytes]:
        def sse(obj: dict[str, Any]) -> bytes:
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        try:
            first = True
            while True:
                event = await job.events.get()
                if event[0] == "error":
                    yield sse({"error": {"message": event[1], "type": "InternalServerError", "code": 500}})
                    break
                if chat and first:  # the role first, with the first token, as vLLM sends it
                    first = False
                    role = shape(chat, rid, None, None, True)
                    role["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                    yield sse(role)
                if event[0] == "text":
                    yield sse(shape(chat, rid, event[1], None, True))
                    continue
                yield sse(shape(chat, rid, None if chat else "", event[1], True))
                if with_usage:
                    yield sse({**shape(chat, rid, None, None, True), "choices": [], "usage": event[2]})
                yield b"data: [DONE]\n\n"
                break
        finally:
            job.cancelled = True  # a client gone mid-answer stops the generation

    async def generation(request: Request[Any, Any, Any], chat: bool) -> Response[Any] | Stream:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            job = job_of(body, chat)
        except BadRequest as exc:
            return error(exc.status, str(exc))
        except (ValueError, TypeError) as exc:
            return error(400, f"bad request: {exc}")
        rid = ("chatcmpl-" if chat else "cmpl-") + (request.headers.get("x-request-id") or uuid.uuid4().hex)
        engine.queue.put_nowait(job)
        if body.get("stream"):
            with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return Stream(stream(job, chat, rid, with_usage), media_type="text/event-stream")
        parts: list[str] = []
        try:
            while (event := await job.events.get())[0] == "text":
                parts.append(event[1])
        finally:
            job.cancelled = True
        if event[0] == "error":
            return error(500, event[1])
        return Response({**shape(chat, rid, "".join(parts), event[1], False), "usage": event[2]})

    @post("/v1/chat/completions", status_code=200)
    async def chat(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
        return await generation(request, True)

    @post("/v1/completions", status_code=200)
    async def completions(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
        return await generation(request, False)

    @get("/health", sync_to_thread=False)
    def health() -> Response[str]:
        return Response("", status_code=200)

    @get("/v1/models", sync_to_thread=False)
    def models() -> dict[str, Any]:
        card = {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "laneway-bench",
            "root": name,
            "max_model_len": engine.n_ctx,
        }
        return {"object": "list", "data": [card]}

    @get("/metrics", sync_to_thread=False, media_type="text/plain; version=0.0.4")
    def metrics() -> str:
        return engine.metrics(name)

    @get("/stats", sync_to_thread=False)
    def stats() -> dict[str, Any]:
        keys = list(engine.cache.cache_state)
        return {
            "cache_bytes": engine.cache.cache_size,
            "capacity_bytes": engine.cache.capacity_bytes,
            "entries": [len(k) - 1 for k in keys],
            "counts": engine.counts,
        }

    @post("/tokenize", status_code=200)
    async def tokenize(request: Request[Any, Any, Any]) -> dict[str, Any]:
        body = await request.json()
        tokens = engine.chat_tokens(body["messages"]) if "messages" in body else engine.prompt_tokens(body["prompt"])
        return {"count": len(tokens), "max_model_len": engine.n_ctx, "tokens": tokens}

    @post("/reset", status_code=200)
    async def reset(request: Request[Any, Any, Any]) -> dict[str, Any]:
        body = await request.json() if await request.body() else {}
        size = await asyncio.get_running_loop().run_in_executor(None, engine.reset, body.get("cache_bytes"))
        return {"capacity_bytes": size}

    return Litestar([chat, completions, health, models, metrics, stats, tokenize, reset])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--served-name", default="smollm2")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-batch", type=int, default=256)
    ap.add_argument("--cache-bytes", type=int, default=256 << 20, help="the prefix cache's capacity")
    args = ap.parse_args()
    engine = Engine(
        args.model, n_ctx=args.n_ctx, threads=args.threads, n_batch=args.n_batch, cache_bytes=args.cache_bytes
    )
    uvicorn.run(build(engine, args.served_name), host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
