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
from laneway.api.leased_stream import _LeasedASGIStream
from laneway.contracts.codes import ErrorCode


class _Call:
    trace = None

    def __init__(self) -> None:
        self.failed: list[ErrorCode] = []

    def fail(self, code: ErrorCode) -> None:
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


async def _endless() -> AsyncIterator[bytes]:
    while True:
        yield b"data: x\n\n"
        await asyncio.sleep(0.001)


async def _stream(body: AsyncIterator[bytes], hang_up: Callable[[Any, int], bool]) -> _Lease:
    """Send `body` through the leased stream on laneway's disconnect watcher; the connection
    is lost on the loop's next turn (as after uvicorn's transport.close()) after the body
    event for which hang_up(message, events sent so far) is true."""
    lease = _Lease()
    watchers: list[Callable[[], None]] = []
    loop = asyncio.get_running_loop()
    sent = 0

    def watch(callback: Callable[[], None]) -> Callable[[], None]:
        watchers.append(callback)
        return lambda: watchers.remove(callback) if callback in watchers else None

    async def send(message: Any) -> None:
        nonlocal sent
        sent += 1
        if message["type"] == "http.response.body" and hang_up(message, sent):
            loop.call_soon(lambda: [w() for w in list(watchers)])

    async def receive() -> Any:
        await asyncio.Event().wait()

    response = _LeasedASGIStream(
        lease=lease,  # type: ignore[arg-type]
        send_timeout_s=0,
        iterator=body,
        content_length=0,
        headers={},
        media_type="text/event-stream",
        status_code=200,
    )
    scope: Any = {"type": "http", "extensions": {DISCONNECT_EXTENSION: watch}}
    await asyncio.wait_for(response(scope, receive, send), 5)
    await asyncio.sleep(0)
    return lease


async def test_a_connection_closed_right_after_the_last_chunk_leaves_the_stream_whole() -> None:
    lease = await _stream(_chunks(), lambda message, _: not message.get("more_body"))
    assert lease.released and lease.call.failed == []


async def test_a_hang_up_before_the_end_is_still_a_client_disconnect() -> None:
    lease = await _stream(_endless(), lambda _, sent: sent == 3)
    assert lease.released and lease.call.failed == ["client_disconnected"]
