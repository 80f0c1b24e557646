"""Redis script calls made in the same event-loop turn, sent as one pipeline.

Under load many requests reach Redis at the same moment (each reserves its rate limit and
queues for a shared engine slot). Sent one by one, each call pays redis-py's command
building, a write and a read; batched, a turn's calls share one write and one read, and the
gateway's CPU per request in Redis mode drops towards the memory mode's. A call made alone
is sent alone, a loop turn later.

One batch is in flight at a time, and calls made meanwhile go out together when it is
answered: Redis runs them in the order they were made. Batches sent side by side on two
pooled connections could run in either order, so a request that left while its enqueue was
in flight could have its leave run first and its queue entry outlive it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import NoScriptError


class ScriptBatcher:
    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._pending: list[tuple[Any, list[str], list[Any], asyncio.Future[Any]]] = []
        self._scheduled = False  # a flush is due (next loop turn, or when the batch in flight ends)
        self._sending: asyncio.Task[None] | None = None

    def call(self, script: Any, keys: list[str], args: list[Any]) -> asyncio.Future[Any]:
        """Run `script` (a registered redis-py Script) with the next batch; the future gets its
        reply or its exception (a fault of the connection fails the whole batch)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((script, keys, args, future))
        if not self._scheduled:
            self._scheduled = True
            if self._sending is None:
                loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        batch, self._pending, self._scheduled = self._pending, [], False
        self._sending = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add_done_callback(self._sent)

    def _sent(self, _: asyncio.Task[None]) -> None:
        self._sending = None
        if self._scheduled:  # calls made while that batch was out: theirs is next
            self._flush()

    async def _send(self, batch: list[tuple[Any, list[str], list[Any], asyncio.Future[Any]]]) -> None:
        try:
            if len(batch) == 1:
                script, keys, args, _ = batch[0]
                replies: list[Any] = [await script(keys=keys, args=args)]
            else:
                replies = await run_scripts(self._redis, [(script, keys, args) for script, keys, args, _ in batch])
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


async def run_scripts(redis: Any, calls: list[tuple[Any, list[str], list[Any]]]) -> list[Any]:
    """Run registered scripts in one pipeline; a reply is the result or the call's exception.

    EVALSHA directly, not redis-py's Script objects in the pipeline: those make every
    pipeline ask SCRIPT EXISTS first, a second round trip each time. A script Redis does not
    know (it restarted) is loaded and the call run again on its own."""
    async with redis.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):
            script, keys, args = calls[i]
            try:
                replies[i] = await script(keys=keys, args=args)  # loads it, then runs it
            except Exception as exc:
                replies[i] = exc
    return replies
