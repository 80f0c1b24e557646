"""A stream whose connection closes right after its last chunk is whole, not a hang-up.

A draining server (and any client that closes at once) closes the connection as soon as the
final body event is written; laneway's server then calls the disconnect watcher before the
response's task has seen its sender finish. That stream was delivered in full: its usage row
must say 200, not 499 client_disconnected.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from laneway.api.disconnect import DISCONNECT_EXTENSION
from laneway.api.responses import _LeasedASGIStream


class _Call:
    trace = None

    def __init__(self) -> None:
        self.failed: list[str] = []

    def fail(self, status: int, code: str) -> None:
        self.failed.append(code)


class _Lease:
    def __init__(self) -> None:
        self.call = _Call()
        self.released = False

    def release(self) -> None:
        self.released = True


async def _chunks() -> AsyncIterator[bytes]:
    for i in range(3):
        yield f"data: {i}\n\n".encode()


async def _stream(close_after_last: bool) -> _Lease:
    lease = _Lease()
    watchers: list[Callable[[], None]] = []
    loop = asyncio.get_running_loop()

    def watch(callback: Callable[[], None]) -> Callable[[], None]:
        watchers.append(callback)
        return lambda: watchers.remove(callback) if callback in watchers else None

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body") and close_after_last:
            # as uvicorn's transport.close(): connection_lost runs on the loop's next turn
            loop.call_soon(lambda: [w() for w in list(watchers)])

    async def receive() -> Any:
        await asyncio.Event().wait()

    response = _LeasedASGIStream(
        lease=lease,  # type: ignore[arg-type]
        send_timeout_s=0,
        iterator=_chunks(),
        content_length=0,
        headers={},
        media_type="text/event-stream",
        status_code=200,
    )
    scope: Any = {"type": "http", "extensions": {DISCONNECT_EXTENSION: watch}}
    await response(scope, receive, send)
    await asyncio.sleep(0)
    return lease


async def test_a_connection_closed_right_after_the_last_chunk_leaves_the_stream_whole() -> None:
    lease = await _stream(close_after_last=True)
    assert lease.released and lease.call.failed == []


async def test_a_hang_up_before_the_end_is_still_a_client_disconnect() -> None:
    lease = _Lease()
    watchers: list[Callable[[], None]] = []

    def watch(callback: Callable[[], None]) -> Callable[[], None]:
        watchers.append(callback)
        return lambda: None

    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield b"data: x\n\n"
            await asyncio.sleep(0.001)

    sent = 0

    async def send(message: Any) -> None:
        nonlocal sent
        sent += 1
        if sent == 3:
            asyncio.get_running_loop().call_soon(lambda: [w() for w in list(watchers)])

    async def receive() -> Any:
        await asyncio.Event().wait()

    response = _LeasedASGIStream(
        lease=lease,  # type: ignore[arg-type]
        send_timeout_s=0,
        iterator=endless(),
        content_length=0,
        headers={},
        media_type="text/event-stream",
        status_code=200,
    )
    await asyncio.wait_for(response({"type": "http", "extensions": {DISCONNECT_EXTENSION: watch}}, receive, send), 5)
    assert lease.released and lease.call.failed == ["client_disconnected"]
