"""An answer from the upstream: its status and headers, then its body as it arrives."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Protocol

from laneway.engines.http1.errors import UpstreamError

# Fed after the body's last piece.
END = object()


class Carrier(Protocol):
    """The connection an answer arrives on, as the answer sees it."""

    loop: asyncio.AbstractEventLoop
    high_water: int  # buffered body bytes past which the socket is paused

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def done_with(self, response: Http1Response) -> None:
        """The answer is released: the connection back to the pool if its body ended, else closed."""
        ...


class Http1Response:
    """An answer: status and headers on return from Http1Pool.request(); the body through
    read() or chunks(). Use it as an async context manager (or call release()): the connection
    goes back to the pool once the body has ended, and is closed if it has not."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_error",
        "_waiter",
        "complete",
        "conn",
        "head",
        "headers",
        "received",
        "released",
        "status",
        "until_close",
    )

    def __init__(self, conn: Carrier) -> None:
        self.conn = conn
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head: asyncio.Future[None] = conn.loop.create_future()
        self.received = False  # any byte of the answer yet
        self.complete = False
        self.released = False
        self.until_close = False
        self._chunks: collections.deque[object] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: UpstreamError | None = None

    def feed(self, item: object) -> None:
        self._chunks.append(item)
        if item is not END:
            self._buffered += len(item)  # type: ignore[arg-type]
            if self._buffered > self.conn.high_water:
                self.conn.pause()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, exc: UpstreamError) -> None:
        if self._error is None and not self.complete:
            self._error = exc
        if not self.head.done():
            self.head.set_exception(exc)
            self.head.exception()  # retrieved here: a request cancelled meanwhile never reads it
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body in the pieces it arrived in (decoded from chunked transfer), until its end."""
        queue = self._chunks
        while True:
            while queue:
                item = queue.popleft()
                if item is END:
                    return
                data: bytes = item  # type: ignore[assignment]
                self._buffered -= len(data)
                if self._buffered <= self.conn.high_water // 2:
                    self.conn.resume()
                yield data
            if self._error is not None:
                raise self._error
            self._waiter = self.conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def read(self) -> bytes:
        """The whole body."""
        parts = [data async for data in self.chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Done with this answer: the connection back to the pool if the body ended, else closed
        (the upstream sees its client leave). Idempotent."""
        if self.released:
            return
        self.released = True
        self.conn.done_with(self)

    async def __aenter__(self) -> Http1Response:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
