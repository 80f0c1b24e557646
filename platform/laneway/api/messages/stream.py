"""The pipeline's deltas as an Anthropic Message and, for a stream, its events in Anthropic's
order: message_start, ping, then per content block content_block_start, content_block_delta
(text_delta | input_json_delta)..., content_block_stop; then message_delta (the stop reason
and the usage) and message_stop. A failure after the stream started is an `error` event.

One MessageAssembler serves both: fed every delta, it builds the content blocks (text, and a
tool_use block per tool call) and, when streaming, the events that announce them. A block
closes when the next one opens or the generation ends."""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from laneway.api.messages import protocol as mp
from laneway.api.messages.errors import error_event
from laneway.api.sse import named_event
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import Call
from laneway.types import Delta, ToolCall


def stop_reason(call: Call, asked: Collection[str]) -> tuple[mp.StopReason, str | None]:
    """Anthropic's stop reason for how the generation ended, and the stop sequence that ended
    it. `stop_sequence` is one of the request's own `stop_sequences`, where laneway saw it (an
    engine that stops on it and hides it, as vLLM does, reads as end_turn); a stop string of
    the model's or of the task's policy ends the turn, as does an early stop (the answer was
    done)."""
    reason = call.finish_reason
    if reason == "length":
        return "max_tokens", None
    if reason == "tool_calls":
        return "tool_use", None
    if reason == "stop" and call.stop_sequence is not None and call.stop_sequence in asked:
        return "stop_sequence", call.stop_sequence
    return "end_turn", None


def usage(call: Call) -> mp.AnthropicUsage:
    return mp.AnthropicUsage(input_tokens=call.prompt_tokens, output_tokens=call.completion_tokens)


def tool_input(arguments: str) -> dict[str, object]:
    """A call's arguments as the object Anthropic's `input` is; {} when the engine's text is not
    one (a call cut by max_tokens: the stop reason says so)."""
    try:
        value = msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


_TEXT_DELTA_HEAD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
_TEXT_DELTA_MID = b',"delta":{"type":"text_delta","text":'


def text_delta_event(index: int, text: str) -> bytes:
    """`ContentBlockDelta(index, TextDelta(text))` framed as its event, byte for byte what
    `named_event` makes of it (a test holds them equal), for a fraction of its CPU: this is the
    one event a stream sends per token."""
    return b"".join((_TEXT_DELTA_HEAD, str(index).encode(), _TEXT_DELTA_MID, msgspec.json.encode(text), b"}}\n\n"))


class _Block:
    """A content block being generated: its place in `content`, its text or arguments so far."""

    __slots__ = ("index", "pieces", "tool")

    def __init__(self, index: int, tool: ToolCall | None) -> None:
        self.index = index
        self.tool = tool
        self.pieces: list[str] = []

    def block(self) -> mp.ContentBlock:
        text = "".join(self.pieces)
        if self.tool is None:
            return mp.AnthropicTextBlock(text=text)
        return mp.AnthropicToolUseBlock(id=self.tool.id, name=self.tool.name, input=tool_input(text))


class MessageAssembler:
    def __init__(self, call: Call, *, stream: bool, stop_sequences: Collection[str] = ()) -> None:
        self.call = call
        self.stop_sequences = stop_sequences
        self.stream = stream
        self.blocks: list[_Block] = []
        self._open: _Block | None = None
        self._tools: dict[int, _Block] = {}  # by ToolCall.index
        self._frames: list[bytes] = []

    def _emit(self, event: mp.StreamEvent) -> None:
        if self.stream:
            self._frames.append(named_event(str(type(event).__struct_config__.tag), event))

    def _take(self) -> list[bytes]:
        frames, self._frames = self._frames, []
        return frames

    def message(self, *, final: bool) -> mp.AnthropicMessage:
        call = self.call
        reason, sequence = stop_reason(call, self.stop_sequences) if final else (None, None)
        return mp.AnthropicMessage(
            id=call.request_id,
            model=call.public_model,
            content=[b.block() for b in self.blocks] if final else [],
            stop_reason=reason,
            stop_sequence=sequence,
            usage=usage(call) if final else mp.AnthropicUsage(input_tokens=call.prompt_tokens, output_tokens=0),
        )

    def start(self) -> bytes:
        self._emit(mp.MessageStart(message=self.message(final=False)))
        self._emit(mp.Ping())
        return b"".join(self._take())

    def feed(self, delta: Delta) -> list[bytes]:
        """One delta in; the events it makes out (none unless streaming)."""
        if delta.index == 0:  # Anthropic has one answer per request (n is never above 1 here)
            if delta.text:
                block = self._open if self._open is not None and self._open.tool is None else self._add(None)
                block.pieces.append(delta.text)
                if self.stream:  # the per-token event: framed around the text, no structs built
                    self._frames.append(text_delta_event(block.index, delta.text))
            for fragment in delta.tool_calls:
                self._tool_call(fragment)
            if delta.finish_reason is not None:
                self._finish()
        return self._take()

    def _add(self, tool: ToolCall | None) -> _Block:
        self._close()
        block = self._open = _Block(len(self.blocks), tool)
        self.blocks.append(block)
        empty: mp.ContentBlock = (
            mp.AnthropicTextBlock(text="")
            if tool is None
            else mp.AnthropicToolUseBlock(id=tool.id, name=tool.name, input={})
        )
        self._emit(mp.ContentBlockStart(index=block.index, content_block=empty))
        return block

    def _close(self) -> None:
        if self._open is not None:
            self._emit(mp.ContentBlockStop(index=self._open.index))
            self._open = None

    def _tool_call(self, fragment: ToolCall) -> None:
        block = self._tools.get(fragment.index)
        if block is None:
            block = self._tools[fragment.index] = self._add(fragment)
        if fragment.arguments:
            block.pieces.append(fragment.arguments)
            self._emit(
                mp.ContentBlockDelta(index=block.index, delta=mp.InputJsonDelta(partial_json=fragment.arguments))
            )

    def _finish(self) -> None:
        self._close()
        call = self.call
        reason, sequence = stop_reason(call, self.stop_sequences)
        body = mp.MessageDeltaBody(stop_reason=reason, stop_sequence=sequence)
        self._emit(
            mp.MessageDelta(
                delta=body, usage=mp.DeltaUsage(output_tokens=call.completion_tokens, input_tokens=call.prompt_tokens)
            )
        )
        self._emit(mp.MessageStop())

    def failed(self, error: GatewayError) -> bytes:
        """A failure mid-stream: Anthropic's `error` event (its SDKs raise it)."""
        return error_event(error.status, error.message)
