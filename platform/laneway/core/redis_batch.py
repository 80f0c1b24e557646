"""Redis script calls made in the same event-loop turn, sent together, in the order made.

Under load many requests reach Redis at the same moment (each reserves its rate limit and
queues for a shared engine slot). Sent one by one, each call pays the client's command
building, a write and a read; batched, a turn's calls share one write and one read, and the
gateway's CPU per request in Redis mode drops towards the memory mode's. A call made alone
is sent alone, at the end of its loop turn. A call may also *linger* (a settle, a refund:
nobody waits on it): it then rides with the next batch that someone waits on, or goes out
after the linger.

`ScriptPipe`: one connection of its own, pipelined. Each batch is one write as soon as the
turn ends, and each reply resolves the oldest call waiting, straight from the socket's data
callback (hiredis parses): no task, no per-read timeout context, no pool checkout per batch.
Redis answers a connection's commands in order, so batches may be in flight side by side and
still run in the order they were made - which the shared engine slots rely on (a request's
leave never runs before its enqueue, a heartbeat's renewal never after a leave made once it
was sent), and the limiter (a settle after its reserve). A script is loaded ahead of its
first call on each connection, so that no call meets NOSCRIPT and has to run again later,
out of order. One timer per connection fails the calls of a Redis that stopped answering
(frozen: `timeout_s`), and the connection with them. redis-py makes the connection (its URL,
TLS, AUTH and SELECT handling) and the pipe then takes over its transport. Through redis-py's
client, a round trip cost ~200 us of CPU, 20x the memory limiter's whole decision
(bench/redis_limits.py).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from contextlib import suppress
from typing import Any

import hiredis  # a dependency: redis[hiredis]
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

_Call = tuple[Any, list[str], list[Any], asyncio.Future[Any]]


def _pack(script: Any, keys: list[str], args: list[Any]) -> bytes:
    if script is None:  # ScriptPipe._loads
        return bytes(hiredis.pack_command(("SCRIPT", "LOAD", *args)))
    return bytes(hiredis.pack_command(("EVALSHA", script.sha, len(keys), *keys, *args)))


class ScriptPipe:
    """Script calls on one pipelined connection of its own (see the module's docstring)."""

    def __init__(self, redis: Any, *, timeout_s: float) -> None:
        self._redis = redis
        self._timeout = timeout_s
        self._pending: list[_Call] = []
        self._scheduled = False  # a flush is due at the end of this loop turn
        self._lingering: asyncio.TimerHandle | None = None  # a flush due after lingering calls' wait
        self.round_trips = 0  # batches sent (tests, benches)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._replies: _Replies | None = None  # the open connection's reader, once connected
        self._connecting: asyncio.Task[None] | None = None
        self._retried: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()  # sent twice already

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, kept: on Python 3.11 each asyncio.get_running_loop() is a getpid()
        system call (a fork check), and this runs several times a request."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def call(self, script: Any, keys: list[str], args: list[Any], *, linger: float = 0.0) -> asyncio.Future[Any]:
        """Run `script` (a registered redis-py Script) with the next batch; the future gets its
        reply or its exception (a fault of the connection fails the calls it had not answered).
        With `linger`, the call waits up to that long for a batch to share (nobody waits on it)."""
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
                self._connecting = self.loop().create_task(self._connect(), name="redis-pipe")
            return
        batch, self._pending = self._pending, []
        if batch:
            self.round_trips += 1
            batch = self._loads(replies, batch) + batch
            replies.send(b"".join([_pack(script, keys, args) for script, keys, args, _ in batch]), batch)

    def _loads(self, replies: _Replies, batch: list[_Call]) -> list[_Call]:
        """SCRIPT LOAD ahead of a script's first call on this connection: the call then cannot
        meet NOSCRIPT, whose recovery (running it again on another connection) would put it
        after the calls sent behind it - a leave before its enqueue, say. Nobody waits on the
        load's reply (its future is done already)."""
        loads: list[_Call] = []
        for script, *_ in batch:
            if script is not None and script.sha not in replies.loaded:
                replies.loaded.add(script.sha)
                answered: asyncio.Future[Any] = self.loop().create_future()
                answered.cancel()
                loads.append((None, [], [script.script], answered))
        return loads

    async def _connect(self) -> None:
        conn: Any = None
        try:
            conn = self._redis.connection_pool.make_connection()  # the client's URL, timeouts, TLS, AUTH, db
            await conn.connect()
            transport = conn._writer.transport  # redis-py's asyncio streams: take over their transport
        except BaseException as exc:
            # Fail what waited for this connection before anything can await: a call made
            # meanwhile starts a connection of its own, not one this fault fails.
            batch, self._pending = self._pending, []
            _fail([future for *_, future in batch], exc)
            self._connecting = None
            if conn is not None:
                with suppress(Exception):
                    await conn.disconnect(nowait=True)
            if not isinstance(exc, Exception):
                raise
            return
        self._connecting = None
        self._replies = _Replies(self, conn, transport, self._timeout)
        transport.set_protocol(self._replies)
        if self._pending and not self._lingering:
            self._flush()

    def _answer(self, call: _Call, reply: Any) -> None:
        future = call[3]
        if future.done():  # its caller left (a cancelled reserve): the reply only keeps the order
            return
        if isinstance(reply, hiredis.ReplyError):
            error = BaseParser.parse_error(str(reply))  # type: ignore[no-untyped-call]
            if isinstance(error, NoScriptError):  # Redis restarted: load it, then run it
                self.loop().create_task(self._load_and_run(call))
                return
            future.set_exception(error)
        else:
            future.set_result(reply)

    @staticmethod
    async def _load_and_run(call: _Call) -> None:
        script, keys, args, future = call
        try:
            reply = await script(keys=keys, args=args)
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
            return
        if not future.done():
            future.set_result(reply)

    def _lost(self, unanswered: list[_Call], exc: BaseException, fresh: bool) -> None:
        """The connection failed with calls unanswered. After a connection error with no reply
        since they were sent (a connection gone stale: Redis restarted), they are sent once more
        on a new one, as redis-py's client retries; a timeout never is (the calls may have run)."""
        if not unanswered:  # an idle connection closed: the next call connects again
            return
        if fresh and isinstance(exc, RedisConnectionError) and not any(c[3] in self._retried for c in unanswered):
            self._retried.update(c[3] for c in unanswered)
            self._pending[:0] = unanswered
            if not self._scheduled:
                self._scheduled = True
                self.loop().call_soon(self._flush)
            return
        _fail([future for *_, future in unanswered], exc)

    async def close(self) -> None:
        """Send what is pending, wait for its answers (or their timeout), close the connection."""
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


def _fail(futures: list[asyncio.Future[Any]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(exc)


class _Replies(asyncio.Protocol):
    """The pipe's connection: each reply, parsed by hiredis as bytes arrive, answers the oldest
    call waiting. A Redis silent for `timeout_s` while calls wait is dropped with them."""

    def __init__(self, pipe: ScriptPipe, conn: Any, transport: Any, timeout_s: float) -> None:
        self._pipe = pipe
        self._conn = conn  # held: redis-py closes its transport when the connection object is collected
        self._transport = transport
        self._timeout = timeout_s
        self._reader = hiredis.Reader()
        self._timer: asyncio.TimerHandle | None = None
        # (call, deadline, replies read before it was sent), in the order sent
        self.waiting: deque[tuple[_Call, float, int]] = deque()
        self.answered = 0
        self.lost = False
        self.loaded: set[str] = set()  # the scripts loaded on this connection (ScriptPipe._loads)

    def send(self, data: bytes, batch: list[_Call]) -> None:
        loop = self._pipe.loop()
        deadline = loop.time() + self._timeout
        self.waiting.extend((call, deadline, self.answered) for call in batch)
        self._transport.write(data)
        if self._timer is None:  # one timer a connection, moved along (not one per batch)
            self._timer = loop.call_at(deadline, self._check)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        try:
            while (reply := self._reader.gets()) is not False:
                if not self.waiting:
                    raise hiredis.ProtocolError(f"a reply nothing asked for: {reply!r}")
                call = self.waiting.popleft()[0]
                self.answered += 1
                self._pipe._answer(call, reply)
        except hiredis.ProtocolError as exc:
            self._drop(RedisConnectionError(f"Redis protocol error: {exc}"))

    def _check(self) -> None:
        self._timer = None
        if not self.waiting:
            return
        deadline = self.waiting[0][1]
        loop = self._pipe.loop()
        if loop.time() >= deadline:
            self._drop(RedisTimeoutError(f"Redis did not answer within {self._timeout:g} s"))
        else:
            self._timer = loop.call_at(deadline, self._check)

    def eof_received(self) -> bool:
        return False  # Redis closed its side: close ours (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self._drop(RedisConnectionError(f"Redis connection lost: {exc or 'closed by the server'}"))

    def _drop(self, exc: BaseException) -> None:
        if self.lost:
            return
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport.close()
        # Nothing answered since the oldest unanswered call was sent: the connection was gone
        # before it (stale), not lost in the middle of answering.
        fresh = bool(self.waiting) and self.waiting[0][2] == self.answered
        unanswered = [entry[0] for entry in self.waiting]
        self.waiting.clear()
        self._pipe._lost(unanswered, exc, fresh=fresh)

    def close(self) -> None:
        self._drop(RedisConnectionError("closed"))
