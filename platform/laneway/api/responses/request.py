"""The Responses API's request as chat: its input items become chat turns (instructions first,
as a system turn), its tools and text format chat's, and what a stateless gateway cannot do
is refused by name (400 unsupported_parameter)."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from laneway.api.request import unsupported
from laneway.api.responses import protocol as rp
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, invalid_request, validation_error
from laneway.types import ChatTurn, ToolCall

T = TypeVar("T")


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
    """The GenerationIntent fields beyond plain text: function tools and JSON
    output in the chat shapes; the pipeline's capability check refuses an engine that lacks one.
    Tool history in `input` needs no capability: every engine renders it (as text if need be)."""
    del turns
    return {
        "tools": list(tools),
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel_tool_calls is not False,
        "response_format": response_format,
    }
