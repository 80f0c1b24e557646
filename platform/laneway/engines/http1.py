"""A lean HTTP/1.1 client for the engines laneway reaches over HTTP (vLLM's OpenAI server).

Why not aiohttp: its request path (the session, the connector's bookkeeping, the response's
StreamReader, timers per read) cost 3x this client's CPU per request against the same
upstream (bench/upstream_client.py), and replacing it took the gateway's CPU per request down
16 % (non-streaming) and 27 % (16-chunk streams) in an interleaved A/B (README). The
upstream is one known server speaking HTTP/1.1 on keep-alive connections, so this client
does only that: one asyncio.Protocol per connection, llhttp (the C parser in `httptools`,
already here for uvicorn) for status, headers, chunked and content-length bodies, a bounded
pool of keep-alive connections, TLS for an `https` upstream (asyncio's, with the system's
trust store or a given context), and nothing else (no redirects, cookies, proxies or
compression).

Semantics the engine adapters rely on:
- Closing a response before its body has ended closes the connection (never reused): the
  engine sees its client leave and aborts the request (vLLM frees the sequence). A task
  cancelled while waiting for the answer's head does the same.
- A connection that the server closed while idle in the pool (its keep-alive timeout) is
  dropped; a request that finds it closed before any byte of the answer came back is sent
  once more on a fresh connection. Nothing else is retried.
- A read timeout (`read_timeout_s`: no byte from the server for that long, while an answer
  is awaited) and a connect timeout end the request with UpstreamTimeout; a connection
  refused, reset or closed mid-answer with UpstreamError. Both leave the pool consistent.
- At most `limit` connections; a request beyond them waits for one to be returned.
- A body that arrives faster than it is read pauses the socket past `high_water` bytes.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from urllib.parse import urlsplit

import httptools


class UpstreamError(Exception):
    """The connection failed: refused, reset, closed before the answer ended, or a malformed answer."""


class UpstreamTimeout(UpstreamError, TimeoutError):
    """No connection within the connect timeout, or no byte of the answer within the read timeout."""


class _Closed(UpstreamError):
    """The connection was closed before any byte of the answer arrived (retryable once on a reused one)."""


_DONE = object()


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request on it at a time (no pipelining)."""

    def __init__(self, pool: Http1Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
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
                response.fail(_Closed("the upstream closed the connection before answering"))
            else:
                response.fail(UpstreamError(f"the upstream closed the connection mid-answer ({exc or 'EOF'})"))
        self.pool._forget(self)

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
        response.feed(_DONE)  # the pool takes the connection back when the response is released

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


class Http1Response:
    """An answer: status and headers on return from Http1Pool.request(); the body through
    read() or chunks(). Use it as an async context manager (or call release()): the connection
    goes back to the pool once the body has ended, and is closed if it has not."""

    __slots__ = ("_buffered", "_chunks", "_error", "_waiter", "complete", "conn", "head", "headers",
                 "received", "released", "status", "until_close")  # fmt: skip

    def __init__(self, conn: _Connection) -> None:
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
        if item is not _DONE:
            self._buffered += len(item)  # type: ignore[arg-type]
            if self._buffered > self.conn.pool.high_water:
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
                if item is _DONE:
                    return
                data: bytes = item  # type: ignore[assignment]
                self._buffered -= len(data)
                if self._buffered <= self.conn.pool.high_water // 2:
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
        conn = self.conn
        if self.complete and not conn.closed:
            conn.pool._release(conn)
        else:
            conn.abort()
            conn.pool._forget(conn)

    async def __aenter__(self) -> Http1Response:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class Http1Pool:
    """Keep-alive connections to one upstream (`http://` or `https://host:port`, an optional base path)."""

    def __init__(
        self,
        base_url: str,
        *,
        limit: int = 64,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 600.0,
        keepalive_s: float = 4.0,
        headers: Iterable[tuple[str, str]] = (),
        high_water: int = 256 * 1024,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"the upstream must be an http:// or https:// URL, not {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        # https: the given context (a private CA), else the system's trust store.
        self.tls = (tls or ssl.create_default_context()) if url.scheme == "https" else None
        self.base_path = url.path.rstrip("/")
        self.limit = limit
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        # Below the upstream's own idle timeout (uvicorn's, under vLLM: 5 s), so that a reused
        # connection is rarely one the server is closing at that moment.
        self.keepalive_s = keepalive_s
        self.high_water = high_water
        host_header = url.netloc.rsplit("@", 1)[-1]
        self._fixed = _header_lines([("Host", host_header), *headers])
        self.loop = asyncio.get_running_loop()
        self._idle: collections.deque[_Connection] = collections.deque()
        self._all: set[_Connection] = set()
        self._opening = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    @property
    def connections(self) -> int:
        """Open connections (in use or idle)."""
        return len(self._all)

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Iterable[tuple[str, str]] = (),
    ) -> Http1Response:
        """Send one request and wait for the answer's head. Raises UpstreamError/UpstreamTimeout.
        A task cancelled while waiting closes the connection (the upstream sees it leave)."""
        head = b"".join((
            method.encode("ascii"), b" ", (self.base_path + path).encode("ascii"), b" HTTP/1.1\r\n",
            self._fixed, _header_lines(headers), b"Content-Length: ", str(len(body)).encode("ascii"),
            b"\r\n\r\n",
        ))  # fmt: skip
        data = head + body if len(body) < 64 * 1024 else None
        for attempt in (0, 1):
            conn = await self._acquire()
            response = Http1Response(conn)
            try:
                conn.start(response, data if data is not None else head)
                if data is None:
                    assert conn.transport is not None
                    conn.transport.write(body)
                await response.head
            except _Closed:
                response.release()
                if conn.reused and attempt == 0:  # the server closed it while it idled: once more
                    continue
                raise UpstreamError("the upstream closed the connection before answering") from None
            except BaseException:
                response.release()  # closes it: a cancelled request is aborted at the upstream
                raise
            return response
        raise AssertionError("unreachable")

    async def _acquire(self) -> _Connection:
        if self._closed:
            raise UpstreamError("the upstream client is closed")
        now = self.loop.time()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the warmest, the least likely closed
            if conn.closed or (conn.transport is not None and conn.transport.is_closing()):
                self._forget(conn)
                continue
            if now - conn.idle_since > self.keepalive_s:
                conn.abort()
                self._forget(conn)
                continue
            conn.reused = True
            return conn
        while len(self._all) + self._opening >= self.limit:
            waiter = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake()  # it was woken but is leaving: pass the turn on
                raise
            if self._idle:
                return await self._acquire()
        return await self._open()

    async def _open(self) -> _Connection:
        self._opening += 1
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await self.loop.create_connection(lambda: _Connection(self), self.host, self.port,
                                                            ssl=self.tls)  # fmt: skip
        except TimeoutError:
            raise UpstreamTimeout(
                f"no connection to {self.host}:{self.port} within {self.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        finally:
            self._opening -= 1
            self._wake()  # a failed attempt frees its place for a waiter
        self._all.add(conn)
        return conn

    def _release(self, conn: _Connection) -> None:
        """A connection whose answer ended and was released: idle again, or gone."""
        conn.response = None
        if conn.closed or self._closed:
            conn.abort()
            self._forget(conn)
            return
        conn.idle_since = self.loop.time()
        self._idle.append(conn)
        self._wake()

    def _forget(self, conn: _Connection) -> None:
        if conn in self._all:
            self._all.discard(conn)
            try:
                self._idle.remove(conn)
            except ValueError:
                pass
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        """Close every connection (those in use too: their requests fail)."""
        self._closed = True
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(UpstreamError("the upstream client is closed"))
        await asyncio.sleep(0)  # let the transports' connection_lost run


def _header_lines(headers: Iterable[tuple[str, str]]) -> bytes:
    out = []
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"invalid header {name!r}")
        out.append(f"{name}: {value}\r\n")
    return "".join(out).encode("latin-1")
