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
    """Await `work`; if the client disconnects first, record 499 on the call, cancel the work,
    wait for it to stop, and raise ClientDisconnected. What the work took is held by the
    call's lease, which its owner releases.

    Only for handlers that have read the whole body: the next ASGI message is then either
    nothing or `http.disconnect`.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # this handler is being cancelled (server shutdown)
        watcher.cancel()
        await _stop(task)
        raise
    watcher.cancel()
    if task.done():
        return task.result()
    call.fail(CLIENT_CLOSED, "client_disconnected")
    await _stop(task)
    raise ClientDisconnected


async def _stop(task: asyncio.Future[Any]) -> None:
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved and dropped: nobody is left to tell


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
