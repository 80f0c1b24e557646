"""One batch line through the same handler and pipeline as a live request: the tenant's
limits, quotas and usage row, lanes, capabilities and stops, with nothing of HTTP but an
in-process request. The line runs in the background lane (BACKGROUND_KEY), as the tenant
of the key that created the batch (TENANT_KEY: the key is known by its hash only).

The result is the output or error file's line in OpenAI's format. A refusal that waiting
cures (a rate limit, a quota, a full queue, an engine restarting) is not a result: the line
is retried after the Retry-After the refusal named, so a batch never fails for its pace."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from laneway.api.protocol import ErrorBody, ErrorEnvelope
from laneway.api.registry import batch_endpoint
from laneway.api.request_ids import request_id as scope_request_id
from laneway.api.services import ApiServices
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.contracts.scope import BACKGROUND_KEY, CALL_KEY, DISCONNECT_EXTENSION, TENANT_KEY
from laneway.core.ids import random_hex
from litestar import Response

log = logging.getLogger("laneway.batches")
RETRY_FLOOR_S = 1.0  # a retryable refusal that named no wait (an engine error) waits this long


class LineResponse(msgspec.Struct):
    status_code: int
    request_id: str
    body: msgspec.Raw


class LineError(msgspec.Struct):
    code: str
    message: str


class OutputLine(msgspec.Struct):
    id: str
    custom_id: str
    response: LineResponse | None
    error: LineError | None


def _unwatch() -> None:
    pass


def _watch(_: Callable[[], None]) -> Callable[[], None]:
    return _unwatch  # a batch line has no connection to lose: the runner cancels it directly


async def _never() -> Any:
    raise RuntimeError("a batch line has no request body stream")


class LineRequest:
    """The handlers' Incoming for a batch line."""

    __slots__ = ("_body", "headers", "scope")

    def __init__(self, tenant: Any, body: bytes) -> None:
        self.headers: dict[str, str] = {}
        self.scope: dict[str, Any] = {
            "type": "http",
            "headers": [],
            "extensions": {DISCONNECT_EXTENSION: _watch},
            TENANT_KEY: tenant,
            BACKGROUND_KEY: True,
        }
        self._body = body

    @property
    def receive(self) -> Callable[[], Awaitable[Any]]:
        return _never

    async def body(self) -> bytes:
        return self._body


@dataclass(frozen=True, slots=True)
class LineOutcome:
    """`retry_after` set: run the line again after that many seconds (nothing was answered).
    Otherwise `line` is the output file's line (ok) or the error file's."""

    ok: bool = False
    line: bytes = b""
    retry_after: float | None = None
    tokens: int = 0  # what the engine did for it (prompt + completion)


def answered(custom_id: str, status: int, rid: str, body: bytes, tokens: int = 0) -> LineOutcome:
    line = OutputLine(
        id="batch_req_" + random_hex(),
        custom_id=custom_id,
        response=LineResponse(status, rid, msgspec.Raw(body)),
        error=None,
    )
    return LineOutcome(ok=200 <= status < 300, line=msgspec.json.encode(line), tokens=tokens)


def not_run(custom_id: str, code: str, message: str) -> bytes:
    """The error file's line for a request that never ran (the batch expired or was cancelled)."""
    line = OutputLine(
        id="batch_req_" + random_hex(), custom_id=custom_id, response=None, error=LineError(code, message)
    )
    return msgspec.json.encode(line)


def _error_body(exc: GatewayError) -> bytes:
    return msgspec.json.encode(
        ErrorEnvelope(ErrorBody(message=exc.message, type=exc.type, param=exc.param, code=exc.code.value))
    )


async def run_line(api: ApiServices, endpoint: str, custom_id: str, key_sha256: str, body: str) -> LineOutcome:
    try:
        tenant = await api.authenticator.by_digest(key_sha256)
    except GatewayError as exc:
        if exc.retryable:  # the database is down: the key is checked again later
            return LineOutcome(retry_after=_wait(exc))
        return answered(custom_id, exc.status, "req_" + random_hex(), _error_body(exc))
    request = LineRequest(tenant, body.encode())
    served = batch_endpoint(endpoint)  # api/registry.py: what a batch may name
    if served is None:  # the batch was created by a gateway that served an endpoint this one lacks
        error = GatewayError(ErrorCode.NOT_FOUND, f"This gateway serves no batch endpoint {endpoint[:80]}.")
        return answered(custom_id, error.status, _rid(request), _error_body(error))
    try:
        response = await served.handler(request, api)
    except GatewayError as exc:
        if exc.retryable:
            return LineOutcome(retry_after=_wait(exc))
        return answered(custom_id, exc.status, _rid(request), _error_body(exc))
    except Exception:  # a bug, not the line's fault; written as a 500 rather than retried forever
        log.exception("batch line %r failed", custom_id[:80])
        error = GatewayError(ErrorCode.INTERNAL_ERROR, "The gateway failed to run this request.")
        return answered(custom_id, error.status, _rid(request), _error_body(error))
    if not isinstance(response, Response) or not isinstance(response.content, bytes):
        error = GatewayError(ErrorCode.INTERNAL_ERROR, "The request was answered with a stream.")
        return answered(custom_id, error.status, _rid(request), _error_body(error))
    call = request.scope.get(CALL_KEY)
    tokens = call.prompt_tokens + call.completion_tokens if call is not None else 0
    return answered(custom_id, response.status_code or 200, _rid(request), response.content, tokens)


def _rid(request: LineRequest) -> str:
    return scope_request_id(request.scope)  # type: ignore[arg-type]  # the handlers' scope, as an HTTP one


def _wait(exc: GatewayError) -> float:
    try:
        return max(RETRY_FLOOR_S, float(exc.headers.get("Retry-After", RETRY_FLOOR_S)))
    except ValueError:
        return RETRY_FLOOR_S
