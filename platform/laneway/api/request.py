"""The wire to an intent: authenticate, decode and check a request body, and translate it into
the pipeline's GenerationIntent. Shape only: what needs the model, the tenant or the policies
is the pipeline's to decide."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from laneway.api import protocol as p
from laneway.api.request_ids import client_request_id
from laneway.api.ttft_target import ttft_target_ms
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, invalid_request, validation_error
from laneway.contracts.scope import BACKGROUND_KEY, TENANT_KEY, TRACE_KEY
from laneway.core.auth import KeyAuthenticator
from laneway.core.pipeline import GenerationIntent
from laneway.types import ChatTurn, SamplingExtensions, TenantSnapshot, ToolCall

if TYPE_CHECKING:
    from laneway.tracing.otel import RequestTrace

T = TypeVar("T")


class Incoming(Protocol):
    """What the generation handlers read of a request: Litestar's Request, or api/fast.py's."""

    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def scope(self) -> Any: ...
    @property
    def receive(self) -> Callable[[], Awaitable[Any]]: ...
    async def body(self) -> bytes: ...


async def authenticate(request: Incoming, auth: KeyAuthenticator, *, key_header: str | None = None) -> TenantSnapshot:
    """The tenant of the request's API key (401/403/503 otherwise); an `auth` span when traced.
    A batch line carries its tenant on the scope (api/batches/lines.py). `key_header` names a
    header that may carry the bare key instead of `Authorization: Bearer` (Anthropic's
    `x-api-key`), for the endpoints whose clients send it there."""
    scope = request.scope
    header = request.headers.get("authorization")
    if header is None and key_header is not None and (key := request.headers.get(key_header)) is not None:
        header = "Bearer " + key
    trace: RequestTrace | None = scope.get(TRACE_KEY)
    if header is None and TENANT_KEY in scope:
        return scope[TENANT_KEY]  # type: ignore[no-any-return]
    if trace is None:  # tracing off: this branch is all it costs
        return await auth.authenticate(header)
    return await trace.auth(auth.authenticate(header))


# msgspec's words for a top-level field the struct does not declare (nested ones say where).
_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `([^`]+)`$")


async def decode(request: Incoming, kind: type[T]) -> T:
    body = await request.body()
    if not body:
        raise invalid_request("Request body is empty; expected a JSON object.", code=ErrorCode.INVALID_JSON)
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        unknown = _UNKNOWN_FIELD.match(str(exc))
        if unknown is not None:  # as OpenAI answers it: a parameter it does not know is not ignored
            name = unknown.group(1)
            raise invalid_request(
                f"Unknown parameter: '{name}'.", param=name, code=ErrorCode.UNKNOWN_PARAMETER
            ) from None
        raise validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise validation_error(exc) from None
    except RecursionError:  # msgspec stops at the interpreter's recursion limit (~1000 levels)
        raise invalid_request("Request body is nested too deeply.", code=ErrorCode.INVALID_JSON) from None


def unsupported(param: str, what: str) -> GatewayError:
    return invalid_request(
        f"`{param}` ({what}) is not supported by laneway; the request was not run.",
        param=param,
        code=ErrorCode.UNSUPPORTED_PARAMETER,
    )


def _refuse_unsupported(req: p.ChatCompletionRequest | p.CompletionRequest) -> None:
    """A 400 naming the parameter for what no engine does through laneway, never a 200 that
    ignored it; the values that ask for nothing pass, as SDKs and frameworks send them by
    default. What only some engines can do is checked against the chosen engine later
    (core/capabilities.py)."""
    if isinstance(req, p.ChatCompletionRequest):
        if req.audio is not None or (req.modalities is not None and req.modalities != ["text"]):
            raise unsupported("audio" if req.audio is not None else "modalities", "audio output")
        if req.web_search_options is not None:
            raise unsupported("web_search_options", "web search")
        if req.reasoning_effort is not None:
            raise unsupported("reasoning_effort", "reasoning models' effort")
        if req.verbosity not in (None, "medium"):
            raise unsupported("verbosity", "a requested answer length")
        if req.functions:
            raise unsupported("functions", "the deprecated function calling; use `tools`")
        if req.function_call not in (None, "none", "auto"):
            raise unsupported("function_call", "the deprecated function calling; use `tool_choice`")
    else:
        if req.suffix:
            raise unsupported("suffix", "insertion")
        if req.best_of not in (None, 1):
            raise unsupported("best_of", "several candidates per request")
        if req.response_format is not None and req.response_format.get("type", "text") != "text":
            raise unsupported("response_format", "structured output on legacy completions; use chat")


def _common(req: p.ChatCompletionRequest | p.CompletionRequest) -> dict[str, Any]:
    """What both endpoints share beyond text: stops, n, penalties, biases, sampling."""
    _refuse_unsupported(req)
    if req.stream_options is not None and not req.stream:
        raise invalid_request("stream_options is only allowed when stream is true.", param="stream_options")
    bias: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        try:
            bias[int(key)] = value
        except ValueError:
            raise invalid_request(
                f"logit_bias keys must be token ids (integers as strings), got '{key[:40]}'.", param="logit_bias"
            ) from None
    return {
        "alias": req.model,
        "stream": req.stream,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "seed": req.seed,
        "stop": [req.stop] if isinstance(req.stop, str) else list(req.stop or []),
        "n": req.n,
        "presence_penalty": req.presence_penalty or 0.0,
        "frequency_penalty": req.frequency_penalty or 0.0,
        "logit_bias": bias or None,
    }


def _chat_features(req: p.ChatCompletionRequest) -> dict[str, Any]:
    """tools, tool_choice, response_format and logprobs of a chat request, checked for sense."""
    names = [t.function.name for t in req.tools or ()]
    if len(set(names)) != len(names):
        raise invalid_request("Each tool must have a different function name.", param="tools")
    choice: str | dict[str, Any] | None
    if isinstance(req.tool_choice, p.NamedToolChoice):
        if req.tool_choice.function.name not in names:
            raise invalid_request(
                f"tool_choice names the function '{req.tool_choice.function.name}', which is not in `tools`.",
                param="tool_choice",
            )
        choice = msgspec.to_builtins(req.tool_choice)
    else:
        choice = req.tool_choice
        if choice == "required" and not names:
            raise invalid_request("tool_choice 'required' needs `tools`.", param="tool_choice")
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is None:
        raise invalid_request("response_format of type json_schema needs `json_schema`.", param="response_format")
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid_request("top_logprobs needs logprobs set to true.", param="top_logprobs")
    return {
        "tools": [msgspec.to_builtins(t) for t in req.tools or ()],
        "tool_choice": choice,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "response_format": msgspec.to_builtins(fmt) if fmt is not None and fmt.type != "text" else None,
        "logprobs": (req.top_logprobs or 0) if req.logprobs else None,
    }


_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


Body = p.ChatCompletionRequest | p.CompletionRequest


def _extensions(req: Body, max_tokens: int | None) -> SamplingExtensions | None:
    """The engine-specific sampling extensions the body set, checked for sense (the engine's
    own support is checked once it is chosen); None when it set none."""
    if (  # the common case, on every request: none sent (attribute reads, not a dataclass built)
        req.top_k is None
        and req.min_p is None
        and req.repetition_penalty is None
        and req.ignore_eos is None
        and req.min_tokens is None
        and req.stop_token_ids is None
        and req.include_stop_str_in_output is None
        and req.skip_special_tokens is None
        and req.spaces_between_special_tokens is None
        and req.truncate_prompt_tokens is None
        and req.structured_outputs is None
    ):
        return None
    if req.min_tokens is not None and max_tokens is not None and req.min_tokens > max_tokens:
        raise invalid_request(
            f"min_tokens ({req.min_tokens}) must not be more than max_tokens ({max_tokens}).", param="min_tokens"
        )
    structured: dict[str, Any] | None = None
    if req.structured_outputs is not None:
        structured = msgspec.to_builtins(req.structured_outputs)
        if sum(structured.get(k) is not None for k in _CONSTRAINTS) != 1:
            raise invalid_request(
                f"structured_outputs needs exactly one of {', '.join(_CONSTRAINTS)}.", param="structured_outputs"
            )
        if b"\\u0000" in msgspec.json.encode(structured):  # a NUL anywhere in it, as JSON escapes it
            raise invalid_request(
                "structured_outputs must not contain NUL (\\u0000) characters.", param="structured_outputs"
            )
    ext = SamplingExtensions(
        top_k=req.top_k,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        stop_token_ids=tuple(req.stop_token_ids) if req.stop_token_ids is not None else None,
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        truncate_prompt_tokens=req.truncate_prompt_tokens,
        structured_outputs=structured,
    )
    return ext if ext.asked() else None


class _Hinted(Protocol):
    """What hints() reads from a request body (chat, completions, responses)."""

    @property
    def metadata(self) -> dict[str, str] | None: ...
    @property
    def user(self) -> str | None: ...
    @property
    def prompt_cache_key(self) -> str | None: ...


def hints(request: Incoming, req: _Hinted) -> dict[str, Any]:
    """The intent's routing fields of a body with metadata (chat, completions, responses)."""
    return {**routing(request, req.metadata, req.user), "prompt_cache_key": cache_key(req.prompt_cache_key)}


CACHE_KEY_MAX = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def cache_key(value: str | None) -> str | None:
    """OpenAI's prompt_cache_key, checked: it keys which replica served the conversation, a
    record gateway replicas may share through Redis, so it is bounded and plain text."""
    if value is None:
        return None
    problem = (
        "must not be empty"
        if not value
        else f"must be at most {CACHE_KEY_MAX} characters (got {len(value)})"
        if len(value) > CACHE_KEY_MAX
        else "must not contain NUL or other control characters"
        if _CONTROL.search(value)
        else None
    )
    if problem is not None:
        raise invalid_request(f"`prompt_cache_key` {problem}.", param="prompt_cache_key")
    return value


def routing(request: Incoming, metadata: dict[str, str] | None, user: str | None) -> dict[str, Any]:
    """Task, lane, priority and TTFT target (headers win over request metadata), the end user
    and the client's X-Request-Id: the intent's routing fields."""
    if user is not None and "\x00" in user:  # stored on the usage row: PostgreSQL text can't hold NUL
        raise invalid_request("`user` must not contain NUL (\\u0000) characters.", param="user")
    meta = metadata or {}
    task = request.headers.get("x-laneway-task") or meta.get("laneway_task") or None
    lane = request.headers.get("x-laneway-lane") or meta.get("laneway_lane") or None
    raw = request.headers.get("x-laneway-priority") or meta.get("laneway_priority") or "0"
    try:
        priority = int(raw)
    except ValueError:
        raise invalid_request(
            f"X-Laneway-Priority must be an integer, got '{raw}'.", param="X-Laneway-Priority"
        ) from None
    return {
        "task": task,
        "lane": lane,
        "priority": priority,
        "ttft_target_ms": ttft_target_ms(request.headers, meta),
        "user": user,
        "client_request_id": client_request_id(request.headers.get("x-request-id")),
        "background": BACKGROUND_KEY in request.scope,  # a batch line: the background lane
    }


def chat_intent(request: Incoming, req: p.ChatCompletionRequest) -> GenerationIntent:
    common = _common(req)
    features = _chat_features(req)
    turns = [_turn(i, m) for i, m in enumerate(req.messages)]
    routing = hints(request, req)
    routing["task"] = routing["task"] or "chat"
    max_tokens = req.max_completion_tokens or req.max_tokens
    return GenerationIntent(
        endpoint="chat",
        messages=turns,
        max_tokens=max_tokens,
        extensions=_extensions(req, max_tokens),
        **common,
        **features,
        **routing,
    )


def completion_intent(request: Incoming, req: p.CompletionRequest) -> GenerationIntent:
    common = _common(req)
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise unsupported("prompt", "a list of several prompts")
        prompt = prompt[0]
    return GenerationIntent(
        endpoint="completions",
        prompt=prompt,
        max_tokens=req.max_tokens,
        logprobs=req.logprobs,
        extensions=_extensions(req, req.max_tokens),
        **common,
        **hints(request, req),
    )


def _turn(i: int, m: p.ChatMessageIn) -> ChatTurn:
    if m.role == "tool" and not m.tool_call_id:
        raise invalid_request("A tool message needs `tool_call_id`.", param=f"messages[{i}].tool_call_id")
    calls = tuple(
        ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments, index=k)
        for k, c in enumerate(m.tool_calls or ())
    )
    if calls and m.role != "assistant":
        raise invalid_request("Only assistant messages carry tool_calls.", param=f"messages[{i}].tool_calls")
    return ChatTurn(
        role=m.role, content=_message_text(i, m), tool_calls=calls, tool_call_id=m.tool_call_id, name=m.name
    )


def _message_text(i: int, m: p.ChatMessageIn) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    parts = []
    for part in m.content:
        if part.type != "text" or part.text is None:
            raise invalid_request(
                f"Only text content parts are supported (got '{part.type}').", param=f"messages[{i}].content"
            )
        parts.append(part.text)
    return "".join(parts)
