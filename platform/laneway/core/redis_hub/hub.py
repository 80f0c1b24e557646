"""One owner of this process's Redis traffic: script calls made in the same event-loop turn go
out together, in the order made, on one pipelined connection of the hub's own.

Under load many requests reach Redis at the same moment (each reserves its rate limit and
queues for a shared engine slot). Sent one by one through a client, each call pays command
building, a pool checkout, a write and a read; batched, a turn's calls share one write, and
each reply resolves the oldest call waiting straight from the socket's data callback (hiredis
parses): no task, no per-read timeout context. A call made alone is sent alone, at the end of
its loop turn. A call may also *linger* (a settle, a refund: nobody waits on it): it then
rides with the next batch that someone waits on, or goes out after the linger.

Redis answers a connection's commands in order, so batches may be in flight side by side and
still run in the order they were made - which the shared engine slots rely on (a request's
leave never runs before its enqueue, a heartbeat's renewal never after a leave made once it
was sent), and the limiter (a settle after its reserve). The rate limiter, the quota counters'
recovery and the shared slots all call through one hub, so they share this order and its
writes. A script is loaded ahead of its first call on each connection, so that no call meets
NOSCRIPT and runs again later, out of order. The connection's timer fails the calls of a Redis
that stopped answering (frozen: `timeout_s`), and the connection with them.

Only public APIs: asyncio's transports, hiredis's `pack_command` and `Reader`, and redis-py's
exception classes (callers catch `RedisError`) and, for one-off commands and pub/sub, its
public client.
"""

from __future__ import annotations

import asyncio
import weakref
from functools import cached_property
from typing import Any

import hiredis
from redis import exceptions as rx

from laneway.core.redis_hub.address import parse_redis_url
from laneway.core.redis_hub.replies import Call, Connection, pack, reply_error
from laneway.core.redis_hub.script import LuaScript


class RedisHub:
    """Script calls on one pipelined connection (see the module's docstring), and a redis-py
    client on the same URL for what is not on a request's path (admin reads, pub/sub)."""

    def __init__(self, url: str, *, timeout_s: float = 0.25, max_connections: int = 64) -> None:
        self.url = url
        self.address = parse_redis_url(url)  # a URL this pipe cannot honour fails here, at start-up
        self.timeout_s = timeout_s
        self._max_connections = max_connections
        self._pending: list[Call] = []
        self._scheduled = False  # a flush is due at the end of this loop turn
        self._lingering: asyncio.TimerHandle | None = None  # a flush due after lingering calls' wait
        self.round_trips = 0  # batches sent (tests, benches)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._replies: Connection | None = None  # the open connection, once connected
        self._connecting: asyncio.Task[None] | None = None
        self._retried: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()  # sent twice already
        self._reloaded: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()  # met NOSCRIPT once

    @cached_property
    def client(self) -> Any:
        """redis-py's client on the hub's URL, for one-off commands off the request path: a
        bounded blocking pool (its default pool raises past its size), the hub's timeouts, and
        one retry on a connection error (a pooled connection gone stale after a restart)."""
        import redis.asyncio as redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        pool = redis.BlockingConnectionPool.from_url(
            self.url,
            max_connections=self._max_connections,
            timeout=self.timeout_s,  # waiting for a free pooled connection
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
            retry=Retry(NoBackoff(), 1, supported_errors=(rx.ConnectionError,)),
            health_check_interval=30,
        )
        return redis.Redis(connection_pool=pool)

    def subscriber(self) -> Any:
        """A redis-py client of its own for a pub/sub subscription (a subscribed connection runs
        no other command); the caller closes it. No read timeout: it waits for messages."""
        import redis.asyncio as redis

        return redis.Redis.from_url(self.url, socket_connect_timeout=1.0, health_check_interval=10)

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, kept: on Python 3.11 each asyncio.get_running_loop() is a getpid()
        system call (a fork check), and this runs several times a request."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def call(self, script: LuaScript, keys: list[str], args: list[Any], *, linger: float = 0.0) -> asyncio.Future[Any]:
        """Run `script` with the next batch; the future gets its reply or its exception (a fault
        of the connection fails the calls it had not answered). With `linger`, the call waits
        up to that long for a batch to share (nobody waits on it)."""
        loop = self.loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((script, keys, args, future))
        if self._scheduled:
            return future
        if linger > 0:
            if self._lingering is None:
                self._lingering = loop.call_later(linger, self._linger_over)
            return future
        self._scheduled = True
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
        loop.call_soon(self._flush)
        return future

    def _linger_over(self) -> None:
        self._lingering = None
        if not self._scheduled:
            self._scheduled = True
            self._flush()

    def flush_soon(self) -> None:
        """Send the lingering calls now (shutting down)."""
        if self._lingering is not None:
            self._lingering.cancel()
            self._linger_over()

    def _flush(self) -> None:
        self._scheduled = False
        replies = self._replies
        if replies is None or replies.lost:
            if self._connecting is None:  # what is pending goes out once connected
                self._connecting = self.loop().create_task(self._connect(), name="redis-hub")
            return
        batch, self._pending = self._pending, []
        if batch:
            self.round_trips += 1
            batch = self._loads(replies, batch) + batch
            replies.send(b"".join([pack(call) for call in batch]), batch)

    def _loads(self, replies: Connection, batch: list[Call]) -> list[Call]:
        """SCRIPT LOAD ahead of a script's first call on this connection: the call then cannot
        meet NOSCRIPT, whose recovery (running it again) would put it after the calls sent
        behind it - a leave before its enqueue, say. Nobody waits on the load's reply (its
        future is done already)."""
        loads: list[Call] = []
        for script, *_ in batch:
            if script is not None and script.sha not in replies.loaded:
                replies.loaded.add(script.sha)
                answered: asyncio.Future[Any] = self.loop().create_future()
                answered.cancel()
                loads.append((None, [], ["SCRIPT", "LOAD", script.source], answered))
        return loads

    async def _connect(self) -> None:
        connection = Connection(self, self.timeout_s)
        try:
            await self._open(connection)
        except BaseException as exc:
            # Fail what waited for this connection before anything can await: a call made
            # meanwhile starts a connection of its own, not one this fault fails.
            batch, self._pending = self._pending, []
            _fail([future for *_, future in batch], exc)
            self._connecting = None
            connection.close()
            if not isinstance(exc, Exception):
                raise
            return
        self._connecting = None
        self._replies = connection
        if self._pending and not self._lingering:
            self._flush()

    async def _open(self, connection: Connection) -> None:
        """Connect (within the timeout), then AUTH and SELECT as the URL asks."""
        address, loop = self.address, self.loop()
        try:
            async with asyncio.timeout(self.timeout_s):
                if address.unix_path is not None:
                    await loop.create_unix_connection(lambda: connection, address.unix_path)
                else:
                    await loop.create_connection(lambda: connection, address.host, address.port, ssl=address.tls)
        except TimeoutError:
            raise rx.TimeoutError(f"Timeout connecting to Redis at {address.where}") from None
        except OSError as exc:
            raise rx.ConnectionError(f"Error connecting to Redis at {address.where}: {exc}") from exc
        hello: list[Call] = [(None, [], words, loop.create_future()) for words in address.handshake()]
        if hello:
            self._retried.update(call[3] for call in hello)  # cut off: this connection's failure, not re-sent
            connection.send(b"".join([pack(call) for call in hello]), hello)
            for call in hello:
                await call[3]  # an error reply (a wrong password) or the connection's timeout raises

    def answer(self, call: Call, reply: Any) -> None:
        future = call[3]
        if future.done():  # its caller left (a cancelled reserve): the reply only keeps the order
            return
        if isinstance(reply, hiredis.ReplyError):
            error = reply_error(str(reply))
            script = call[0]
            # Redis restarted or flushed its scripts under this connection: load it, run it again.
            if isinstance(error, rx.NoScriptError) and script is not None and future not in self._reloaded:
                self._reloaded.add(future)
                if self._replies is not None:
                    self._replies.loaded.discard(script.sha)
                self._pending.append(call)
                self._flush_now_or_soon()
                return
            future.set_exception(error)
        else:
            future.set_result(reply)

    def _flush_now_or_soon(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop().call_soon(self._flush)

    def lost(self, unanswered: list[Call], exc: BaseException, fresh: bool) -> None:
        """The connection failed with calls unanswered. After a connection error with no reply
        since they were sent (a connection gone stale: Redis restarted), they are sent once more
        on a new one, as redis-py's client retries; a timeout never is (the calls may have run)."""
        if not unanswered:  # an idle connection closed: the next call connects again
            return
        if fresh and isinstance(exc, rx.ConnectionError) and not any(c[3] in self._retried for c in unanswered):
            self._retried.update(c[3] for c in unanswered)
            self._pending[:0] = unanswered
            self._flush_now_or_soon()
            return
        _fail([future for *_, future in unanswered], exc)

    async def close(self) -> None:
        """Send what is pending, wait for its answers (or their timeout), close the connections."""
        self.flush_soon()
        while True:
            waiting = [call[3] for call in self._pending]
            if self._replies is not None:
                waiting += [entry[0][3] for entry in self._replies.waiting]
            waiting = [f for f in waiting if not f.done()]
            if not waiting:
                break
            await asyncio.wait(waiting)
        if self._replies is not None:
            self._replies.close()
        if "client" in self.__dict__:  # built (cached_property): close its pool
            await self.client.aclose()


def _fail(futures: list[asyncio.Future[Any]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(exc)
