"""ResponseAssembler: the pipeline's deltas as a Response object's output items and, for a
stream, the Responses API's named events in OpenAI's order."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from laneway.api.responses import protocol as rp
from laneway.api.sse import named_event
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import Call
from laneway.types import Delta, FinishReason, ToolCall


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


@dataclass
class _Open:
    """An output item being generated: its place in `output` and its text so far."""

    index: int
    item: rp.OutputMessage | rp.FunctionCallItem
    pieces: list[str] = field(default_factory=list)


_FINAL_EVENT: dict[rp.ResponseStatus, type[rp.ResponseCompleted | rp.ResponseIncomplete | rp.ResponseFailed]] = {
    "completed": rp.ResponseCompleted,
    "incomplete": rp.ResponseIncomplete,
    "failed": rp.ResponseFailed,
}


class ResponseAssembler:
    """Builds a response's output items from the pipeline's deltas and, when it streams, the
    events that announce them in OpenAI's order: response.created and .in_progress; per item
    output_item.added, (content_part.added, output_text.delta..., output_text.done,
    content_part.done | function_call_arguments.delta..., .done), output_item.done; then
    response.completed (or .incomplete when the output hit max_output_tokens).

    An item closes when the next one opens or the generation ends; each event is encoded as it
    is made, so later changes to an item never leak into an event already produced."""

    def __init__(self, base: rp.ResponseObject, usage: Callable[[], rp.ResponseUsage], *, stream: bool) -> None:
        self.base = base  # the response in progress: id, model, the echoed parameters, no output
        self.usage = usage
        self.stream = stream
        self.output: list[rp.OutputItem] = []
        self.finish_reason: FinishReason | None = None
        self._message: _Open | None = None
        self._calls: dict[int, _Open] = {}  # by ToolCall.index, while open
        self._sequence = 0
        self._frames: list[bytes] = []

    # -- events --
    def _emit(self, event: rp.StreamEvent) -> None:
        if self.stream:
            event.sequence_number = self._sequence
            self._sequence += 1
            self._frames.append(named_event(str(type(event).__struct_config__.tag), event))

    def _take(self) -> list[bytes]:
        frames, self._frames = self._frames, []
        return frames

    def start(self) -> bytes:
        snapshot = self.snapshot("in_progress")
        self._emit(rp.ResponseCreated(response=snapshot))
        self._emit(rp.ResponseInProgress(response=snapshot))
        return b"".join(self._take())

    def feed(self, delta: Delta) -> list[bytes]:
        """One delta in; the events it makes out (none unless streaming)."""
        if delta.text:
            message = self._message or self._open_message()
            message.pieces.append(delta.text)
            self._emit(
                rp.OutputTextDelta(
                    item_id=message.item.id, output_index=message.index, content_index=0, delta=delta.text
                )
            )
        for fragment in delta.tool_calls:
            self._tool_call(fragment)
        if delta.finish_reason is not None:
            self._finish(delta.finish_reason)
        return self._take()

    def failed(self, error: GatewayError) -> bytes:
        """A failure mid-stream: an `error` event with laneway's code, then response.failed."""
        self._emit(rp.ErrorEvent(code=error.code, message=error.message))
        self._close_message("incomplete", announce=False)
        self._close_calls("incomplete", announce=False)
        response = self.snapshot("failed")
        response.error = rp.ResponseError(code=ErrorCode.SERVER_ERROR, message=error.message)
        self._emit(rp.ResponseFailed(response=response))
        return b"".join(self._take())

    # -- items --
    def _add(self, item: rp.OutputMessage | rp.FunctionCallItem) -> _Open:
        opened = _Open(len(self.output), item)
        self.output.append(item)
        self._emit(rp.OutputItemAdded(output_index=opened.index, item=item))
        return opened

    def _open_message(self) -> _Open:
        self._close_calls("completed")
        message = self._message = self._add(rp.OutputMessage(id=new_id("msg_"), status="in_progress", content=[]))
        part = rp.OutputText(text="")
        self._emit(rp.ContentPartAdded(item_id=message.item.id, output_index=message.index, content_index=0, part=part))
        assert isinstance(message.item, rp.OutputMessage)
        message.item.content.append(part)
        return message

    def _close_message(self, status: rp.ItemStatus, *, announce: bool = True) -> None:
        message, self._message = self._message, None
        if message is None:
            return
        item = message.item
        assert isinstance(item, rp.OutputMessage)
        part = item.content[0]
        part.text = "".join(message.pieces)
        item.status = status
        if announce:
            self._emit(rp.OutputTextDone(item_id=item.id, output_index=message.index, content_index=0, text=part.text))
            self._emit(rp.ContentPartDone(item_id=item.id, output_index=message.index, content_index=0, part=part))
            self._emit(rp.OutputItemDone(output_index=message.index, item=item))

    def _tool_call(self, fragment: ToolCall) -> None:
        call = self._calls.get(fragment.index)
        if call is None:
            self._close_message("completed")
            item = rp.FunctionCallItem(
                id=new_id("fc_"),
                call_id=fragment.id or new_id("call_"),
                name=fragment.name,
                arguments="",
                status="in_progress",
            )
            call = self._calls[fragment.index] = self._add(item)
        if fragment.arguments:
            call.pieces.append(fragment.arguments)
            self._emit(
                rp.FunctionCallArgumentsDelta(item_id=call.item.id, output_index=call.index, delta=fragment.arguments)
            )

    def _close_calls(self, status: rp.ItemStatus, *, announce: bool = True) -> None:
        for call in sorted(self._calls.values(), key=lambda c: c.index):
            item = call.item
            assert isinstance(item, rp.FunctionCallItem)
            item.arguments = "".join(call.pieces)
            item.status = status
            if announce:
                done = rp.FunctionCallArgumentsDone(item_id=item.id, output_index=call.index, arguments=item.arguments)
                self._emit(done)
                self._emit(rp.OutputItemDone(output_index=call.index, item=item))
        self._calls.clear()

    def _finish(self, reason: FinishReason) -> None:
        self.finish_reason = reason
        status = self.status
        item_status: rp.ItemStatus = "incomplete" if status == "incomplete" else "completed"
        if not self.output:  # nothing generated: still one (empty) message, as chat has one
            self._open_message()
        self._close_message(item_status)
        self._close_calls(item_status)
        response = self.response()
        self._emit(_FINAL_EVENT[status](response=response))

    # -- the response object --
    @property
    def status(self) -> rp.ResponseStatus:
        if self.finish_reason is None:
            return "in_progress"
        if self.finish_reason == "length":
            return "incomplete"
        return "completed" if self.finish_reason in ("stop", "tool_calls") else "failed"

    def snapshot(self, status: rp.ResponseStatus) -> rp.ResponseObject:
        return msgspec.structs.replace(self.base, status=status, output=list(self.output))

    def response(self) -> rp.ResponseObject:
        """The whole response, once the generation has finished."""
        status = self.status
        response = self.snapshot(status)
        response.usage = self.usage()
        if status == "incomplete":
            response.incomplete_details = rp.IncompleteDetails(reason="max_output_tokens")
        elif status == "failed":
            response.error = rp.ResponseError(
                code=ErrorCode.SERVER_ERROR, message=f"The generation ended: {self.finish_reason}."
            )
        else:
            response.completed_at = int(time.time())
        return response


def response_usage(call: Call) -> rp.ResponseUsage:
    return rp.ResponseUsage(
        input_tokens=call.prompt_tokens,
        output_tokens=call.completion_tokens,
        total_tokens=call.prompt_tokens + call.completion_tokens,
    )


def in_progress(call: Call, req: rp.ResponsesRequest, fmt: dict[str, Any]) -> rp.ResponseObject:
    """The response before any output: its id, model and the parameters it echoes."""
    return rp.ResponseObject(
        id=call.request_id,
        created_at=int(time.time()),
        status="in_progress",
        model=call.public_model,
        output=[],
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        metadata=req.metadata or {},
        parallel_tool_calls=True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        temperature=call.generation.temperature,
        top_p=call.generation.top_p,
        tool_choice=req.tool_choice or "auto",
        tools=req.tools or [],
        text={**(req.text or {}), "format": fmt},
        user=req.user,
    )
