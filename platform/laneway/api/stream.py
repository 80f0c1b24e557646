"""The pipeline's answer back to the wire: a whole JSON body, or an SSE stream that owns the
request's lease until it is sent (api/leased_stream.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from litestar import MediaType, Response
from litestar.response import Stream

from laneway.api import protocol as p
from laneway.api.choices import CompletionOffsets, token_logprobs, tool_call_chunks
from laneway.api.leased_stream import LeasedStream
from laneway.api.services import ApiServices
from laneway.api.sse import DONE, error_event, event
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import Call, Completed, Streaming
from laneway.types import Delta

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def lane_header(call: Call) -> dict[str, str]:
    # X-Request-Id: api/request_ids.py, from the call. The served model differs from the body's
    # `model` (the alias asked for) when a fallback alias served the request.
    return {"X-Laneway-Lane": call.lane.name, "X-Laneway-Served-Model": call.alias}


WANT_PREDICTED_TTFT = "x-laneway-want-predicted-ttft"
PREDICTED_TTFT = "X-Laneway-Predicted-TTFT-Ms"


def predicted_ttft_header(call: Call, asked: Mapping[str, str] | None) -> dict[str, str]:
    """X-Laneway-Predicted-TTFT-Ms, when the request asked for it (X-Laneway-Want-Predicted-TTFT:
    1) and its replica's latency model predicted one: ms from its arrival to its first token, as
    predicted when it took its slot (docs/endpoints.md)."""
    if asked is None or asked.get(WANT_PREDICTED_TTFT, "").strip() not in ("1", "true"):
        return {}
    if call.predicted_ttft_s is None:
        return {}
    return {PREDICTED_TTFT: str(round(call.predicted_ttft_s * 1000))}


def respond(
    api: ApiServices,
    answer: Completed | Streaming,
    body: Callable[[Completed], Any],
    events: Callable[[Streaming], AsyncIterator[bytes]],
    asked: Mapping[str, str] | None = None,
) -> Response[bytes] | Stream:
    """A whole answer as JSON; a stream as SSE, the response taking over the lease. `asked`: the
    request's headers (what it asked to be told)."""
    headers = {**lane_header(answer.call), **predicted_ttft_header(answer.call, asked)}
    if isinstance(answer, Completed):
        return Response(p.encode(body(answer)), media_type=MediaType.JSON, headers=headers)
    return LeasedStream(
        answer.lease, events(answer), headers={**SSE_HEADERS, **headers}, send_timeout_s=api.stream_send_timeout_s
    )


def usage(call: Call) -> p.Usage:
    return p.Usage(
        prompt_tokens=call.prompt_tokens,
        completion_tokens=call.completion_tokens,
        total_tokens=call.prompt_tokens + call.completion_tokens,
    )


async def sse(
    stream: Streaming,
    head: bytes | None,
    render: Callable[[Delta], list[bytes]],
    tail: Callable[[], bytes] | None,
    *,
    fail: Callable[[GatewayError], bytes] | None = None,
    done: bytes = DONE,
) -> AsyncIterator[bytes]:
    """The SSE body every endpoint shares: head, a chunk per delta, usage if asked, `done`
    ([DONE]); a failure mid-stream ends it with `fail`'s frames, by default an error event
    (the SDKs raise it as APIError)."""
    if head:
        yield head
    try:
        async for batch in stream.batches():
            # The deltas that were ready together go out in one write (the same events).
            data = b"".join(frame for d in batch for frame in render(d))
            if data:
                yield data
    except GatewayError as exc:
        yield fail(exc) if fail is not None else error_event(exc.status, exc.message, code=exc.code)
        return
    if tail is not None:
        yield tail()
    if done:
        yield done


def _framer(call: Call, kind: Callable[..., Any]) -> Callable[..., bytes]:
    """An SSE frame maker for one stream: `kind` is ChatCompletionChunk or Completion."""
    created = int(time.time())
    # Read once: the same for every chunk of the stream (a frame is made per token).
    request_id, model, fingerprint = call.request_id, call.public_model, call.fingerprint

    def frame(choices: list[Any], usage: p.Usage | None = None) -> bytes:
        return event(
            kind(
                id=request_id,
                created=created,
                model=model,
                choices=choices,
                system_fingerprint=fingerprint,
                usage=usage,
            )
        )

    return frame


# What no text encodes to: a marker for where a chunk's text goes in its frame's bytes.
_MARK = "\x00laneway-text\x00"
_MARK_JSON = p.encode(_MARK)


class TextFrames:
    """The frames of a stream's text-only chunks (most of its tokens), spliced: the bytes of a
    chunk of choice i around its text are made once per stream (by `make`, with a marker for
    the text), and a token's frame is them around its JSON-encoded text: the same bytes as the
    whole chunk encoded, without a struct per token to build and encode (issue 44)."""

    __slots__ = ("_around", "_make")

    def __init__(self, make: Callable[[int, str], bytes]) -> None:
        self._make = make
        self._around: dict[int, tuple[bytes, bytes] | None] = {}

    def __call__(self, index: int, text: str) -> bytes:
        if index not in self._around:
            whole = self._make(index, _MARK)
            before, mark, after = whole.partition(_MARK_JSON)
            # The marker once, or (an id or model holding it: never seen) no splicing.
            self._around[index] = (before, after) if mark and _MARK_JSON not in after else None
        around = self._around[index]
        if around is None:
            return self._make(index, text)
        return around[0] + p.encode(text) + around[1]


def chat_events(stream: Streaming, include_usage: bool, want_logprobs: bool) -> AsyncIterator[bytes]:
    call = stream.call
    frame = _framer(call, p.ChatCompletionChunk)
    text_frame = TextFrames(lambda i, text: frame([p.ChunkChoice(index=i, delta=p.ChunkDelta(content=text))]))

    def render(d: Delta) -> list[bytes]:
        if d.text and d.finish_reason is None and not d.tool_calls and not want_logprobs:
            return [text_frame(d.index, d.text)]  # a token's text: most of a stream
        out = []
        if d.text or d.tool_calls or (want_logprobs and d.logprobs):
            delta = p.ChunkDelta(content=d.text or None, tool_calls=tool_call_chunks(d.tool_calls))
            logprobs = p.ChoiceLogprobs(content=token_logprobs(d.logprobs)) if want_logprobs else None
            out.append(frame([p.ChunkChoice(index=d.index, delta=delta, logprobs=logprobs)]))
        if d.finish_reason is not None:
            out.append(frame([p.ChunkChoice(index=d.index, delta=p.ChunkDelta(), finish_reason=d.finish_reason)]))
        return out

    # Each choice opens with the assistant role, as OpenAI streams it.
    head = b"".join(
        frame([p.ChunkChoice(index=i, delta=p.ChunkDelta(role="assistant", content=""))])
        for i in range(call.generation.n)
    )
    tail = (lambda: frame([], usage(call))) if include_usage else None
    return sse(stream, head, render, tail)


def completion_events(stream: Streaming, include_usage: bool, echo: str, want_logprobs: bool) -> AsyncIterator[bytes]:
    call = stream.call
    frame = _framer(call, p.Completion)
    offsets = CompletionOffsets(call.generation.n, len(echo))
    text_frame = TextFrames(lambda i, text: frame([p.CompletionChoice(index=i, text=text, finish_reason=None)]))

    def render(d: Delta) -> list[bytes]:
        if not d.text and d.finish_reason is None and not d.logprobs:
            return []
        if d.finish_reason is None and not want_logprobs:
            return [text_frame(d.index, d.text)]  # a token's text: most of a stream
        logprobs = offsets.logprobs(d) if want_logprobs else None
        return [
            frame([p.CompletionChoice(index=d.index, text=d.text, finish_reason=d.finish_reason, logprobs=logprobs)])
        ]

    head = (
        b"".join(frame([p.CompletionChoice(index=i, text=echo, finish_reason=None)]) for i in range(call.generation.n))
        if echo
        else None
    )
    tail = (lambda: frame([], usage(call))) if include_usage else None
    return sse(stream, head, render, tail)
