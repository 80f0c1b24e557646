"""Tool calls and JSON output for engines that decode text themselves (llama.cpp).

The model sees the tools as a system turn that asks for a JSON answer; when a call is
required (tool_choice "required" or a named function) decoding is constrained by a JSON
schema grammar, so the answer always parses. With "auto" the model may answer in text: an
answer that parses as a call to one of the tools becomes a tool call, anything else stays
text. Earlier tool calls and tool results in the history are rendered back as text turns.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any

from laneway.types import ChatTurn, ToolCall

TOOLS_INSTRUCTION = (
    "Functions you can call, with JSON schemas of their arguments:\n{tools}\n"
    'To call one, answer with only JSON: {{"name": <function name>, "arguments": <arguments>}}'
    " (a JSON array of these for several calls)."
)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return dict(tool.get("function") or {})


def _parameters(fn: dict[str, Any]) -> dict[str, Any]:
    return dict(fn.get("parameters") or {"type": "object", "properties": {}})


def offered(tools: Sequence[dict[str, Any]], tool_choice: str | dict[str, Any] | None) -> list[dict[str, Any]]:
    """The tools the model may call under tool_choice (none: no tools; a name: only that one)."""
    if not tools or tool_choice == "none":
        return []
    if isinstance(tool_choice, dict):
        name = tool_choice.get("function", {}).get("name")
        return [t for t in tools if _function(t).get("name") == name]
    return list(tools)


def with_tools(
    messages: Sequence[ChatTurn], tools: Sequence[dict[str, Any]], response_format: dict[str, Any] | None = None
) -> list[ChatTurn]:
    """The chat as text turns a plain chat template can render: the tools (or the JSON schema
    the answer must match) as a system turn, merged into the first system turn if there is
    one; earlier calls and results as text. The grammar forces the form either way, but a
    small model told the schema fills it in sensibly (closes its strings, for one)."""
    turns = [_as_text(m) for m in messages]
    if not tools:
        note = _format_note(response_format)
        return _with_system_note(turns, note) if note else turns
    described = "\n".join(
        json.dumps(
            {"name": fn.get("name"), "description": fn.get("description", ""), "parameters": _parameters(fn)},
            separators=(",", ":"),
        )
        for fn in map(_function, tools)
    )
    return _with_system_note(turns, TOOLS_INSTRUCTION.format(tools=described))


def _format_note(response_format: dict[str, Any] | None) -> str | None:
    kind = (response_format or {}).get("type")
    if kind == "json_schema":
        schema = output_schema(response_format)
        return "Answer with only JSON matching this schema: " + json.dumps(schema, separators=(",", ":"))
    if kind == "json_object":
        return "Answer with only a JSON object."
    return None


def _with_system_note(turns: list[ChatTurn], note: str) -> list[ChatTurn]:
    if turns and turns[0].role in ("system", "developer"):
        return [ChatTurn(role=turns[0].role, content=turns[0].content + "\n\n" + note), *turns[1:]]
    return [ChatTurn(role="system", content=note), *turns]


def _as_text(m: ChatTurn) -> ChatTurn:
    if m.tool_calls:
        calls = [{"name": c.name, "arguments": _loads_or_text(c.arguments)} for c in m.tool_calls]
        body = json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)
        return ChatTurn(role="assistant", content=(m.content + "\n" if m.content else "") + body)
    return m  # a tool result is a "tool" turn: ChatML-style templates render any role


def _loads_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def call_schema(tools: Sequence[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """The JSON schema a required call's answer must match: one call object (or an array of
    them when parallel calls are allowed), its name one of the tools and its arguments that
    tool's parameters. A model picks the object form for a single call; forcing the array
    form made small models append the same call again until the token cap."""
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": fn.get("name")}, "arguments": _parameters(fn)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for fn in map(_function, tools)
    ]
    one: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
    if parallel:  # one call as an object, as the instruction shows it, or several in an array
        return {"anyOf": [one, {"type": "array", "items": one, "minItems": 1}]}
    return one


def parse_calls(text: str, tools: Sequence[dict[str, Any]]) -> tuple[ToolCall, ...] | None:
    """The tool calls the answer `text` makes, or None when it is not (only) calls to the tools."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    names = {_function(t).get("name") for t in tools}
    calls = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        if not isinstance(arguments, dict):
            return None
        calls.append(
            ToolCall(
                id=new_call_id(), name=str(item["name"]), arguments=json.dumps(arguments, ensure_ascii=False), index=i
            )
        )
    return tuple(calls) or None


def output_schema(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """The schema a json_schema answer must match; {} for json_object (any JSON object)."""
    if not response_format:
        return None
    if response_format.get("type") == "json_schema":
        return dict((response_format.get("json_schema") or {}).get("schema") or {"type": "object"})
    return {"type": "object"}
