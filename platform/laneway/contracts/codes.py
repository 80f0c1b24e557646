"""Every error code a client can see, with what follows from it.

One enum, as TGI's InferError and TensorZero's ErrorDetails do it: the HTTP status, the
OpenAI error type, the metric reason (laneway_rejections_total{reason}) and whether a client
may retry the same request all come from the code, so no call site picks its own status.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class CodeInfo:
    status: int
    type: str
    reason: str | None  # laneway_rejections_total's label; None: not counted there
    retryable: bool


_BAD = "invalid_request_error"
_CLIENT = _BAD  # 499, the client's side (OpenAI has no type for it): the 4xx family's type
_UNAVAILABLE = "service_unavailable"
_LIMIT = "rate_limit_error"


class ErrorCode(StrEnum):
    # The request itself (400/404/413/415): retrying it unchanged cannot help.
    INVALID_REQUEST = "invalid_request"
    INVALID_JSON = "invalid_json"
    INVALID_TYPE = "invalid_type"
    UNKNOWN_PARAMETER = "unknown_parameter"
    UNSUPPORTED_PARAMETER = "unsupported_parameter"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    MODEL_NOT_FOUND = "model_not_found"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    # Who is asking (401/403).
    INVALID_API_KEY = "invalid_api_key"
    TENANT_DISABLED = "tenant_disabled"
    MODEL_NOT_ALLOWED = "model_not_allowed"
    LANE_NOT_ALLOWED = "lane_not_allowed"
    INVALID_CREDENTIALS = "invalid_credentials"
    NOT_LOGGED_IN = "not_logged_in"
    CSRF_FAILED = "csrf_failed"
    ROLE_FORBIDDEN = "role_forbidden"  # an admin or portal user whose role may not do this
    INVALID_METRICS_TOKEN = "invalid_metrics_token"
    # Limits (429): retry after the window.
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    REQUEST_TOO_LARGE = "request_too_large"
    CONCURRENCY_LIMIT_EXCEEDED = "concurrency_limit_exceeded"
    QUOTA_EXCEEDED = "quota_exceeded"
    BUDGET_EXCEEDED = "budget_exceeded"
    TOO_MANY_LOGIN_ATTEMPTS = "too_many_login_attempts"
    LOGIN_BUSY = "login_busy"
    # Admission (503): the deployment is busy; retry after Retry-After.
    QUEUE_FULL = "queue_full"
    TENANT_QUEUE_SHARE = "tenant_queue_share"
    PREDICTED_WAIT_EXCEEDED = "predicted_wait_exceeded"
    QUEUE_TIMEOUT = "queue_timeout"
    # The client's side while running (499, nginx's "client closed request"): it went away,
    # or read so slowly that laneway cut it (docs/failure-contracts.md). Never laneway's fault.
    BACKPRESSURE = "backpressure"
    SLOW_CLIENT = "slow_client"
    CLIENT_DISCONNECTED = "client_disconnected"
    # A batch's lines that never ran: written in its error file only (no HTTP status is sent).
    BATCH_EXPIRED = "batch_expired"
    BATCH_CANCELLED = "batch_cancelled"
    # laneway's or a dependency's fault.
    ENGINE_ERROR = "engine_error"
    ENGINE_START_FAILED = "engine_start_failed"
    SHUTTING_DOWN = "shutting_down"
    PREEMPTED = "preempted"  # background work (a batch line) made way for a foreground request
    RATE_LIMITER_UNAVAILABLE = "rate_limiter_unavailable"
    DATABASE_UNAVAILABLE = "database_unavailable"
    OVERLOADED = "overloaded"
    SERVER_ERROR = "server_error"
    INTERNAL_ERROR = "internal_error"

    @property
    def info(self) -> CodeInfo:
        return _INFO[self]

    @property
    def status(self) -> int:
        return _INFO[self].status

    @property
    def retryable(self) -> bool:
        return _INFO[self].retryable


C = ErrorCode
_INFO: dict[ErrorCode, CodeInfo] = {
    C.INVALID_REQUEST: CodeInfo(400, _BAD, None, False),
    C.INVALID_JSON: CodeInfo(400, _BAD, None, False),
    C.INVALID_TYPE: CodeInfo(400, _BAD, None, False),
    C.UNKNOWN_PARAMETER: CodeInfo(400, _BAD, None, False),
    C.UNSUPPORTED_PARAMETER: CodeInfo(400, _BAD, None, False),
    C.CONTEXT_LENGTH_EXCEEDED: CodeInfo(400, _BAD, None, False),
    C.MODEL_NOT_FOUND: CodeInfo(404, "not_found_error", None, False),
    C.NOT_FOUND: CodeInfo(404, "not_found_error", None, False),
    C.CONFLICT: CodeInfo(409, _BAD, None, False),
    C.INVALID_API_KEY: CodeInfo(401, "authentication_error", None, False),
    C.TENANT_DISABLED: CodeInfo(403, "permission_error", None, False),
    C.MODEL_NOT_ALLOWED: CodeInfo(403, "permission_error", None, False),
    C.LANE_NOT_ALLOWED: CodeInfo(403, "permission_error", None, False),
    C.INVALID_CREDENTIALS: CodeInfo(401, "authentication_error", None, False),
    C.NOT_LOGGED_IN: CodeInfo(401, "authentication_error", None, False),
    C.CSRF_FAILED: CodeInfo(403, "permission_error", None, False),
    C.ROLE_FORBIDDEN: CodeInfo(403, "permission_error", None, False),
    C.INVALID_METRICS_TOKEN: CodeInfo(401, "authentication_error", None, False),
    C.RATE_LIMIT_EXCEEDED: CodeInfo(429, _LIMIT, "rate_limit", True),
    C.REQUEST_TOO_LARGE: CodeInfo(429, _LIMIT, "rate_limit", False),
    C.CONCURRENCY_LIMIT_EXCEEDED: CodeInfo(429, _LIMIT, "concurrency", True),
    C.QUOTA_EXCEEDED: CodeInfo(429, _LIMIT, "quota", True),
    C.BUDGET_EXCEEDED: CodeInfo(429, _LIMIT, "budget", True),
    C.TOO_MANY_LOGIN_ATTEMPTS: CodeInfo(429, _LIMIT, None, True),
    C.LOGIN_BUSY: CodeInfo(429, _LIMIT, None, True),
    C.QUEUE_FULL: CodeInfo(503, _UNAVAILABLE, "queue_full", True),
    C.TENANT_QUEUE_SHARE: CodeInfo(503, _UNAVAILABLE, "tenant_queue_share", True),
    C.PREDICTED_WAIT_EXCEEDED: CodeInfo(503, _UNAVAILABLE, "predicted_wait", True),
    C.QUEUE_TIMEOUT: CodeInfo(503, _UNAVAILABLE, "queue_timeout", True),
    C.BACKPRESSURE: CodeInfo(499, _CLIENT, "backpressure", False),
    C.SLOW_CLIENT: CodeInfo(499, _CLIENT, "slow_client", False),
    C.CLIENT_DISCONNECTED: CodeInfo(499, _CLIENT, "disconnect", False),
    # Expired: the window ended before a slot was free (laneway's capacity: submit it again).
    # Cancelled: the tenant called the batch off (its side, as a client that left).
    C.BATCH_EXPIRED: CodeInfo(503, _UNAVAILABLE, None, True),
    C.BATCH_CANCELLED: CodeInfo(499, _CLIENT, None, False),
    C.ENGINE_ERROR: CodeInfo(503, _UNAVAILABLE, "engine_error", True),
    C.ENGINE_START_FAILED: CodeInfo(400, _BAD, None, False),
    C.SHUTTING_DOWN: CodeInfo(503, _UNAVAILABLE, "shutting_down", True),
    C.PREEMPTED: CodeInfo(503, _UNAVAILABLE, "preempted", True),
    C.RATE_LIMITER_UNAVAILABLE: CodeInfo(503, _UNAVAILABLE, "dependency", True),
    C.DATABASE_UNAVAILABLE: CodeInfo(503, _UNAVAILABLE, "dependency", True),
    C.OVERLOADED: CodeInfo(503, _UNAVAILABLE, "overloaded", True),
    C.SERVER_ERROR: CodeInfo(500, "server_error", None, False),
    C.INTERNAL_ERROR: CodeInfo(500, "server_error", "internal_error", False),
}
del C


def reason_of(code: str | None) -> str | None:
    """The metric reason of a code the client saw (None for one not counted as a rejection)."""
    if not code:
        return None
    try:
        return ErrorCode(code).info.reason
    except ValueError:
        return None
