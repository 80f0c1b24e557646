"""From the pipeline's deltas to OpenAI's choices: collected whole for a JSON answer, or
rendered chunk by chunk for a stream. A delta belongs to choice `index` (n > 1); tool calls
arrive complete or as fragments (ToolCall.index orders them, the first has id and name)."""

from __future__ import annotations

from dataclasses import dataclass, field

from laneway.api import protocol as p
from laneway.types import Delta, TokenLogprob, ToolCall


@dataclass
class _Call:
    id: str
    name: str
    arguments: list[str]


@dataclass
class CollectedChoice:
    text: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, d: Delta) -> None:
        if d.text:
            self.text.append(d.text)
        for c in d.tool_calls:
            known = self.calls.get(c.index)
            if known is None:
                self.calls[c.index] = _Call(c.id, c.name, [c.arguments])
            else:
                known.arguments.append(c.arguments)
        self.logprobs.extend(d.logprobs)
        if d.finish_reason is not None:
            self.finish_reason = d.finish_reason


class Collected:
    """Every choice of a non-streaming answer."""

    def __init__(self, n: int) -> None:
        self.choices = [CollectedChoice() for _ in range(n)]

    @classmethod
    def of(cls, n: int, deltas: list[Delta]) -> Collected:
        collected = cls(n)
        for d in deltas:
            collected.add(d)
        return collected

    def add(self, d: Delta) -> None:
        if 0 <= d.index < len(self.choices):
            self.choices[d.index].add(d)


def tool_calls_out(calls: dict[int, _Call]) -> list[p.ToolCallOut] | None:
    if not calls:
        return None
    return [
        p.ToolCallOut(id=c.id, function=p.FunctionCallOut(name=c.name, arguments="".join(c.arguments)))
        for _, c in sorted(calls.items())
    ]


def token_logprobs(items: list[TokenLogprob] | tuple[TokenLogprob, ...]) -> list[p.TokenLogprobOut]:
    return [
        p.TokenLogprobOut(
            token=t.token,
            logprob=t.logprob,
            bytes=list(t.bytes) if t.bytes is not None else None,
            top_logprobs=[
                p.TopLogprobOut(token=a.token, logprob=a.logprob, bytes=list(a.bytes) if a.bytes is not None else None)
                for a in t.top
            ],
        )
        for t in items
    ]


def chat_choices(collected: Collected, want_logprobs: bool) -> list[p.ChatChoice]:
    out = []
    for i, c in enumerate(collected.choices):
        calls = tool_calls_out(c.calls)
        text = "".join(c.text)
        message = p.ChatMessageOut(role="assistant", content=text if text or not calls else None, tool_calls=calls)
        logprobs = p.ChoiceLogprobs(content=token_logprobs(c.logprobs)) if want_logprobs else None
        out.append(p.ChatChoice(index=i, message=message, finish_reason=c.finish_reason, logprobs=logprobs))
    return out


def completion_logprobs(items: list[TokenLogprob] | tuple[TokenLogprob, ...], offset: int) -> p.CompletionLogprobs:
    """The legacy shape; text_offset counts characters from the start of the returned text."""
    offsets = []
    for t in items:
        offsets.append(offset)
        offset += len(t.token)
    return p.CompletionLogprobs(
        tokens=[t.token for t in items],
        token_logprobs=[t.logprob for t in items],
        top_logprobs=[{a.token: a.logprob for a in t.top} for t in items],
        text_offset=offsets,
    )


def completion_choices(collected: Collected, echo: str, want_logprobs: bool) -> list[p.CompletionChoice]:
    return [
        p.CompletionChoice(
            index=i,
            text=echo + "".join(c.text),
            finish_reason=c.finish_reason,
            logprobs=completion_logprobs(c.logprobs, len(echo)) if want_logprobs else None,
        )
        for i, c in enumerate(collected.choices)
    ]


def tool_call_chunks(calls: tuple[ToolCall, ...]) -> list[p.ToolCallChunk] | None:
    """Stream fragments as the SDKs' stream helpers accumulate them: id, type and name on a
    call's first fragment, then arguments only."""
    if not calls:
        return None
    return [
        p.ToolCallChunk(
            index=c.index,
            id=c.id or None,
            type="function" if c.id else None,
            function=p.FunctionCallChunk(name=c.name or None, arguments=c.arguments),
        )
        for c in calls
    ]


class CompletionOffsets:
    """text_offset across a stream's chunks, per choice."""

    def __init__(self, n: int, start: int) -> None:
        self._at = [start] * n

    def logprobs(self, d: Delta) -> p.CompletionLogprobs:
        out = completion_logprobs(d.logprobs, self._at[d.index])
        self._at[d.index] += sum(len(t.token) for t in d.logprobs)
        return out
