"""A fake OpenAI-protocol engine that answers at once, for measuring what the gateway itself costs.

Plain asyncio + httptools (no framework), so that it is not the bottleneck: it serves
/v1/completions and /v1/chat/completions (a JSON answer, or an SSE stream of --chunks
chunks with a usage chunk and [DONE]), /tokenize, /v1/models, /health and /metrics, with
keep-alive. Every answer is the same few words; no time is spent generating.

Run: .venv/bin/python bench/upstream.py --port 9100 [--chunks 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import httptools

WORD = " word"


def _response(status: bytes, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def _stream_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class Answers:
    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        usage = {"prompt_tokens": 4, "completion_tokens": chunks, "total_tokens": chunks + 4}
        text = WORD * chunks
        self.completion = _response(
            b"200 OK",
            json.dumps(
                {
                    "id": "cmpl-up",
                    "object": "text_completion",
                    "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                    "usage": usage,
                }
            ).encode(),
        )
        self.chat = _response(
            b"200 OK",
            json.dumps(
                {
                    "id": "chatcmpl-up",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "m",
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                    ],
                    "usage": usage,
                }
            ).encode(),
        )
        self.tokenize = _response(b"200 OK", b'{"count": 4, "max_model_len": 100000, "tokens": [1, 2, 3, 4]}')
        self.models = _response(b"200 OK", b'{"object": "list", "data": [{"id": "m", "object": "model"}]}')
        self.health = _response(b"200 OK", b"")
        self.metrics = _response(b"200 OK", b"vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n", b"text/plain")
        self.not_found = _response(b"404 Not Found", b'{"error": {"message": "not found"}}')

        def events(chat: bool) -> bytes:
            out = []
            token: dict[str, Any] = {"index": 0, "delta": {"content": WORD}} if chat else {"index": 0, "text": WORD}
            for _ in range(chunks):
                out.append(b"data: " + json.dumps({"id": "up", "choices": [token]}).encode() + b"\n\n")
            end: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            end.update({"delta": {}} if chat else {"text": ""})
            out.append(b"data: " + json.dumps({"id": "up", "choices": [end]}).encode() + b"\n\n")
            out.append(b"data: " + json.dumps({"id": "up", "choices": [], "usage": usage}).encode() + b"\n\n")
            out.append(b"data: [DONE]\n\n")
            return _stream_head() + b"".join(_chunk(e) for e in out) + b"0\r\n\r\n"

        self.completion_stream = events(chat=False)
        self.chat_stream = events(chat=True)

    def answer(self, path: bytes, body: bytes) -> bytes:
        if path in (b"/v1/completions", b"/v1/chat/completions"):
            chat = path == b"/v1/chat/completions"
            stream = b'"stream": true' in body or b'"stream":true' in body
            if stream:
                return self.chat_stream if chat else self.completion_stream
            return self.chat if chat else self.completion
        return {
            b"/tokenize": self.tokenize,
            b"/v1/models": self.models,
            b"/health": self.health,
            b"/metrics": self.metrics,
        }.get(path, self.not_found)


class Protocol(asyncio.Protocol):
    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        path = httptools.parse_url(self.url).path
        self.transport.write(self.answers.answer(path, b"".join(self.body)))
        self.url, self.body = b"", []


async def serve(port: int, chunks: int) -> None:
    answers = Answers(chunks)
    server = await asyncio.get_running_loop().create_server(lambda: Protocol(answers), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=9100)
    ap.add_argument("--chunks", type=int, default=16)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.port, args.chunks))


if __name__ == "__main__":
    main()
