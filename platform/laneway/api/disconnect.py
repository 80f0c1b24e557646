"""Race work against the client hanging up, so a request nobody waits for stops at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from litestar import Request

from laneway.core.pipeline import CLIENT_CLOSED, Call

T = TypeVar("T")


class ClientDisconnected(Exception):
    pass


async def until_disconnect(request: Request[Any, Any, Any], work: Awaitable[T], call: Call) -> T:
    """Await `work` in this task while a watcher task listens for the client hanging up; if it
    does, the call is marked 499, this task is cancelled (the work stops at its current
    await, releasing what it holds into the call's lease) and ClientDisconnected is raised.

    Only for handlers that have read the whole body: the next ASGI message is then either
    nothing or `http.disconnect`.
    """
    current = asyncio.current_task()
    assert current is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        await _disconnected(request)
        gone = True
        call.fail(CLIENT_CLOSED, "client_disconnected")
        current.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        result = await work
    except asyncio.CancelledError:
        if gone and current.cancelling():
            current.uncancel()
            raise ClientDisconnected from None
        raise
    finally:
        watcher.cancel()
    if gone and current.cancelling():  # it finished as the client left: the cancel is ours
        current.uncancel()
        raise ClientDisconnected
    return result


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
