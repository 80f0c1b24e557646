"""A bounded pool of keep-alive connections to one upstream, and the request that uses one."""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Iterable
from urllib.parse import urlsplit

from laneway.engines.http1.connection import Connection
from laneway.engines.http1.errors import ClosedBeforeAnswer, UpstreamError, UpstreamTimeout
from laneway.engines.http1.response import Http1Response


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
        self._idle: collections.deque[Connection] = collections.deque()
        self._all: set[Connection] = set()
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
        head = b"".join(
            (
                method.encode("ascii"),
                b" ",
                (self.base_path + path).encode("ascii"),
                b" HTTP/1.1\r\n",
                self._fixed,
                _header_lines(headers),
                b"Content-Length: ",
                str(len(body)).encode("ascii"),
                b"\r\n\r\n",
            )
        )
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
            except ClosedBeforeAnswer:
                response.release()
                if conn.reused and attempt == 0:  # the server closed it while it idled: once more
                    continue
                raise UpstreamError("the upstream closed the connection before answering") from None
            except BaseException:
                response.release()  # closes it: a cancelled request is aborted at the upstream
                raise
            return response
        raise AssertionError("unreachable")

    async def _acquire(self) -> Connection:
        if self._closed:
            raise UpstreamError("the upstream client is closed")
        now = self.loop.time()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the warmest, the least likely closed
            if conn.closed or (conn.transport is not None and conn.transport.is_closing()):
                self.drop(conn)
                continue
            if now - conn.idle_since > self.keepalive_s:
                conn.abort()
                self.drop(conn)
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

    async def _open(self) -> Connection:
        self._opening += 1
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await self.loop.create_connection(
                    lambda: Connection(self), self.host, self.port, ssl=self.tls
                )
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

    def take_back(self, conn: Connection) -> None:
        """A connection whose answer ended and was released: idle again, or gone."""
        conn.response = None
        if conn.closed or self._closed:
            conn.abort()
            self.drop(conn)
            return
        conn.idle_since = self.loop.time()
        self._idle.append(conn)
        self._wake()

    def drop(self, conn: Connection) -> None:
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
