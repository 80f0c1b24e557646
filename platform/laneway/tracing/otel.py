"""The spans of an API request, through the OpenTelemetry SDK (imported only when tracing is on).

One trace per request, rooted in a SERVER span named after the endpoint (`chat.completions`,
`completions`, `embeddings`, `responses`), the child of the caller's span when the request
carries a W3C `traceparent` (and `tracestate`):

    chat.completions                      SERVER  from the request's headers to Lease.release
      auth                                        the API key lookup
      prepare                                     body decode, resolve, measure, policy, route
      queue                                       admission until the engine slot is granted
      chat tiny                           CLIENT  the engine call (GenAI semantic conventions);
        first_token                               its traceparent goes to an HTTP engine (vLLM)
        decode
      stream                                      the SSE body going to the client

The root span ends where the request ends: Lease.release (every outcome, 429/499/503
included, recorded once, with the same status and code as the usage row), or, for a request
refused before it had a lease (400, 401, 404...), when its response has been sent. Spans whose
times the pipeline records anyway (queue, first token, decode, prepare) are written after the
fact with those timestamps, so the request path makes no tracer call for them.

Export: a BatchSpanProcessor hands finished spans to its own thread, which POSTs them as
protobuf to the OTLP/HTTP endpoint; the event loop only appends to its queue (bounded: when the
collector is down, spans beyond 2048 are dropped, never the request). OTEL_TRACES_SAMPLER,
OTEL_BSP_*, OTEL_EXPORTER_OTLP_HEADERS / _COMPRESSION / _TIMEOUT and OTEL_RESOURCE_ATTRIBUTES
are honoured as the SDK reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from litestar.middleware import DefineMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from laneway import __version__
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.contracts.scope import RECEIVED_AT, TRACE_KEY

if TYPE_CHECKING:
    from laneway.core.pipeline import Call
    from laneway.types import TenantSnapshot

# gen_ai.operation.name by Call.endpoint (the Responses API runs on the chat pipeline).
_OPERATION = {
    "chat": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
    "responses": "chat",
    "messages": "chat",
}
_PROPAGATOR = TraceContextTextMapPropagator()
log = logging.getLogger("laneway.tracing")
_TRACE_HEADERS = (b"traceparent", b"tracestate")


class Tracing:
    """The tracer provider and its exporter, built once (create_app) and shut down by the
    lifespan, which flushes what is still queued."""

    def __init__(self, endpoint: str, *, service_name: str = "laneway", exporter: SpanExporter | None = None) -> None:
        resource = Resource.create({SERVICE_NAME: service_name, SERVICE_VERSION: __version__})
        self.provider = TracerProvider(resource=resource)  # sampler: OTEL_TRACES_SAMPLER, else parent-based always-on
        # Headers, compression and timeout come from OTEL_EXPORTER_OTLP_* as the SDK reads them.
        self.exporter = exporter or OTLPSpanExporter(endpoint=endpoint)
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.tracer: Tracer = self.provider.get_tracer("laneway", __version__)
        self.endpoint = endpoint

    def middleware(self, spans: Mapping[str, str]) -> DefineMiddleware:
        """The middleware that traces the POST routes of `spans` (path -> the root span's name:
        the API's endpoints, api/registry.py)."""
        return DefineMiddleware(TracingMiddleware, tracing=self, spans=dict(spans))

    def begin(self, name: str, scope: Scope) -> RequestTrace:
        return RequestTrace(self.tracer, name, scope)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Export what has ended (blocking: tests and shutdown, never the event loop)."""
        return self.provider.force_flush(int(timeout_s * 1000))

    async def stop(self, timeout_s: float = 3.0) -> None:
        """Flush and shut down, waiting at most timeout_s: a collector that is down (the exporter
        retries for up to OTEL_EXPORTER_OTLP_TIMEOUT, 10 s) must not hold up the gateway's exit.
        A daemon thread, not to_thread: the interpreter never waits for it at exit."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def shut_down() -> None:
            try:
                self.provider.shutdown()
            finally:
                with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                    loop.call_soon_threadsafe(_resolve, done)

        threading.Thread(target=shut_down, name="otel-shutdown", daemon=True).start()
        try:
            await asyncio.wait_for(done, timeout_s)
        except TimeoutError:
            log.warning("traces not flushed to %s within %.0f s; the rest are dropped", self.endpoint, timeout_s)
            self.exporter.shutdown()  # ends the exporter's retries, so its thread ends too


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():  # not if the wait timed out and cancelled it
        done.set_result(None)


class TracingMiddleware:
    """Opens the root span of each traced endpoint's request (put in the scope under TRACE_KEY)
    and ends it when the response is sent, unless the request's lease has taken it over."""

    def __init__(self, app: ASGIApp, tracing: Tracing, spans: dict[str, str]) -> None:
        self.app = app
        self.tracing = tracing
        self.spans = spans

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = cast("dict[str, Any]", scope)
        name = self.spans.get(raw["path"]) if raw["type"] == "http" and raw["method"] == "POST" else None
        if name is None:
            await self.app(scope, receive, send)
            return
        trace = self.tracing.begin(name, scope)
        scope[TRACE_KEY] = trace  # type: ignore[literal-required]
        status = 500  # if the app fails before it answers

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            if trace.call is None:  # never admitted: no lease will end the span
                trace.close(status)


class RequestTrace:
    """The spans of one request. Every method is called only when tracing is on."""

    __slots__ = (
        "_auth_end",
        "_context",
        "_engine",
        "_ns0",
        "_pc0",
        "_refusal",
        "_root",
        "_stream_start",
        "_tracer",
        "call",
        "ended",
    )

    def __init__(self, tracer: Tracer, name: str, scope: Scope) -> None:
        self._tracer = tracer
        # One reading of both clocks: the pipeline's perf_counter() stamps become epoch times.
        self._ns0, self._pc0 = time.time_ns(), time.perf_counter()
        carrier = {k.decode(): v.decode("latin-1") for k, v in scope["headers"] if k in _TRACE_HEADERS}
        parent = _PROPAGATOR.extract(carrier)  # an invalid traceparent starts a new trace, never a refusal
        received: float | None = cast("dict[str, Any]", scope).get(RECEIVED_AT)
        start = self._ns(received) if received is not None else self._ns0
        self._root: Span = tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.SERVER,
            start_time=start,
            attributes={"http.request.method": "POST", "http.route": scope["path"], "url.path": scope["path"]},
        )
        self._context: Context = set_span_in_context(self._root)
        self._engine: Span | None = None
        self._auth_end: int | None = None
        self._stream_start: int | None = None
        self._refusal: tuple[int, str | None] | None = None
        self.call: Call | None = None
        self.ended = False

    def _ns(self, perf_counter: float) -> int:
        return self._ns0 + int((perf_counter - self._pc0) * 1e9)

    def _span(
        self,
        name: str,
        start: int,
        end: int,
        *,
        status: int = 200,
        code: str | None = None,
        parent: Context | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        """A finished child span, written after the fact (start and end in epoch ns); none for a
        request the sampler left out (OTEL_TRACES_SAMPLER): its children would not be recorded."""
        if not self._root.is_recording():
            return
        span = self._tracer.start_span(name, context=parent or self._context, start_time=start, attributes=attributes)
        _outcome(span, status, code, server=False)
        span.end(end_time=end)

    # ---- called by the request path ----
    async def auth(self, work: Awaitable[TenantSnapshot]) -> TenantSnapshot:
        start = time.time_ns()
        try:
            tenant = await work
        except GatewayError as exc:
            self._span("auth", start, time.time_ns(), status=exc.status, code=exc.code)
            raise
        except BaseException:
            code = ErrorCode.INTERNAL_ERROR
            self._span("auth", start, time.time_ns(), status=code.status, code=code)
            raise
        self._auth_end = time.time_ns()
        self._span("auth", start, self._auth_end, attributes={"laneway.tenant": tenant.name})
        self._root.set_attribute("laneway.tenant", tenant.name)
        return tenant

    def bind(self, call: Call) -> None:
        """The request holds a lease from now: Lease.release ends the root span."""
        self.call = call
        call.trace = self

    def refused(self, status: int, code: str | None) -> None:
        """A refusal before admission (the error handlers): its code, for the root span."""
        self._refusal = (status, code)

    def engine_started(self, call: Call) -> tuple[tuple[str, str], ...]:
        """Open the engine span; returns its W3C trace context, for an HTTP engine's headers (a
        request left out by the sampler passes on its own context, flagged not sampled)."""
        carrier: dict[str, str] = {}
        if not self._root.is_recording():
            _PROPAGATOR.inject(carrier, context=self._context)
            return tuple(carrier.items())
        info = call.deployment.engine.info
        op = _OPERATION.get(call.endpoint, call.endpoint)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": op,
            "gen_ai.request.model": call.alias,
            "laneway.deployment": call.deployment.spec.name,
            "laneway.engine": info.engine,
        }
        if call.embedding is None:
            attributes["gen_ai.request.max_tokens"] = call.generation.max_tokens
            attributes["gen_ai.request.temperature"] = call.generation.temperature
            attributes["gen_ai.request.top_p"] = call.generation.top_p
            if call.generation.n > 1:
                attributes["gen_ai.request.choice.count"] = call.generation.n
        # From the slot's grant: the engine's time to first token is measured from there too.
        start = self._ns(call.dispatched_at) if call.dispatched_at is not None else None
        self._engine = span = self._tracer.start_span(
            f"{op} {call.alias}", context=self._context, start_time=start, kind=SpanKind.CLIENT, attributes=attributes
        )
        _PROPAGATOR.inject(carrier, context=set_span_in_context(span))
        return tuple(carrier.items())

    def engine_ended(self, call: Call) -> None:
        span, self._engine = self._engine, None
        if span is None:  # never dispatched to the engine
            return
        now = time.time_ns()
        if span.is_recording():
            context = set_span_in_context(span)
            dispatched = self._ns(call.dispatched_at) if call.dispatched_at is not None else None
            if call.first_token_at is not None and dispatched is not None:
                first = self._ns(call.first_token_at)
                self._span("first_token", dispatched, first, parent=context)
                self._span(
                    "decode",
                    first,
                    now,
                    status=call.status,
                    code=call.error_code,
                    parent=context,
                    attributes={"gen_ai.usage.output_tokens": call.completion_tokens},
                )
            span.set_attributes(_usage(call))
        _outcome(span, call.status, call.error_code, server=False)
        span.end(end_time=now)

    def stream_started(self) -> None:
        self._stream_start = time.time_ns()

    def stream_ended(self, call: Call) -> None:
        if self._stream_start is not None:
            self._span("stream", self._stream_start, time.time_ns(), status=call.status, code=call.error_code)

    def finish(self, call: Call) -> None:
        """End the root span with the request's outcome (Lease.release: once, whatever ended it)."""
        if self.ended:
            return
        self.ended = True
        now = time.time_ns()
        root = self._root
        if root.is_recording():  # an unsampled request costs no attribute work
            started = self._ns(call.started)
            if self._auth_end is not None:
                self._span("prepare", self._auth_end, started)
            dispatched = call.dispatched_at
            queued_until = self._ns(dispatched) if dispatched is not None else now
            queue_status, queue_code = (200, None) if dispatched is not None else (call.status, call.error_code)
            self._span(
                "queue",
                started,
                queued_until,
                status=queue_status,
                code=queue_code,
                attributes={"laneway.lane": call.lane.name},
            )
            attributes = {
                "laneway.lane": call.lane.name,
                "laneway.model": call.alias,
                "laneway.deployment": call.deployment.spec.name,
                "laneway.engine": call.deployment.engine.info.engine,
                "laneway.tenant": call.tenant.name,
                "laneway.request_id": call.public_id,
                "laneway.stream": call.stream,
                "gen_ai.operation.name": _OPERATION.get(call.endpoint, call.endpoint),
                "gen_ai.request.model": call.alias,
                "gen_ai.response.id": call.request_id,
                "http.response.status_code": call.status,
                **_usage(call),
            }
            if call.task:
                attributes["laneway.task"] = call.task
            if call.queue_ms is not None:
                attributes["laneway.queue_ms"] = call.queue_ms
            if call.first_token_at is not None:
                attributes["laneway.ttft_ms"] = (call.first_token_at - call.started) * 1000
            root.set_attributes(attributes)
        _outcome(root, call.status, call.error_code, server=True)
        root.end(end_time=now)

    def close(self, status: int) -> None:
        """End the root span of a request that never held a lease, with its response's status."""
        if self.ended:
            return
        self.ended = True
        code = self._refusal[1] if self._refusal is not None and self._refusal[0] == status else None
        self._root.set_attribute("http.response.status_code", status)
        _outcome(self._root, status, code or (str(status) if status >= 400 else None), server=True)
        self._root.end()


def _usage(call: Call) -> dict[str, Any]:
    out: dict[str, Any] = {"gen_ai.usage.input_tokens": call.prompt_tokens}
    if call.embedding is None:
        out["gen_ai.usage.output_tokens"] = call.completion_tokens
        if call.finish_reason is not None:
            reasons: Sequence[str] = (call.finish_reason,)
            out["gen_ai.response.finish_reasons"] = reasons
    return out


def _outcome(span: Span, status: int, code: str | None, *, server: bool) -> None:
    """error.type names what went wrong (OpenAI's error code); the span's status is ERROR for a
    failed step, and for the request span only when the gateway answered 5xx (HTTP semantic
    conventions: a client's 4xx is not the server's error)."""
    if status < 400 and code is None:
        return
    span.set_attribute("error.type", code or str(status))
    if not server or status >= 500:
        span.set_status(Status(StatusCode.ERROR, code))
