"""GatewayError: a failure the client must hear about, in OpenAI's error shape, its status,
type and retryability taken from its ErrorCode."""

from __future__ import annotations

import re

import msgspec

from laneway.contracts.codes import ErrorCode

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    499: "invalid_request_error",  # the client's side (it left, or read too slowly): not laneway's
    500: "server_error",
    503: "service_unavailable",
}


def error_type(status: int) -> str:
    """OpenAI's error type for a status (what the SDKs map to their exception classes)."""
    return _TYPE_BY_STATUS.get(status, "api_error")


class GatewayError(Exception):
    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        """Its status, type and retryability are the code's (contracts/codes.py): a caller
        picks the code, never a status."""
        super().__init__(message)
        info = code.info
        self.code = code
        self.status = info.status
        self.type = info.type
        self.retryable = info.retryable
        self.message = message
        self.param = param
        self.headers: dict[str, str] = {}
        if retry_after is not None:
            self.retry_in(retry_after)

    def retry_in(self, seconds: float) -> None:
        """Retry-After: whole seconds, rounded up, at least 1."""
        self.headers["Retry-After"] = str(max(1, int(seconds + 0.999)))


def invalid_request(
    message: str, *, param: str | None = None, code: ErrorCode = ErrorCode.INVALID_REQUEST
) -> GatewayError:
    return GatewayError(code, message, param=param)


def preempted() -> GatewayError:
    """A background request (a batch line) gave its engine slot to a foreground one that had
    none: it runs again later, unbilled for what was discarded."""
    return GatewayError(ErrorCode.PREEMPTED, "Preempted by a foreground request; run it again.", retry_after=1)


def shutting_down(retry_after: float = 1) -> GatewayError:
    """This replica is draining for a shutdown: the client should retry (another replica)."""
    return GatewayError(
        ErrorCode.SHUTTING_DOWN, "This gateway replica is shutting down; retry the request.", retry_after=retry_after
    )


def dependency_unavailable(code: ErrorCode, dependency: str, retry_after: float = 1) -> GatewayError:
    """A dependency the gateway needs (Redis, the database) is down and no fallback applies."""
    return GatewayError(
        code, f"The gateway cannot reach its {dependency} right now; retry shortly.", retry_after=retry_after
    )


_PATH = re.compile(r"at `\$\.?([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def validation_error(exc: msgspec.ValidationError | msgspec.DecodeError) -> GatewayError:
    """Turn msgspec's message ("Expected `int`, got `str` - at `$.max_tokens`") into a 400 with param."""
    text = str(exc)
    match = _PATH.search(text)
    param = match.group(1) if match else ""
    missing = _MISSING.search(text)
    if missing:
        param = f"{param}.{missing.group(1)}" if param else missing.group(1)
    if isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError):
        return GatewayError(ErrorCode.INVALID_JSON, f"Request body is not valid JSON: {text}")
    return GatewayError(ErrorCode.INVALID_REQUEST, f"Invalid request: {text}", param=param or None)
