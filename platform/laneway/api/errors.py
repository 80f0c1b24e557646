"""Every error a client sees, in OpenAI's shape: {"error": {"message", "type", "param", "code"}};
a request to Anthropic's Messages API (/v1/messages...) gets Anthropic's shape instead
(api/messages/errors.py), whatever refused it.

Each handler also counts the answer of a request that never held a lease (metrics.py:
laneway_requests_refused_total), and gives its code to the request's span when tracing is on;
an admitted one is counted (and its span ended) when its lease is released."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException
from litestar.types import ExceptionHandlersMap

from laneway.api.messages import errors as anthropic
from laneway.api.protocol import ErrorBody, ErrorEnvelope, encode
from laneway.api.request_ids import admitted, request_id
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, error_type
from laneway.contracts.scope import TRACE_KEY

if TYPE_CHECKING:
    from laneway.metrics import GatewayMetrics
    from laneway.tracing.otel import RequestTrace

log = logging.getLogger("laneway.api")

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# OpenAI's API areas: an unmatched path under one is counted under it (a client calling an
# endpoint laneway lacks), any other path as "other", so the label stays bounded.
OPENAI_AREAS = frozenset(
    {
        "assistants",
        "audio",
        "batches",
        "chat",
        "completions",
        "containers",
        "conversations",
        "embeddings",
        "evals",
        "files",
        "fine_tuning",
        "images",
        "models",
        "moderations",
        "realtime",
        "responses",
        "threads",
        "uploads",
        "vector_stores",
    }
)


def unmatched_path(path: str) -> str:
    """A path no route matched, as a bounded label: /v1/<area> for one of OpenAI's areas
    (/v1/chat/nope -> /v1/chat), /v1/other for another path under /v1, else other."""
    if path != "/v1" and not path.startswith("/v1/"):
        return "other"
    area = path[4:].split("/", 1)[0]
    return f"/v1/{area}" if area in OPENAI_AREAS else "/v1/other"


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    type_: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response[bytes]:
    body = ErrorEnvelope(ErrorBody(message=message, type=type_ or error_type(status), param=param, code=code))
    return Response(content=encode(body), status_code=status, media_type=MediaType.JSON, headers=headers)


class ErrorHandlers:
    """The app's exception handlers, counting refusals in this app's metrics (exception
    handlers take no dependencies: the metrics are bound here, at app construction)."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    def mapping(self) -> ExceptionHandlersMap:
        return {GatewayError: self.gateway_error, HTTPException: self.http_exception, Exception: self.internal_error}

    def _count(self, request: Request, status: int, code: str | None) -> None:  # type: ignore[type-arg]
        """Count a refusal before admission (once: one handler answers each request)."""
        scope = request.scope
        if admitted(scope):
            return
        trace: RequestTrace | None = cast("dict[str, Any]", scope).get(TRACE_KEY)
        if trace is not None:  # tracing is on: the request's span names the code, not only the status
            trace.refused(status, code)
        asked = str(scope.get("method", ""))
        method = asked if asked in _METHODS else "other"
        template = scope.get("path_template")
        if template:
            self.metrics.refused(template, status, code, method)
            return
        raw = scope.get("path", "")
        log.debug("no route for %s %s: %d", asked[:20], raw[:200], status)
        self.metrics.refused("unmatched", status, code, method, unmatched_path(raw))

    def gateway_error(self, request: Request, exc: GatewayError) -> Response[bytes]:  # type: ignore[type-arg]
        self._count(request, exc.status, exc.code)
        if anthropic.speaks_anthropic(request.scope["path"]):
            return anthropic.error_response(exc.status, exc.message, param=exc.param, headers=exc.headers)
        return error_response(
            exc.status, exc.message, code=exc.code, param=exc.param, type_=exc.type, headers=exc.headers
        )

    def http_exception(self, request: Request, exc: HTTPException) -> Response[bytes]:  # type: ignore[type-arg]
        self._count(request, exc.status_code, None)
        if anthropic.speaks_anthropic(request.scope["path"]):
            return anthropic.error_response(exc.status_code, str(exc.detail), headers=exc.headers)
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    def internal_error(self, request: Request, exc: Exception) -> Response[bytes]:  # type: ignore[type-arg]
        scope = request.scope  # read off the scope: api/fast.py passes its own request here
        rid = request_id(scope)
        log.exception("unhandled error on %s %s (request %s)", scope["method"], scope["path"], rid, exc_info=exc)
        code = ErrorCode.INTERNAL_ERROR
        self._count(request, code.status, code)
        message = "The gateway failed to handle this request; it has been logged."
        if anthropic.speaks_anthropic(scope["path"]):
            return anthropic.error_response(code.status, message)
        return error_response(code.status, message, code=code)
