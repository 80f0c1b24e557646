"""Redis script calls made in the same event-loop turn, sent as one pipeline on one connection.

Under load many requests reach Redis at the same moment (each reserves its rate limit and
queues for a shared engine slot). Sent one by one, each call pays redis-py's command
building, a write and a read; batched, a turn's calls share one write and one read, and the
gateway's CPU per request in Redis mode drops towards the memory mode's. A call made alone
is sent alone, a loop turn later.

One batch is in flight at a time, and calls made meanwhile go out together when it is
answered: Redis runs them in the order they were made. Batches sent side by side on two
pooled connections could run in either order, so a request that left while its enqueue was
in flight could have its leave run first and its queue entry outlive it.

The batches go out on a connection of their own (made by the client's pool, so with its
timeouts), not through redis-py's client or pipeline objects: those check a connection out
of the pool and back (a lock, a readiness poll of the socket, observability hooks) and pack
the command in Python on every call, which cost more CPU than the round trip itself
(bench/redis_limits.py). The command is packed by hiredis; replies are read by redis-py's
parser. A call may also *linger* (a settle, a refund: nobody waits on it): it then rides
with the next batch that someone waits on, or goes out after the linger.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hiredis import pack_command  # a dependency: redis[hiredis]
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

_Call = tuple[Any, list[str], list[Any], asyncio.Future[Any]]


class ScriptBatcher:
    def __init__(self, redis: Any, *, own_connection: bool = False) -> None:
        self._redis = redis
        # False: through the client's pool and pipelines (shared slots: with the faster own
        # connection, tests/unit/test_shared_slots.py's cancel race leaves an entry behind now
        # and then - a race of its own, not yet understood, that the slower path hides).
        self._own = own_connection
        self._conn: Any = None  # made on first use: the client's pool makes it, with its settings
        self._pending: list[_Call] = []
        self._scheduled = False  # a flush is due (next loop turn, or when the batch in flight ends)
        self._lingering: asyncio.TimerHandle | None = None  # a flush due after lingering calls' wait
        self._sending: asyncio.Task[None] | None = None
        self.round_trips = 0  # batches sent (tests, benches)

    def call(self, script: Any, keys: list[str], args: list[Any], *, linger: float = 0.0) -> asyncio.Future[Any]:
        """Run `script` (a registered redis-py Script) with the next batch; the future gets its
        reply or its exception (a fault of the connection fails the whole batch). With
        `linger`, the call waits up to that long for a batch to share (nobody waits on it)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((script, keys, args, future))
        if self._scheduled:
            return future
        if linger > 0:
            if self._lingering is None and self._sending is None:
                self._lingering = loop.call_later(linger, self._linger_over)
            return future
        self._scheduled = True
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
        if self._sending is None:
            loop.call_soon(self._flush)
        return future

    def _linger_over(self) -> None:
        self._lingering = None
        if not self._scheduled:
            self._scheduled = True
            if self._sending is None:
                self._flush()

    def _flush(self) -> None:
        batch, self._pending, self._scheduled = self._pending, [], False
        self._sending = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add_done_callback(self._sent)

    def _sent(self, _: asyncio.Task[None]) -> None:
        self._sending = None
        if self._scheduled:  # calls made while that batch was out: theirs is next
            self._flush()
        elif self._pending and self._lingering is None:  # only lingering calls came meanwhile
            self._scheduled = True
            self._flush()

    async def _send(self, batch: list[_Call]) -> None:
        self.round_trips += 1
        try:
            if not self._own:
                replies = await run_scripts(self._redis, [(script, keys, args) for script, keys, args, _ in batch])
            else:
                replies = await self._round_trip(batch)
            for i, reply in enumerate(replies):
                if isinstance(reply, NoScriptError):  # Redis restarted: load it, then run it
                    script, keys, args, _ = batch[i]
                    try:
                        replies[i] = await script(keys=keys, args=args)
                    except Exception as exc:
                        replies[i] = exc
        except BaseException as exc:  # the connection failed: every call of the batch did
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (*_, future), reply in zip(batch, replies, strict=True):
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _round_trip(self, batch: list[_Call]) -> list[Any]:
        """One write, a reply per call (an error reply is that call's exception). A connection
        error before any reply (a connection gone stale: Redis restarted) is retried once on a
        new connection, as redis-py's client does; a timeout never is (the calls may have run)."""
        if self._conn is None:
            self._conn = self._redis.connection_pool.make_connection()
        conn = self._conn
        packed = [self._pack(script, keys, args) for script, keys, args, _ in batch]
        for attempt in (0, 1):
            replies: list[Any] = []
            try:
                await conn.send_packed_command(packed)
                for _ in batch:
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as exc:  # the call's own error: the stream is intact
                        replies.append(exc)
                return replies
            except RedisConnectionError:
                await conn.disconnect(nowait=True)
                if attempt or replies:
                    raise
            except BaseException:  # a timeout or a cancel mid-read: the replies are out of step
                await conn.disconnect(nowait=True)
                raise
        raise AssertionError("unreachable")

    @staticmethod
    def _pack(script: Any, keys: list[str], args: list[Any]) -> bytes:
        return bytes(pack_command(("EVALSHA", script.sha, len(keys), *keys, *args)))

    def flush_soon(self) -> None:
        """Send the lingering calls now (shutting down)."""
        if self._lingering is not None:
            self._lingering.cancel()
            self._linger_over()

    async def close(self) -> None:
        """Send what is pending, wait for it, and close the connection."""
        self.flush_soon()
        while self._sending is not None:
            await asyncio.shield(self._sending)
            await asyncio.sleep(0)  # its done callback runs (and may send what came meanwhile)
        if self._conn is not None:
            await self._conn.disconnect()


async def run_scripts(redis: Any, calls: list[tuple[Any, list[str], list[Any]]]) -> list[Any]:
    """Run registered scripts through the client: one alone, several in one pipeline (EVALSHA
    directly: redis-py's Script objects in a pipeline ask SCRIPT EXISTS first, a second round
    trip each time). A reply is the result or the call's exception; NOSCRIPT is left to the
    caller."""
    if len(calls) == 1:
        script, keys, args = calls[0]
        try:
            return [await script(keys=keys, args=args)]
        except ResponseError as exc:
            return [exc]
    async with redis.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))
