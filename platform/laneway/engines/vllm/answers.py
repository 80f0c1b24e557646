"""vLLM's answers, as the adapter reads them: the JSON of a whole answer, each SSE chunk of a
stream, embeddings, and a refusal's error (msgspec decodes only the parts read here)."""

from __future__ import annotations

from typing import Any

import msgspec

from laneway.engines.base import EngineError, EngineRequestError
from laneway.types import Delta, FinishReason, TokenLogprob, ToolCall, TopLogprob

FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "cancelled",
    "tool_calls": "tool_calls",
}


# The parts of vLLM's answers the adapter reads (msgspec ignores the rest).
class Usage(msgspec.Struct):
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


class Choice(msgspec.Struct):
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


class Chunk(msgspec.Struct):
    choices: list[Choice] = []
    usage: Usage | None = None
    error: Any = None


class Embedding(msgspec.Struct):
    index: int
    embedding: list[float]


class EmbeddingList(msgspec.Struct):
    data: list[Embedding] = []
    usage: Usage | None = None


decode_chunk = msgspec.json.Decoder(Chunk).decode
decode_embeddings = msgspec.json.Decoder(EmbeddingList).decode


class _ErrorBody(msgspec.Struct):
    message: str = ""


class _ErrorAnswer(msgspec.Struct):
    error: _ErrorBody | None = None


_decode_error = msgspec.json.Decoder(_ErrorAnswer).decode


def refused(status: int, body: bytes) -> EngineError:
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


def answer_deltas(answer: Chunk) -> list[Delta]:
    """A whole (non-streamed) answer as one delta per choice; the usage goes with the last."""
    if answer.error is not None:
        raise EngineError(f"vLLM error: {answer.error}")
    usage = answer.usage or Usage()
    choices = sorted(answer.choices, key=lambda c: c.index) or [Choice()]
    out = []
    for k, choice in enumerate(choices):
        last = k == len(choices) - 1
        out.append(
            Delta(
                text=choice.content(),
                tokens=usage.completion_tokens if last else 0,
                finish_reason=FINISH.get(choice.finish_reason or "", "length"),
                prompt_tokens=(usage.prompt_tokens or None) if last else None,
                index=choice.index,
                tool_calls=choice.calls(),
                logprobs=choice.token_logprobs(),
            )
        )
    return out


class StreamReader:
    """vLLM's SSE stream, read as it arrives: `feed` gives the deltas in what arrived (a delta
    per chunk of a choice: text, tool-call fragments, logprobs), `end` each choice's finish, the
    last with the usage chunk's counts (authoritative: chunks and tokens need not be one to
    one). Plain calls, no generator of its own: the engine's generate() yields the deltas, one
    hop per token fewer (issue 44)."""

    __slots__ = ("counted", "done", "error", "finish", "rest", "usage")

    def __init__(self) -> None:
        self.counted = 0
        self.finish: dict[int, FinishReason] = {}
        self.usage: Usage | None = None
        self.rest = b""  # a line not complete yet
        self.done = False  # [DONE] came
        self.error: EngineError | None = None  # an error chunk came: raised after the deltas before it

    def feed(self, received: bytes) -> list[Delta]:
        """The deltas in what arrived, split into lines here: one await per network read, where
        readline() costs one per line (two per event, with the blank line between events)."""
        out: list[Delta] = []
        *lines, self.rest = (self.rest + received).split(b"\n")
        for line in lines:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                self.done = True
                break
            chunk = decode_chunk(data)
            if chunk.error is not None:
                self.error = EngineError(f"vLLM error: {chunk.error}")
                break
            if chunk.usage is not None:
                self.usage = chunk.usage
            for choice in chunk.choices:
                said = choice.delta
                if said is not None and choice.logprobs is None and not said.tool_calls:
                    # The common chunk (a token of text): read as content() would, with less per token.
                    text = choice.text if choice.text is not None else (said.content or "")
                    if text:
                        self.counted += 1
                        out.append(Delta(text, 1, None, None, choice.index))
                else:
                    text, calls, logprobs = choice.content(), choice.calls(), choice.token_logprobs()
                    if text or calls or logprobs:
                        self.counted += 1
                        out.append(Delta(text=text, tokens=1, index=choice.index, tool_calls=calls, logprobs=logprobs))
                if choice.finish_reason:
                    self.finish[choice.index] = FINISH.get(choice.finish_reason, "stop")
        return out

    def end(self, n: int) -> list[Delta]:
        """Each of the `n` choices' last delta, once the stream ended."""
        if not self.done and not self.finish:  # the connection ended mid-answer: a cut, never a short answer
            raise EngineError("vLLM's stream ended before its end")
        usage, counted, finish = self.usage, self.counted, self.finish
        total = usage.completion_tokens if usage is not None and usage.completion_tokens else counted
        prompt = usage.prompt_tokens if usage is not None and usage.prompt_tokens else None
        out = [Delta(text="", tokens=0, finish_reason=finish.get(i, "length"), index=i) for i in range(n - 1)]
        out.append(
            Delta(
                text="",
                tokens=max(0, total - counted),
                finish_reason=finish.get(n - 1, "length"),
                prompt_tokens=prompt,
                index=n - 1,
            )
        )
        return out
