"""A streamed response that owns its request's Lease until the stream is over.

The handler admits the request, then hands the lease to this response with no await in
between; from then on the response's `finally` is the one place it is released, whatever
ends the stream: the last byte sent, the client hanging up (499), a client that stops
reading (a send blocked for `send_timeout_s`: 499 slow_client, and the connection is
aborted), an engine fault or a shutdown (an error event, 503), or the server cancelling
the task. A response that is never sent at all (the framework failed after the handler
returned) is released by a finalizer on its body, and that is logged: it is a bug.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar import Request
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Receive, Scope, Send

from laneway.api.disconnect import Watch
from laneway.contracts.codes import ErrorCode
from laneway.contracts.scope import ABORT_EXTENSION, DISCONNECT_EXTENSION
from laneway.core.pipeline import Lease

log = logging.getLogger("laneway.api")

# The transport's abort(), put in the ASGI scope by laneway's HTTP protocol (server/uvicorn_fence.py): a
# client that stopped reading is cut off instead of being left holding buffered bytes.


def _release_unsent(lease: Lease) -> None:
    if not lease.released:
        log.error("the stream of %s was never sent; releasing its lease", lease.call.generation.request_id)
        lease.release()


def _on_body_collected(loop: asyncio.AbstractEventLoop, lease: Lease) -> None:
    """The body was garbage-collected (from any thread): check the lease on its loop."""
    if not lease.released and not loop.is_closed():
        loop.call_soon_threadsafe(_release_unsent, lease)


class LeasedStream(Stream):
    def __init__(
        self, lease: Lease, body: AsyncIterator[bytes], *, headers: dict[str, str], send_timeout_s: float
    ) -> None:
        super().__init__(body, media_type="text/event-stream", headers=headers)
        self.lease = lease
        self.send_timeout_s = send_timeout_s
        safety_net = weakref.finalize(body, _on_body_collected, asyncio.get_running_loop(), lease)
        safety_net.atexit = False  # at interpreter exit the loop is gone, and so is the lease

    def to_asgi_response(self, app: Any, request: Request[Any, Any, Any], **kwargs: Any) -> ASGIResponse:
        headers = {**kwargs.get("headers", {}), **self.headers}
        return _LeasedASGIStream(
            lease=self.lease,
            send_timeout_s=self.send_timeout_s,
            iterator=self.iterator,
            content_length=0,
            headers=headers,
            cookies=kwargs.get("cookies"),
            encoded_headers=kwargs.get("encoded_headers"),
            media_type="text/event-stream",
            status_code=self.status_code or kwargs.get("status_code"),
        )


class _LeasedASGIStream(ASGIStreamingResponse):
    __slots__ = ("_blocked_since", "_ended", "_loop", "_scope", "_stalled", "lease", "send_timeout_s")

    def __init__(self, *, lease: Lease, send_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lease = lease
        self.send_timeout_s = send_timeout_s
        self._scope: Any = None
        self._blocked_since: float | None = None  # when the send under way began
        self._stalled = False
        self._ended = False  # the last body event is out: a hang-up after it loses nothing
        # Looked up once: asyncio.get_running_loop() costs a getpid() system call, per chunk.
        self._loop = asyncio.get_running_loop()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._scope = scope
        trace = self.lease.call.trace
        if trace is not None:
            trace.stream_started()
        try:
            await super().__call__(scope, receive, send)
        finally:
            if trace is not None:
                trace.stream_ended(self.lease.call)
            self.lease.release()

    async def send_body(self, send: Send, receive: Receive) -> None:
        sender = asyncio.ensure_future(self._send_chunks(send))
        watch: Watch | None = ((self._scope or {}).get("extensions") or {}).get(DISCONNECT_EXTENSION)
        watcher: asyncio.Future[None] | None = None
        unwatch: Callable[[], object]
        if watch is not None:  # laneway's server tells when the connection goes: no task for it

            def gone() -> None:
                # The connection can close between the last chunk's send and this task seeing
                # the sender done (a draining server closes it at once): that stream was whole.
                if self._ended or sender.done():
                    return
                self.lease.call.fail(ErrorCode.CLIENT_DISCONNECTED)
                sender.cancel()

            unwatch = watch(gone)
        else:  # another ASGI server: a task waits for the disconnect message
            watcher = asyncio.ensure_future(_disconnected(receive))
            unwatch = watcher.cancel
        loop = asyncio.get_running_loop()
        # One watchdog timer per stream, not a timeout armed around every chunk's send (that
        # was ~8 % of a stream's CPU): it cuts the stream once a single send has stayed blocked
        # for send_timeout_s (checked every quarter of it, so a cut comes within 1.25 times the timeout).
        period = self.send_timeout_s / 4
        watchdog: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal watchdog
            since = self._blocked_since
            if since is not None and loop.time() - since >= self.send_timeout_s and not sender.done():
                self._stalled = True
                self.lease.call.fail(ErrorCode.SLOW_CLIENT)  # 499: the client's side, however laneway ended it
                sender.cancel()
                return
            watchdog = loop.call_later(period, check)

        watchdog = loop.call_later(period, check) if self.send_timeout_s > 0 else None
        try:
            await asyncio.wait({sender} if watcher is None else {sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if watchdog is not None:
                watchdog.cancel()
            unwatch()
            if not sender.done():  # the client hung up (or this task is being cancelled)
                if watcher is not None and watcher.done() and not watcher.cancelled() and not self._ended:
                    self.lease.call.fail(ErrorCode.CLIENT_DISCONNECTED)
                sender.cancel()
                await asyncio.wait({sender})
        if self._stalled:
            extensions = (self._scope or {}).get("extensions") or {}
            abort = extensions.get(ABORT_EXTENSION)
            if callable(abort):
                abort()
        elif not sender.cancelled() and sender.exception() is not None:
            raise sender.exception()  # type: ignore[misc]

    async def _send_chunks(self, send: Send) -> None:
        body = self.iterator
        try:
            async for chunk in body:
                data = chunk if isinstance(chunk, bytes) else chunk.encode(self.encoding)
                await self._send(send, data, more=True)
            await self._send(send, b"", more=False)
            self._ended = True
        finally:
            # Cut short inside a send, the body is suspended, not finished: close it now, which
            # stops its generation (left to the garbage collector it would run on meanwhile).
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _send(self, send: Send, data: bytes, *, more: bool) -> None:
        """One body event; the watchdog (send_body) ends the stream if it stays blocked (the
        client's socket is full because it does not read) for send_timeout_s."""
        self._blocked_since = self._loop.time()
        try:
            await send({"type": "http.response.body", "body": data, "more_body": more})
        finally:
            self._blocked_since = None


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
