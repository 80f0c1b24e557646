"""Refusals at the door: the answers the server writes itself, before any app sees the request,
and the scan that lets it refuse a whole request without running the HTTP parser."""

from __future__ import annotations

from http import HTTPStatus
from typing import NamedTuple

from laneway.api.request_ids import HEADER as REQUEST_ID_HEADER
from laneway.api.request_ids import fresh_request_id
from laneway.contracts.codes import ErrorCode

TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_OVERLOADED = ErrorCode.OVERLOADED  # written here once, at import: its status and type are the code's
_OVERLOADED_BODY = (
    f'{{"error": {{"message": "The gateway is overloaded; retry shortly.", "type": "{_OVERLOADED.info.type}", '
    f'"param": null, "code": "{_OVERLOADED.value}"}}}}'
).encode()
_OVERLOADED_HEAD = (  # then the X-Request-Id, as on every response (api/request_ids.py)
    f"HTTP/1.1 {_OVERLOADED.status} {HTTPStatus(_OVERLOADED.status).phrase}\r\n".encode()
    + b"content-type: application/json\r\nretry-after: 1\r\n"
    b"content-length: " + str(len(_OVERLOADED_BODY)).encode() + b"\r\nx-request-id: "
)
_OVERLOADED_TAIL = b"\r\n\r\n" + _OVERLOADED_BODY


def overloaded_answer(request_id: bytes | None) -> bytes:
    """The prepared 503 `overloaded`, with the client's (sane) request id or a fresh one."""
    return _OVERLOADED_HEAD + (request_id or fresh_request_id().encode()) + _OVERLOADED_TAIL


class WholeRequest(NamedTuple):
    request_id: bytes | None  # the client's X-Request-Id as sent (not checked for sanity yet)
    close: bool  # the client asked for `connection: close`


def whole_request(data: bytes) -> WholeRequest | None:
    """`data` as exactly one whole, plain HTTP/1.1 request (headers and a content-length body),
    or None for anything unusual (a body still to come, a second request behind it, chunked,
    Expect, Upgrade, an odd or folded header line, a repeated content-length): those are left
    to the HTTP parser, which knows every rule."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = data[:end].split(b"\r\n")
    if not lines[0].endswith(b" HTTP/1.1"):
        return None
    length, rid, close = 0, None, False
    seen_length = False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name[-1:] in (b" ", b"\t") or line[:1] in (b" ", b"\t"):
            return None
        name, value = name.lower(), value.strip(b" \t")
        if name == b"content-length":
            if seen_length or not value.isdigit():
                return None
            length, seen_length = int(value), True
        elif name in (b"transfer-encoding", b"expect", b"upgrade"):
            return None
        elif name == b"connection":
            close = value.lower() == b"close"
        elif name == REQUEST_ID_HEADER:
            rid = value
    if end + 4 + length != len(data):
        return None
    return WholeRequest(rid, close)
