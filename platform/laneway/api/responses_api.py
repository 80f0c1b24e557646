"""POST /v1/responses: OpenAI's Responses API on the chat pipeline.

A request becomes chat turns (instructions first, as a system turn) and runs exactly as a chat
completion does: the same auth, rate limits, lanes, admission, lease and usage row (endpoint
"responses"), through the chat path's helpers in api/routes.py. What differs is the wire: the
answer is a Response object, and a stream is the Responses API's named events, built from the
pipeline's deltas by ResponseAssembler.

laneway is stateless: nothing is stored, so `previous_response_id`, `conversation` and stored
prompts are refused (400 unsupported_parameter), and every response says `store: false`.
"""

from __future__ import annotations

import time
import typing
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from litestar import Controller, Request, Response, post
from litestar.response import Stream

from laneway.api import openapi
from laneway.api import responses_protocol as rp
from laneway.api.errors import validation_error
from laneway.api.routes import _decode, _hints, _respond, _stream_events, authenticate, unsupported
from laneway.api.services import Api
from laneway.api.sse import named_event
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, invalid_request
from laneway.core.pipeline import Call, Gateway, Lease
from laneway.types import ChatTurn, Delta, FinishReason, ToolCall

T = TypeVar("T")

# ---- request -> chat turns, tools and checks -------------------------------------------------


def _refuse(param: str, why: str) -> GatewayError:
    return invalid_request(
        f"`{param}` is not supported: {why}; the request was not run.",
        param=param,
        code=ErrorCode.UNSUPPORTED_PARAMETER,
    )


_STATELESS = "laneway stores no responses or conversations; send the whole conversation in `input`"


def refuse_unsupported(req: rp.ResponsesRequest) -> None:
    """A 400 naming the parameter for what laneway cannot honour, never a 200 that ignored it;
    the values that ask for nothing (reasoning {}, text format "text", truncation "disabled",
    top_logprobs 0) pass, as SDKs and frameworks send them."""
    if req.previous_response_id is not None:
        raise _refuse("previous_response_id", _STATELESS)
    if req.conversation is not None:
        raise _refuse("conversation", _STATELESS)
    if req.prompt is not None:
        raise _refuse("prompt", "stored prompt templates live in OpenAI's dashboard, not here")
    if req.background:
        raise _refuse("background", "a background response must be stored to be fetched later")
    if req.reasoning and any(v is not None for v in req.reasoning.values()):
        raise unsupported("reasoning", "reasoning effort and summaries")
    text = req.text or {}
    if text.get("verbosity") not in (None, "medium"):
        raise unsupported("text.verbosity", "a verbosity other than medium")
    if req.top_logprobs:
        raise unsupported("top_logprobs", "token log probabilities")
    if "message.output_text.logprobs" in (req.include or ()):
        raise unsupported("include", "token log probabilities (message.output_text.logprobs)")
    if req.truncation == "auto":
        raise unsupported("truncation", "dropping input to fit the context (a prompt too long is a 400)")
    if req.moderation is not None:
        raise unsupported("moderation", "moderated responses")
    if req.context_management:
        raise unsupported("context_management", "server-side context compaction")
    if req.stream_options is not None and not req.stream:
        raise invalid_request("stream_options is only allowed when stream is true.", param="stream_options")


def _convert(raw: Any, kind: type[T], param: str) -> T:
    """msgspec.convert with a 400 that names the offending field (e.g. `input[2].call_id`)."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        inner = validation_error(exc).param
        where = param if not inner else param + (inner if inner.startswith("[") else "." + inner)
        raise invalid_request(f"Invalid `{param}`: {exc}", param=where) from None


def _parts_text(content: str | list[rp.InputPart], param: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type in ("input_text", "output_text") and part.text is not None:
            texts.append(part.text)
        elif part.type == "refusal" and part.refusal is not None:
            texts.append(part.refusal)
        else:
            raise unsupported(f"{param}[{j}]", f"'{part.type}' content")
    return "".join(texts)


def input_turns(instructions: str | None, items: str | list[dict[str, Any]]) -> list[ChatTurn]:
    """The chat turns of a request: `instructions` as a system turn first, then the input (a
    string is one user turn). A model's earlier function calls join the assistant turn before
    them (or one of their own), as Chat Completions carries them; a function call's output is a
    tool turn answering its call_id."""
    turns = [ChatTurn(role="system", content=instructions)] if instructions else []
    if isinstance(items, str):
        return [*turns, ChatTurn(role="user", content=items)]
    for i, raw in enumerate(items):
        kind = raw.get("type", "message")
        param = f"input[{i}]"
        if kind == "message":
            message = _convert(raw, rp.InputMessage, param)
            turns.append(ChatTurn(role=message.role, content=_parts_text(message.content, f"{param}.content")))
        elif kind == "function_call":
            fc = _convert(raw, rp.FunctionCallInput, param)
            last = turns[-1] if turns else None
            if last is not None and last.role == "assistant":
                turns.pop()
            else:
                last = ChatTurn(role="assistant", content="")
            call = ToolCall(id=fc.call_id, name=fc.name, arguments=fc.arguments, index=len(last.tool_calls))
            turns.append(ChatTurn(role="assistant", content=last.content, tool_calls=(*last.tool_calls, call)))
        elif kind == "function_call_output":
            out = _convert(raw, rp.FunctionCallOutputInput, param)
            turns.append(
                ChatTurn(role="tool", content=_parts_text(out.output, f"{param}.output"), tool_call_id=out.call_id)
            )
        elif kind == "item_reference":
            raise _refuse(param, "an item reference needs stored items; " + _STATELESS)
        else:
            raise unsupported(f"{param}.type", f"'{kind}' input items")
    if not turns:
        raise invalid_request("`input` must contain at least one item.", param="input")
    return turns


def chat_tools(tools: list[dict[str, Any]] | None) -> tuple[dict[str, Any], ...]:
    """Responses function tools in the Chat Completions shape the pipeline carries
    (GenerationRequest.tools); a hosted tool (web_search, file_search, ...) is refused by name."""
    out = []
    for i, raw in enumerate(tools or ()):
        kind = raw.get("type")
        if kind != "function":  # hosted tools run on OpenAI's servers; a function tool is run by the caller
            raise _refuse(f"tools[{i}].type", f"'{kind}' is a tool OpenAI runs itself; laneway serves function tools")
        tool = _convert(raw, rp.FunctionToolIn, f"tools[{i}]")
        function: dict[str, Any] = {"name": tool.name}
        for key in ("description", "parameters", "strict"):
            if (value := getattr(tool, key)) is not None:
                function[key] = value
        out.append({"type": "function", "function": function})
    return tuple(out)


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """`tool_choice` in the Chat Completions shape: "none" | "auto" | "required" | a named function."""
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request("A function `tool_choice` needs the function's `name`.", param="tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise unsupported("tool_choice", f"a '{kind}' tool choice")


def text_format(text: dict[str, Any] | None) -> dict[str, Any]:
    """The request's `text.format`, as the response echoes it (plain text when absent)."""
    fmt = (text or {}).get("format") or {"type": "text"}
    if not isinstance(fmt, dict):
        raise invalid_request("`text.format` must be an object.", param="text.format")
    return fmt


def chat_response_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    """`text.format` in the Chat Completions `response_format` shape (GenerationRequest's); None
    for plain text."""
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = _convert(fmt, rp.JsonSchemaFormat, "text.format")
        inner: dict[str, Any] = {"name": schema.name, "schema": schema.schema}
        for key in ("description", "strict"):
            if (value := getattr(schema, key)) is not None:
                inner[key] = value
        return {"type": "json_schema", "json_schema": inner}
    raise unsupported("text.format", f"'{kind}' output")


def feature_arguments(
    tools: tuple[dict[str, Any], ...],
    tool_choice: str | dict[str, Any] | None,
    parallel_tool_calls: bool | None,
    response_format: dict[str, Any] | None,
    turns: list[ChatTurn],
) -> dict[str, Any]:
    """The keyword arguments for Gateway.prepare() beyond plain text: function tools and JSON
    output in the chat shapes; prepare()'s capability check refuses an engine that lacks one.
    Tool history in `input` needs no capability: every engine renders it (as text if need be)."""
    del turns
    return {
        "tools": list(tools),
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel_tool_calls is not False,
        "response_format": response_format,
    }


# ---- deltas -> output items and stream events ------------------------------------------------


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
        response.error = rp.ResponseError(code="server_error", message=error.message)
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
                code="server_error", message=f"The generation ended: {self.finish_reason}."
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
        model=call.alias,
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


# ---- the route -------------------------------------------------------------------------------


async def _decode_request(request: Request) -> rp.ResponsesRequest:  # type: ignore[type-arg]
    return await _decode(request, rp.ResponsesRequest)  # an unknown parameter is a 400 naming it


# Chat Completions parameter -> the Responses API's name for it.
_RESPONSES_PARAM = {"messages": "input", "response_format": "text.format", "max_tokens": "max_output_tokens"}


def _events(gateway: Gateway, lease: Lease, assembler: ResponseAssembler) -> AsyncIterator[bytes]:
    # Named events, no [DONE] (OpenAI sends none on this API); a failure ends with response.failed.
    return _stream_events(gateway, lease, assembler.start(), assembler.feed, None, fail=assembler.failed, done=b"")


class ResponsesController(Controller):
    path = "/v1"

    @post(
        "/responses",
        status_code=200,
        operation_class=openapi.generation(
            rp.ResponseObject, rp.ResponsesRequest, stream_events=typing.get_args(rp.StreamEvent)
        ),
    )
    async def create_response(self, request: Request, api: Api) -> Response[bytes] | Stream:  # type: ignore[type-arg]
        gateway = api.gateway
        tenant = await authenticate(request, api.authenticator)
        req = await _decode_request(request)
        refuse_unsupported(req)
        turns = input_turns(req.instructions, req.input)
        fmt = text_format(req.text)
        features = feature_arguments(
            chat_tools(req.tools),
            chat_tool_choice(req.tool_choice),
            req.parallel_tool_calls,
            chat_response_format(fmt),
            turns,
        )
        hints = _hints(request, req)
        hints["task"] = hints["task"] or "chat"  # a Responses request is a chat: the chat task policy applies
        try:
            call = await gateway.prepare(
                tenant,
                endpoint="responses",
                alias=req.model,
                stream=req.stream,
                messages=turns,
                max_tokens=req.max_output_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                **features,
                **hints,
            )
        except GatewayError as exc:  # the pipeline names chat's parameters: name this API's
            exc.param = _RESPONSES_PARAM.get(exc.param or "", exc.param)
            raise
        assembler = ResponseAssembler(in_progress(call, req, fmt), lambda: response_usage(call), stream=req.stream)

        def body(deltas: list[Delta]) -> rp.ResponseObject:
            for delta in deltas:
                assembler.feed(delta)
            return assembler.response()

        return await _respond(request, api, call, lambda lease: _events(gateway, lease, assembler), body)
