"""Race work against the client hanging up, so a request nobody waits for stops at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from laneway.api.request_ids import bind_call
from laneway.contracts.codes import ErrorCode
from laneway.contracts.scope import DISCONNECT_EXTENSION
from laneway.core.pipeline import Call

T = TypeVar("T")
# ASGI scope extension (laneway's server, server/uvicorn_fence.py): watch(callback) -> unwatch. The callback
# runs when the connection is lost (at once if it already is): no task per request for it.
Watch = Callable[[Callable[[], None]], Callable[[], None]]


class Connection(Protocol):
    """A request as until_disconnect reads it (Litestar's Request, or api/fast.py's)."""

    @property
    def scope(self) -> Any: ...
    @property
    def receive(self) -> Callable[[], Awaitable[Any]]: ...


class ClientDisconnected(Exception):
    pass


async def until_disconnect(request: Connection, work: Awaitable[T], call: Call) -> T:
    """Await `work` in this task while a watcher task listens for the client hanging up; if it
    does, the call is marked 499, this task is cancelled (the work stops at its current
    await, releasing what it holds into the call's lease) and ClientDisconnected is raised.

    Only for handlers that have read the whole body: the next ASGI message is then either
    nothing or `http.disconnect`.
    """
    current = asyncio.current_task()
    assert current is not None
    gone = False

    def left() -> None:
        nonlocal gone
        gone = True
        call.fail(ErrorCode.CLIENT_DISCONNECTED)
        current.cancel()

    scope: Any = request.scope
    watch: Watch | None = (scope.get("extensions") or {}).get(DISCONNECT_EXTENSION)
    stop: Callable[[], object]
    if watch is not None:
        stop = watch(left)
    else:  # another ASGI server: a watcher task reads the next message

        async def watcher() -> None:
            await _disconnected(request)
            left()

        stop = asyncio.ensure_future(watcher()).cancel
    try:
        result = await work
    except asyncio.CancelledError:
        if gone and current.cancelling():
            current.uncancel()
            raise ClientDisconnected from None
        raise
    finally:
        stop()
    if gone and current.cancelling():  # it finished as the client left: the cancel is ours
        current.uncancel()
        raise ClientDisconnected
    return result


async def _disconnected(request: Connection) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class HttpClient:
    """The pipeline's Client for an HTTP request: the admitted call is bound to the request's
    scope (its X-Request-Id, its trace, who accounts for it), and every wait races the client
    hanging up (ClientDisconnected, after the call is marked 499)."""

    __slots__ = ("request",)

    def __init__(self, request: Connection) -> None:
        self.request = request

    def bound(self, call: Call) -> None:
        bind_call(self.request.scope, call)

    async def watch(self, work: Awaitable[T], call: Call) -> T:
        return await until_disconnect(self.request, work, call)
