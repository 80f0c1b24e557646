"""Server-sent events framing, as the OpenAI SDKs parse it."""

from __future__ import annotations

from typing import Any

from laneway.api.protocol import ErrorBody, ErrorEnvelope, encode

DONE = b"data: [DONE]\n\n"


def event(obj: Any) -> bytes:
    return b"data: " + encode(obj) + b"\n\n"


def error_event(status: int, message: str, *, code: str | None, type_: str = "server_error") -> bytes:
    """A mid-stream failure: the SDKs raise APIError when a data line carries an `error` key."""
    return event(ErrorEnvelope(ErrorBody(message=message, type=type_, code=code)))


def named_event(name: str, obj: Any) -> bytes:
    """An event with an `event:` line (the Responses API names each one after its `type`)."""
    return b"event: " + name.encode() + b"\ndata: " + encode(obj) + b"\n\n"
