"""Errors in Anthropic's shape, {"type": "error", "error": {"type", "message"}}, for the clients
of /v1/messages: api/errors.py renders every refusal of a path under it here (auth failures,
429s with their Retry-After, a body Litestar refused), and a failure after a stream started is
an `error` event of the same shape.

The statuses are those the `anthropic` SDKs map to their exception classes: laneway's 503s
(a full queue, an engine down, a draining replica) are Anthropic's 529 `overloaded_error`,
which the SDKs retry as they retry a 503; 500 is `api_error`; the others keep their status.
laneway's own code is not in the body (Anthropic's shape has no field for it): it is in the
usage row and the metrics, and the message says what happened."""

from __future__ import annotations

from litestar import MediaType, Response

from laneway.api import openapi
from laneway.api.messages import protocol as mp
from laneway.api.protocol import encode
from laneway.api.sse import named_event

PATH = "/v1/messages"

# laneway's status -> (the status Anthropic's SDKs see, its error type).
_BY_STATUS: dict[int, tuple[int, str]] = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    405: (405, "invalid_request_error"),
    409: (409, "invalid_request_error"),
    413: (413, "request_too_large"),  # Anthropic's type (laneway's code of that name is a 429)
    415: (415, "invalid_request_error"),
    429: (429, "rate_limit_error"),
    499: (499, "invalid_request_error"),  # the client left: nobody reads it
    500: (500, "api_error"),
    503: (529, "overloaded_error"),
}
# What the OpenAPI document says the endpoints' errors are (api/endpoints.py's record).
ERROR_SHAPE = openapi.ErrorShape(mp.AnthropicError, "Anthropic's error shape", {503: 529})


def speaks_anthropic(path: str) -> bool:
    """Whether a request to `path` is one of the Messages API's (its errors are rendered here)."""
    return path == PATH or path.startswith(PATH + "/")


def anthropic_status(status: int) -> tuple[int, str]:
    """The status and error type an Anthropic client gets for laneway's `status`."""
    return _BY_STATUS.get(status, (status, "invalid_request_error" if status < 500 else "api_error"))


def _body(status: int, message: str, param: str | None) -> tuple[int, bytes]:
    shown, kind = anthropic_status(status)
    # Anthropic names the field in the message ("messages.0.content: ..."); so does laneway.
    if param and param not in message:
        message = f"{param}: {message}"
    return shown, encode(mp.AnthropicError(mp.AnthropicErrorBody(type=kind, message=message)))


def error_response(
    status: int, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
) -> Response[bytes]:
    shown, body = _body(status, message, param)
    return Response(content=body, status_code=shown, media_type=MediaType.JSON, headers=headers)


def error_event(status: int, message: str) -> bytes:
    """A failure after the stream started: an `error` event (the SDKs raise it as APIStatusError)."""
    _, kind = anthropic_status(status)
    return named_event("error", mp.AnthropicError(mp.AnthropicErrorBody(type=kind, message=message)))
