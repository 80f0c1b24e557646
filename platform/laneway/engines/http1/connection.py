"""One keep-alive connection to the upstream, parsed by llhttp (httptools)."""

from __future__ import annotations

import asyncio
from typing import Protocol

import httptools

from laneway.engines.http1.errors import ClosedBeforeAnswer, UpstreamError, UpstreamTimeout
from laneway.engines.http1.response import END, Http1Response


class ConnectionOwner(Protocol):
    """The pool a connection belongs to, as the connection sees it."""

    loop: asyncio.AbstractEventLoop
    read_timeout_s: float
    high_water: int

    def take_back(self, conn: Connection) -> None:
        """A connection whose answer ended and was released: idle again, or gone."""
        ...

    def drop(self, conn: Connection) -> None:
        """A connection that is closed (or closing): no longer counted."""
        ...


class Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request on it at a time (no pipelining)."""

    def __init__(self, pool: ConnectionOwner) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.high_water = pool.high_water
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False  # served a request before the one now on it
        self.idle_since = 0.0
        self.parser = httptools.HttpResponseParser(self)
        self.response: Http1Response | None = None
        self._paused = False
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        response = self.response
        if response is None:  # bytes nobody asked for: this connection cannot be trusted again
            self.abort()
            return
        response.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamError("the upstream switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"malformed answer from the upstream: {exc}"))

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        response = self.response
        if response is not None and not response.complete:
            if response.until_close and response.head.done():  # a body delimited by the close
                self.on_message_complete()
            elif not response.received:
                response.fail(ClosedBeforeAnswer("the upstream closed the connection before answering"))
            else:
                response.fail(UpstreamError(f"the upstream closed the connection mid-answer ({exc or 'EOF'})"))
        self.pool.drop(self)

    # llhttp callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        if response is not None:
            response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None:
            return
        status = self.parser.get_status_code()
        if status < 200:  # an interim answer (100 Continue): the real one follows
            response.headers.clear()
            return
        response.status = status
        headers = response.headers
        response.until_close = (
            "content-length" not in headers
            and "chunked" not in headers.get("transfer-encoding", "").lower()
            and status not in (204, 304)
        )
        if not response.head.done():
            response.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is not None:
            response.feed(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is None or response.complete or not response.status:  # none, or an interim answer
            return
        response.complete = True
        self._stop_timer()
        keep = not response.until_close and self.parser.should_keep_alive()
        if not keep:
            self.closed = True
        response.feed(END)  # the pool takes the connection back when the response is released

    # used by the response and the pool
    def start(self, response: Http1Response, data: bytes) -> None:
        self.response = response  # the parser goes on: llhttp reads one answer after another
        self._last_read = self.loop.time()
        self._arm()
        assert self.transport is not None
        self.transport.write(data)

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def done_with(self, response: Http1Response) -> None:
        if response.complete and not self.closed:
            self.pool.take_back(self)
        else:
            self.abort()
            self.pool.drop(self)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: UpstreamError) -> None:
        if self.response is not None:
            self.response.fail(exc)
        self.abort()

    # The read timeout: one timer per request, re-armed only when it fires early (a read since
    # resets nothing but a timestamp), instead of a timer rescheduled on every read.
    def _arm(self) -> None:
        timeout = self.pool.read_timeout_s
        if timeout and self._timer is None:
            self._timer = self.loop.call_at(self._last_read + timeout, self._check_read)

    def _check_read(self) -> None:
        self._timer = None
        response = self.response
        if response is None or response.complete:
            return
        if self._paused:  # the reader is slow, not the server: not a timeout
            self._last_read = self.loop.time()
        if self.loop.time() - self._last_read >= self.pool.read_timeout_s:
            timeout = self.pool.read_timeout_s
            response.fail(UpstreamTimeout(f"no data from the upstream for {timeout:g} s"))
            self.abort()
            return
        self._arm()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
