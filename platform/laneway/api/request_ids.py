"""X-Request-Id on every response, and the one id a request is known by end to end.

A client's own X-Request-Id is kept when it is sane (1-64 characters of [A-Za-z0-9_.:-];
64 is the usage table's request_id column): it is echoed back, written to the usage row,
sent to the engine and named in log lines. Anything else is ignored, never refused: a
tracing header must not fail a request. Without one, an admitted completion answers with
its own id (chatcmpl-.../cmpl-..., as in its body) and any other response with a fresh
req_... id.

The client's id is not the gateway's internal id: two clients may send the same one (or a
retry resends it), while the internal id keys rate-limit holders, scheduler tickets and
shared-slot members in Redis, so it must stay unique. The engine gets "<client id>:<internal
id>" for the same reason (vLLM refuses a second running request with the same id).

One before_send hook stamps the header; for a completion it is read off the admitted call,
which the route puts in the ASGI scope when it opens the lease (the error handlers also see
there that the lease has accounted for the request).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from litestar.types import Message, Scope

from laneway.contracts.scope import CALL_KEY, REQUEST_ID_HEADER, TRACE_KEY
from laneway.contracts.scope import REQUEST_ID_KEY as _ID_KEY
from laneway.core.ids import random_hex

if TYPE_CHECKING:
    from laneway.core.pipeline import Call

HEADER = REQUEST_ID_HEADER
_SANE = r"[A-Za-z0-9_.:\-]{1,64}"
_SANE_TEXT = re.compile(_SANE)
_SANE_BYTES = re.compile(_SANE.encode())


def client_request_id(value: str | None) -> str | None:
    """The client's X-Request-Id if it is sane, else None (a fresh id is used instead)."""
    return value if value is not None and _SANE_TEXT.fullmatch(value) else None


def bind_call(scope: Scope, call: Call) -> None:
    """The request is admitted as `call`: its responses (errors too) carry the call's id, and
    its lease, not an error handler, accounts for it (and, when tracing is on, ends its span)."""
    state = cast(dict[str, Any], scope)
    state[CALL_KEY] = call
    trace = state.get(TRACE_KEY)
    if trace is not None:
        trace.bind(call)


def admitted(scope: Scope) -> bool:
    return CALL_KEY in scope


def request_id(scope: Scope) -> str:
    """The id this request answers with (decided once): its call's, else the client's, else fresh."""
    state = cast(dict[str, Any], scope)
    call: Call | None = state.get(CALL_KEY)
    if call is not None:
        return call.public_id
    rid: str | None = state.get(_ID_KEY)
    if rid is None:
        sent = sent_request_id(scope.get("headers", ()))
        rid = state[_ID_KEY] = sent.decode("ascii") if sent is not None else fresh_request_id()
    return rid


def fresh_request_id() -> str:
    return "req_" + random_hex()


def sane_request_id(value: bytes) -> bool:
    return _SANE_BYTES.fullmatch(value) is not None


def sent_request_id(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The client's X-Request-Id among raw (lower-cased) request headers, if it is sane."""
    for name, value in headers:
        if name == HEADER:
            return value if sane_request_id(value) else None
    return None


async def stamp_request_id(message: Message, scope: Scope) -> None:
    """A before_send hook: X-Request-Id on the start of every HTTP response (one check per
    body message: streams pay nothing per chunk beyond it)."""
    if message["type"] != "http.response.start":
        return
    headers = message.get("headers") or ()
    for name, _ in headers:
        if name.lower() == HEADER:  # set by the handler: it knows better
            return
    message["headers"] = [*headers, (HEADER, request_id(scope).encode())]
