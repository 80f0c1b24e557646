"""Anthropic's Messages request as the pipeline's one GenerationIntent: `system` a system turn,
text blocks chat turns, `tool_use` blocks an assistant turn's tool calls, `tool_result` blocks
tool turns answering them, `tools` and `tool_choice` in the Chat Completions shapes the
pipeline carries. Everything is checked here, before anything reaches an engine: a 400 names
the field (`messages[2].content[0].tool_use_id`), and what laneway cannot honour is refused by
name (images, extended thinking, server tools), never quietly dropped."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from laneway.api.messages import protocol as mp
from laneway.api.request import Incoming, unsupported
from laneway.api.request import routing as routing_fields
from laneway.contracts.errors import GatewayError, invalid_request
from laneway.core.pipeline import GenerationIntent
from laneway.types import ChatTurn, SamplingExtensions, ToolCall

# anthropic-version: a date (the SDKs send their own, 2023-06-01 up to the current release's);
# the wire laneway speaks is the same for each, so any published-looking date passes and
# anything else is a 400 naming the header. Absent (curl, a batch line), it is taken as 2023-06-01.
_VERSION = re.compile(r"^20[2-9][0-9]-[01][0-9]-[0-3][0-9]$")
FIRST_VERSION = "2023-01-01"
# The intent's parameter (what the pipeline names in a 400) -> this API's name for it.
PARAM = {
    "stop": "stop_sequences",
    "user": "metadata.user_id",
    "response_format": "output_config.format",
    "prompt_cache_key": "metadata",
}
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
# Block types Anthropic runs on its own servers (web search, code execution, MCP...), or that
# only its models produce: refused by name rather than called unknown.
_SERVER_BLOCKS = ("server_tool_use", "mcp_tool_use", "mcp_tool_result", "container_upload", "search_result")
_THINKING_BLOCKS = ("thinking", "redacted_thinking")
_MEDIA_BLOCKS = {"image": "images", "document": "documents"}


def check_version(request: Incoming) -> None:
    version = request.headers.get("anthropic-version")
    if version is not None and (not _VERSION.match(version) or version < FIRST_VERSION):
        raise invalid_request(
            f"anthropic-version: '{version[:40]}' is not an API version; send a date such as 2023-06-01.",
            param="anthropic-version",
        )


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise invalid_request(f"`{param}` must be a string.", param=param)
    if "\x00" in value:  # no engine tokenizes it sensibly, and PostgreSQL text can't hold one
        raise invalid_request(f"`{param}` must not contain NUL (\\u0000) characters.", param=param)
    return value


def _refuse(param: str, what: str) -> GatewayError:
    return unsupported(param, what)


def _blocks(content: str | list[mp.Block], param: str) -> list[mp.Block]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not content:
        raise invalid_request(f"`{param}` must not be empty.", param=param)
    return content


def _text_block(block: mp.Block, param: str, model: str) -> str:
    """The text of a block that may only be text (`system`, a tool result's content)."""
    kind = block.get("type")
    if kind == "text":
        return _text(block.get("text"), f"{param}.text")
    if kind in _MEDIA_BLOCKS:
        raise _refuse(f"{param}.type", f"{_MEDIA_BLOCKS[kind]}: the model '{model}' cannot take them")
    raise invalid_request(f"`{param}.type` must be 'text' here, got '{str(kind)[:40]}'.", param=f"{param}.type")


def system_turns(system: str | list[mp.Block] | None, model: str) -> list[ChatTurn]:
    if system is None:
        return []
    if isinstance(system, str):
        text = _text(system, "system")
    else:
        text = "\n".join(_text_block(b, f"system[{k}]", model) for k, b in enumerate(system))
    return [ChatTurn(role="system", content=text)] if text else []


@dataclass
class _Turns:
    """The chat turns being built, and the tool calls the last assistant turn left open."""

    model: str
    turns: list[ChatTurn] = field(default_factory=list)
    open_calls: set[str] = field(default_factory=set)

    def add(self, turn: ChatTurn) -> None:
        """Consecutive turns of one role are one turn, as Anthropic combines them."""
        last = self.turns[-1] if self.turns else None
        if last is not None and turn.role == last.role and turn.role in ("user", "assistant"):
            calls = tuple(
                ToolCall(c.id, c.name, c.arguments, len(last.tool_calls) + k) for k, c in enumerate(turn.tool_calls)
            )
            text = "\n".join(t for t in (last.content, turn.content) if t)
            self.turns[-1] = ChatTurn(role=turn.role, content=text, tool_calls=(*last.tool_calls, *calls))
        else:
            self.turns.append(turn)

    def assistant(self, blocks: list[mp.Block], where: str) -> None:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for j, block in enumerate(blocks):
            param = f"{where}[{j}]"
            kind = block.get("type")
            if kind == "text":
                texts.append(_text(block.get("text"), f"{param}.text"))
            elif kind == "tool_use":
                calls.append(self._tool_use(block, param, len(calls)))
            elif kind == "tool_result":
                raise invalid_request(f"A `tool_result` block belongs in a user message ({param}).", param=param)
            else:
                self._other(kind, param)
        self.add(ChatTurn(role="assistant", content="".join(texts), tool_calls=tuple(calls)))
        self.open_calls = {c.id for c in calls}

    def _tool_use(self, block: mp.Block, param: str, index: int) -> ToolCall:
        call_id = _text(block.get("id"), f"{param}.id")
        name = _text(block.get("name"), f"{param}.name")
        arguments = block.get("input")
        if not call_id or not name:
            raise invalid_request(f"A `tool_use` block needs its `id` and `name` ({param}).", param=param)
        if not isinstance(arguments, dict):
            raise invalid_request(f"`{param}.input` must be an object.", param=f"{param}.input")
        encoded = msgspec.json.encode(arguments).decode()
        if "\\u0000" in encoded:
            raise invalid_request(f"`{param}.input` must not contain NUL (\\u0000) characters.", param=f"{param}.input")
        return ToolCall(id=call_id, name=name, arguments=encoded, index=index)

    def user(self, blocks: list[mp.Block], where: str) -> None:
        answered: set[str] = set()
        texts: list[str] = []
        for j, block in enumerate(blocks):
            param = f"{where}[{j}]"
            kind = block.get("type")
            if kind == "text":
                texts.append(_text(block.get("text"), f"{param}.text"))
            elif kind == "tool_result":
                if texts:  # a tool turn must follow the assistant's calls, as Anthropic requires
                    raise invalid_request(
                        f"`tool_result` blocks must come before any other content of their message ({param}).",
                        param=param,
                    )
                call_id = _text(block.get("tool_use_id"), f"{param}.tool_use_id")
                if call_id not in self.open_calls:
                    raise invalid_request(
                        f"`{param}.tool_use_id` '{call_id[:80]}' answers no `tool_use` block of the previous "
                        "(assistant) message.",
                        param=f"{param}.tool_use_id",
                    )
                answered.add(call_id)
                self.add(ChatTurn(role="tool", content=self._result(block, param), tool_call_id=call_id))
            elif kind == "tool_use":
                raise invalid_request(f"A `tool_use` block belongs in an assistant message ({param}).", param=param)
            else:
                self._other(kind, param)
        if missing := self.open_calls - answered:
            raise invalid_request(
                f"`tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(sorted(missing))[:200]}; each tool_use needs its tool_result in the next message.",
                param=where,
            )
        self.open_calls = set()
        if texts:
            self.add(ChatTurn(role="user", content="".join(texts)))

    def _result(self, block: mp.Block, param: str) -> str:
        content = block.get("content", "")
        if isinstance(content, str):
            text = _text(content, f"{param}.content")
        elif isinstance(content, list):
            text = "".join(_text_block(b, f"{param}.content[{k}]", self.model) for k, b in enumerate(content))
        else:
            raise invalid_request(f"`{param}.content` must be a string or text blocks.", param=f"{param}.content")
        return f"Error: {text}" if block.get("is_error") is True else text

    def _other(self, kind: Any, param: str) -> None:
        if kind in _MEDIA_BLOCKS:
            raise _refuse(f"{param}.type", f"{_MEDIA_BLOCKS[kind]}: the model '{self.model}' cannot take them")
        if kind in _THINKING_BLOCKS:
            raise _refuse(f"{param}.type", "extended thinking")
        if kind in _SERVER_BLOCKS or (isinstance(kind, str) and kind.endswith("_tool_result")):
            raise _refuse(f"{param}.type", "server tools, which Anthropic runs itself")
        raise invalid_request(f"`{param}.type`: unknown content block type '{str(kind)[:40]}'.", param=f"{param}.type")


def chat_turns(req: mp.ConversationRequest) -> list[ChatTurn]:
    """The conversation as chat turns: roles checked, tool calls matched with their results."""
    if not req.messages:
        raise invalid_request("`messages` must contain at least one message.", param="messages")
    built = _Turns(req.model, system_turns(req.system, req.model))
    last = len(req.messages) - 1
    for i, message in enumerate(req.messages):
        where = f"messages[{i}]"
        if message.role not in ("user", "assistant"):
            hint = "; a system prompt goes in the top-level `system`" if message.role == "system" else ""
            raise invalid_request(
                f"`{where}.role` must be 'user' or 'assistant', got '{message.role[:40]}'{hint}.", param=f"{where}.role"
            )
        if i == 0 and message.role != "user":
            raise invalid_request("The first message must use the 'user' role.", param=f"{where}.role")
        if i == last and message.role == "assistant":
            raise _refuse(where, "a final assistant message for the answer to continue (prefill)")
        blocks = _blocks(message.content, f"{where}.content")
        if message.role == "user":
            built.user(blocks, f"{where}.content")
        else:
            if built.open_calls:  # an assistant message right after one that called tools
                raise invalid_request(
                    f"The tool calls of messages[{i - 1}] need their `tool_result` blocks in the next user message.",
                    param=where,
                )
            built.assistant(blocks, f"{where}.content")
    return built.turns


def chat_tools(tools: list[mp.Block] | None) -> list[dict[str, Any]]:
    """Custom tools in the Chat Completions shape; a server tool is refused by name."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for k, tool in enumerate(tools or ()):
        param = f"tools[{k}]"
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise _refuse(f"{param}.type", f"'{str(kind)[:60]}', a server tool Anthropic runs itself")
        name = tool.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise invalid_request(f"`{param}.name` must be 1-128 letters, digits, '_' or '-'.", param=f"{param}.name")
        if name in seen:
            raise invalid_request(f"Tool names must be unique; '{name}' is repeated.", param=f"{param}.name")
        seen.add(name)
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise invalid_request(
                f"`{param}.input_schema` must be a JSON schema object.", param=f"{param}.input_schema"
            )
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(description := tool.get("description"), str):
            function["description"] = _text(description, f"{param}.description")
        if isinstance(strict := tool.get("strict"), bool):
            function["strict"] = strict
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: mp.Block | None, names: set[str]) -> tuple[str | dict[str, Any] | None, bool]:
    """`tool_choice` in the Chat Completions shape, and whether several calls may be made."""
    if choice is None:
        return None, True
    parallel = choice.get("disable_parallel_tool_use") is not True
    kind = choice.get("type")
    if kind == "auto":
        return "auto", parallel
    if kind == "none":
        return "none", parallel
    if kind == "any":
        if not names:
            raise invalid_request("tool_choice 'any' needs `tools`.", param="tool_choice")
        return "required", parallel
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            raise invalid_request(
                f"tool_choice names the tool '{str(name)[:80]}', which is not in `tools`.", param="tool_choice.name"
            )
        return {"type": "function", "function": {"name": name}}, parallel
    raise invalid_request(
        f"`tool_choice.type` must be auto, any, tool or none; got '{str(kind)[:40]}'.", param="tool_choice.type"
    )


def response_format(config: mp.Block | None) -> dict[str, Any] | None:
    """`output_config`: `format` (a JSON schema) as chat's response_format; an `effort` other
    than the default asks for a reasoning budget no engine here has."""
    for key, value in (config or {}).items():
        if key == "effort" and value not in (None, "high"):
            raise _refuse("output_config.effort", "a reasoning effort")
        if key not in ("effort", "format"):
            raise _refuse(f"output_config.{key}", "an output option laneway does not know")
    fmt = (config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise invalid_request(
            "`output_config.format` must be {type: json_schema, schema: {...}}.", param="output_config.format"
        )
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def refuse_unsupported(req: mp.ConversationRequest) -> None:
    """What changes the answer in a way no engine here can honour: a 400 naming it."""
    thinking = req.thinking
    if thinking is not None and thinking.get("type") != "disabled":
        raise _refuse("thinking", "extended thinking; the engines laneway serves do not think in blocks")
    if req.mcp_servers:
        raise _refuse("mcp_servers", "MCP servers called by the API")
    if req.context_management is not None:
        raise _refuse("context_management", "server-side context editing")
    if isinstance(req, mp.MessagesRequest) and req.container is not None:
        raise _refuse("container", "code execution containers")


@dataclass(frozen=True)
class Conversation:
    """A request's conversation and what it offers the model, in the pipeline's shapes."""

    turns: list[ChatTurn]
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any] | None
    parallel_tool_calls: bool
    response_format: dict[str, Any] | None

    @classmethod
    def of(cls, req: mp.ConversationRequest) -> Conversation:
        refuse_unsupported(req)
        tools = chat_tools(req.tools)
        choice, parallel = chat_tool_choice(req.tool_choice, {t["function"]["name"] for t in tools})
        return cls(chat_turns(req), tools, choice, parallel, response_format(req.output_config))

    def intent(self, request: Incoming, req: mp.ConversationRequest, **fields: Any) -> GenerationIntent:
        user = req.metadata.user_id if isinstance(req, mp.MessagesRequest) and req.metadata else None
        routing = routing_fields(request, None, user)
        routing["task"] = routing["task"] or "chat"  # a message is a chat: the chat task policy applies
        return GenerationIntent(
            endpoint="messages",
            alias=req.model,
            messages=self.turns,
            tools=self.tools,
            tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls,
            response_format=self.response_format,
            **routing,
            **fields,
        )


def message_intent(request: Incoming, req: mp.MessagesRequest) -> GenerationIntent:
    stops = [_text(s, f"stop_sequences[{k}]") for k, s in enumerate(req.stop_sequences or ())]
    return Conversation.of(req).intent(
        request,
        req,
        stream=req.stream,
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        stop=[s for s in stops if s],
        extensions=SamplingExtensions(top_k=req.top_k) if req.top_k is not None else None,
    )


def count_intent(request: Incoming, req: mp.CountTokensRequest) -> GenerationIntent:
    return Conversation.of(req).intent(request, req, stream=False, max_tokens=1)
