"""OpenAI routes: decode the body, authenticate, hand over to the pipeline, encode the answer."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec
from litestar import Controller, MediaType, Request, Response, get, post
from litestar.params import FromPath
from litestar.response import Stream

from laneway.api import openapi
from laneway.api import protocol as p
from laneway.api.choices import (
    Collected,
    CompletionOffsets,
    chat_choices,
    completion_choices,
    token_logprobs,
    tool_call_chunks,
)
from laneway.api.disconnect import ClientDisconnected, until_disconnect
from laneway.api.errors import validation_error
from laneway.api.request_ids import bind_call, client_request_id
from laneway.api.responses import LeasedStream
from laneway.api.services import Api, ApiServices
from laneway.api.sse import DONE, error_event, event
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, invalid_request
from laneway.core.auth import KeyAuthenticator
from laneway.core.pipeline import CLIENT_CLOSED, Call, Gateway, Lease
from laneway.core.streaming import pumped
from laneway.tracing import TRACE_KEY
from laneway.types import ChatTurn, Delta, TenantSnapshot, ToolCall

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


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def authenticate(request: Incoming, auth: KeyAuthenticator) -> TenantSnapshot:
    """The tenant of the request's API key (401/403/503 otherwise); an `auth` span when traced."""
    header = request.headers.get("authorization")
    trace: RequestTrace | None = request.scope.get(TRACE_KEY)
    if trace is None:  # tracing off: this branch is all it costs
        return await auth.authenticate(header)
    return await trace.auth(auth.authenticate(header))


# msgspec's words for a top-level field the struct does not declare (nested ones say where).
_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `([^`]+)`$")


async def _decode(request: Incoming, kind: type[T]) -> T:
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


def _common_checks(req: p.ChatCompletionRequest | p.CompletionRequest) -> list[str]:
    _refuse_unsupported(req)
    if req.stream_options is not None and not req.stream:
        raise invalid_request("stream_options is only allowed when stream is true.", param="stream_options")
    return [req.stop] if isinstance(req.stop, str) else list(req.stop or [])


def _sampling(req: p.ChatCompletionRequest | p.CompletionRequest) -> dict[str, Any]:
    """The prepare() arguments both endpoints share beyond text: n, penalties, biases."""
    bias: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        try:
            bias[int(key)] = value
        except ValueError:
            raise invalid_request(
                f"logit_bias keys must be token ids (integers as strings), got '{key[:40]}'.", param="logit_bias"
            ) from None
    return {
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


class _Hinted(Protocol):
    """What _hints reads from a request body (chat, completions, responses)."""

    @property
    def metadata(self) -> dict[str, str] | None: ...
    @property
    def user(self) -> str | None: ...


def _hints(request: Incoming, req: _Hinted) -> dict[str, Any]:
    """Task, lane and priority (headers win over request metadata), the end user and the
    client's X-Request-Id."""
    if req.user is not None and "\x00" in req.user:  # stored on the usage row: PostgreSQL text can't hold NUL
        raise invalid_request("`user` must not contain NUL (\\u0000) characters.", param="user")
    meta = req.metadata or {}
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
        "user": req.user,
        "client_request_id": client_request_id(request.headers.get("x-request-id")),
    }


def _turn(i: int, m: p.ChatMessageIn) -> ChatTurn:
    if m.role == "tool" and not m.tool_call_id:
        raise invalid_request("A tool message needs `tool_call_id`.", param=f"messages[{i}].tool_call_id")
    calls = tuple(
        ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments, index=k)
        for k, c in enumerate(m.tool_calls or ())
    )
    if calls and m.role != "assistant":
        raise invalid_request("Only assistant messages carry tool_calls.", param=f"messages[{i}].tool_calls")
    return ChatTurn(role=m.role, content=_message_text(i, m), tool_calls=calls, tool_call_id=m.tool_call_id,
                    name=m.name)  # fmt: skip


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


def _card(gateway: Gateway, alias: str, created: int) -> p.ModelCard:
    return p.ModelCard(id=alias, created=created, capabilities=sorted(gateway.capabilities(alias)))


class OpenAIController(Controller):
    """Each handler takes one dependency, `api` (the runtime's ApiServices): the hot path pays
    for one provider call, not one per service."""

    path = "/v1"
    security = openapi.API_KEY  # the bodies are decoded here, by msgspec: api/openapi.py describes them

    @get("/models", media_type=MediaType.JSON, operation_class=openapi.MODEL_LIST)
    async def list_models(self, request: Request, api: Api) -> Response[bytes]:  # type: ignore[type-arg]
        tenant = await authenticate(request, api.authenticator)
        gateway = api.gateway
        created = int(api.started_at)
        cards = [_card(gateway, a, created) for a in gateway.visible_models(tenant)]
        return Response(p.encode(p.ModelList(data=cards)), media_type=MediaType.JSON)

    @get("/models/{model_id:path}", media_type=MediaType.JSON, operation_class=openapi.MODEL)
    async def get_model(self, request: Request, api: Api, model_id: FromPath[str]) -> Response[bytes]:  # type: ignore[type-arg]
        tenant = await authenticate(request, api.authenticator)
        gateway = api.gateway
        alias = model_id.lstrip("/")
        if alias not in gateway.visible_models(tenant):
            raise GatewayError(
                ErrorCode.MODEL_NOT_FOUND,
                f"The model '{alias}' does not exist or you do not have access to it.",
                param="model",
            )
        card = _card(gateway, alias, int(api.started_at))
        return Response(p.encode(card), media_type=MediaType.JSON)

    @post("/chat/completions", status_code=200, operation_class=openapi.CHAT)
    async def chat_completions(self, request: Request, api: Api) -> Response[bytes] | Stream:  # type: ignore[type-arg]
        return await chat_completions(request, api)

    @post("/completions", status_code=200, operation_class=openapi.COMPLETION)
    async def completions(self, request: Request, api: Api) -> Response[bytes] | Stream:  # type: ignore[type-arg]
        return await completions(request, api)


async def chat_completions(request: Incoming, api: ApiServices) -> Response[bytes] | Stream:
    """POST /v1/chat/completions, for the controller and for api/fast.py's plain-ASGI route."""
    tenant = await authenticate(request, api.authenticator)
    req = await _decode(request, p.ChatCompletionRequest)
    stop = _common_checks(req)
    features = _chat_features(req)
    turns = [_turn(i, m) for i, m in enumerate(req.messages)]
    gateway = api.gateway
    hints = _hints(request, req)
    hints["task"] = hints["task"] or "chat"
    call = await gateway.prepare(
        tenant,
        endpoint="chat",
        alias=req.model,
        stream=req.stream,
        messages=turns,
        max_tokens=req.max_completion_tokens or req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop=stop,
        **hints,
        **_sampling(req),
        **features,
    )
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    want_logprobs = features["logprobs"] is not None

    def body(deltas: list[Delta]) -> p.ChatCompletion:
        collected = Collected.of(call.generation.n, deltas)
        return p.ChatCompletion(
            id=call.request_id,
            created=int(time.time()),
            model=call.alias,
            choices=chat_choices(collected, want_logprobs),
            usage=_usage(call),
            system_fingerprint=call.fingerprint,
        )

    return await _respond(
        request, api, call, lambda lease: _chat_events(gateway, lease, include_usage, want_logprobs), body
    )


async def completions(request: Incoming, api: ApiServices) -> Response[bytes] | Stream:
    """POST /v1/completions, for the controller and for api/fast.py's plain-ASGI route."""
    tenant = await authenticate(request, api.authenticator)
    req = await _decode(request, p.CompletionRequest)
    stop = _common_checks(req)
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise unsupported("prompt", "a list of several prompts")
        prompt = prompt[0]
    gateway = api.gateway
    call = await gateway.prepare(
        tenant,
        endpoint="completions",
        alias=req.model,
        stream=req.stream,
        prompt=prompt,
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop=stop,
        logprobs=req.logprobs,
        **_hints(request, req),
        **_sampling(req),
    )
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    echo = prompt if req.echo else ""
    want_logprobs = req.logprobs is not None

    def body(deltas: list[Delta]) -> p.Completion:
        collected = Collected.of(call.generation.n, deltas)
        return p.Completion(
            id=call.request_id,
            created=int(time.time()),
            model=call.alias,
            choices=completion_choices(collected, echo, want_logprobs),
            usage=_usage(call),
            system_fingerprint=call.fingerprint,
        )

    return await _respond(
        request,
        api,
        call,
        lambda lease: _completion_events(gateway, lease, include_usage, echo, want_logprobs),
        body,
    )


async def admitted(gateway: Gateway, lease: Lease, work: Callable[[], Awaitable[T]]) -> T:
    """Wait for a slot, then do `work`, in this task: an interruption (a shutdown) cancels it
    and surfaces as the interrupting error. The non-streaming answers' shared body."""
    current = asyncio.current_task()
    assert current is not None
    interrupted: list[GatewayError] = []

    def interrupt(error: GatewayError) -> None:
        interrupted.append(error)
        current.cancel()

    lease.interrupter = interrupt
    try:
        await gateway.acquire(lease)
        return await work()
    except asyncio.CancelledError:
        if interrupted and current.cancelling():
            current.uncancel()
            raise interrupted[0] from None
        raise
    finally:
        lease.interrupter = None


async def _admit_and_collect(gateway: Gateway, lease: Lease) -> list[Delta]:
    """A non-streaming answer: a slot, then the whole generation."""

    async def collect() -> list[Delta]:
        return [d async for d in gateway.run(lease)]

    return await admitted(gateway, lease, collect)


async def _respond(
    request: Incoming,
    api: ApiServices,
    call: Call,
    events: Callable[[Lease], AsyncIterator[bytes]],
    body: Callable[[list[Delta]], Any],
) -> Response[bytes] | Stream:
    """Admit (queueing as needed) while watching for the client to leave, then answer.

    The lease is opened before the first await and owned here: handed to the streaming
    response (which releases it when the stream ends), or released by this `finally`."""
    headers = {"X-Laneway-Lane": call.lane.name}  # X-Request-Id: api/request_ids.py, from the call
    gateway = api.gateway
    lease = gateway.lease(call)
    bind_call(request.scope, call)
    owned = True
    try:
        if not call.stream:
            deltas = await until_disconnect(request, _admit_and_collect(gateway, lease), call)
            return Response(p.encode(body(deltas)), media_type=MediaType.JSON, headers=headers)
        await until_disconnect(request, gateway.acquire(lease), call)
        response = LeasedStream(
            lease, events(lease), headers={**SSE_HEADERS, **headers}, send_timeout_s=api.stream_send_timeout_s
        )
        owned = False  # the response releases it when the stream ends
        return response
    except ClientDisconnected:
        return Response(b"", status_code=CLIENT_CLOSED)
    except BaseException as exc:
        call.fail(*gateway.outcome_of(exc))
        raise
    finally:
        if owned:
            lease.release()


def _usage(call: Call) -> p.Usage:
    return p.Usage(
        prompt_tokens=call.prompt_tokens,
        completion_tokens=call.completion_tokens,
        total_tokens=call.prompt_tokens + call.completion_tokens,
    )


async def _stream_events(
    gateway: Gateway,
    lease: Lease,
    head: bytes | None,
    render: Callable[[Delta], list[bytes]],
    usage: Callable[[], bytes] | None,
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
        async for batch in pumped(gateway, lease, limit=max(1, lease.call.lane.max_unacked_tokens)):
            # The deltas that were ready together go out in one write (the same events).
            data = b"".join(frame for d in batch for frame in render(d))
            if data:
                yield data
    except GatewayError as exc:
        yield fail(exc) if fail is not None else error_event(exc.status, exc.message, code=exc.code)
        return
    if usage is not None:
        yield usage()
    if done:
        yield done


def _framer(call: Call, kind: Callable[..., Any]) -> Callable[..., bytes]:
    """An SSE frame maker for one stream: `kind` is ChatCompletionChunk or Completion."""
    created = int(time.time())

    def frame(choices: list[Any], usage: p.Usage | None = None) -> bytes:
        return event(
            kind(
                id=call.request_id,
                created=created,
                model=call.alias,
                choices=choices,
                system_fingerprint=call.fingerprint,
                usage=usage,
            )
        )

    return frame


def _chat_events(gateway: Gateway, lease: Lease, include_usage: bool, want_logprobs: bool) -> AsyncIterator[bytes]:
    call = lease.call
    frame = _framer(call, p.ChatCompletionChunk)

    def render(d: Delta) -> list[bytes]:
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
    usage = (lambda: frame([], _usage(call))) if include_usage else None
    return _stream_events(gateway, lease, head, render, usage)


def _completion_events(
    gateway: Gateway, lease: Lease, include_usage: bool, echo: str, want_logprobs: bool
) -> AsyncIterator[bytes]:
    call = lease.call
    frame = _framer(call, p.Completion)
    offsets = CompletionOffsets(call.generation.n, len(echo))

    def render(d: Delta) -> list[bytes]:
        if not d.text and d.finish_reason is None and not d.logprobs:
            return []
        logprobs = offsets.logprobs(d) if want_logprobs else None
        return [
            frame([p.CompletionChoice(index=d.index, text=d.text, finish_reason=d.finish_reason, logprobs=logprobs)])
        ]

    head = (
        b"".join(frame([p.CompletionChoice(index=i, text=echo, finish_reason=None)]) for i in range(call.generation.n))
        if echo
        else None
    )
    usage = (lambda: frame([], _usage(call))) if include_usage else None
    return _stream_events(gateway, lease, head, render, usage)
