"""core/redis_batch.py's pipe (the rate limiter's own connection): lingering calls ride with the
next batch, batches in flight side by side are answered in order, an error reply fails only
its own call, a connection lost to a Redis restart is replaced, and a frozen Redis fails the
calls waiting on it within the timeout, then is reached again once it thaws."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from laneway.core.redis_batch import ScriptPipe
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from support import PrivateRedis, require_service

REDIS_URL = os.environ.get("LANEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ECHO = "return ARGV[1]"
FAIL = "return redis.error_reply('nope')"
SLOW = "local n = 0 for i = 1, 3000000 do n = n + 1 end return ARGV[1]"  # tens of ms of Redis' time


@pytest.fixture
async def client() -> AsyncIterator[Any]:
    import redis.asyncio as redis

    require_service("Redis", "127.0.0.1", 6379)
    c = redis.Redis.from_url(REDIS_URL, socket_timeout=0.25)
    yield c
    await c.aclose()


async def test_a_lingering_call_rides_with_the_next_call_someone_waits_on(client: Any) -> None:
    batcher = ScriptPipe(client, timeout_s=0.25)
    echo = client.register_script(ECHO)
    await echo(keys=[], args=["load"])
    try:
        lingering = batcher.call(echo, [], ["settle"], linger=5.0)
        await asyncio.sleep(0.05)
        assert not lingering.done() and batcher.round_trips == 0  # it waits for company
        assert await batcher.call(echo, [], ["reserve"]) == b"reserve"
        assert lingering.done() and lingering.result() == b"settle"
        assert batcher.round_trips == 1  # both in one write
        alone = batcher.call(echo, [], ["alone"], linger=0.01)
        assert await alone == b"alone" and batcher.round_trips == 2  # nobody came: sent after the linger
    finally:
        await batcher.close()


async def test_batches_in_flight_side_by_side_are_answered_in_the_order_made(client: Any) -> None:
    """One turn's calls go in one write; the next turn's go out before the first are answered
    (no waiting for the batch in flight), and every call gets its own reply; a call whose
    caller left does not shift the others' replies."""
    batcher = ScriptPipe(client, timeout_s=0.25)
    echo, slow = client.register_script(ECHO), client.register_script(SLOW)
    try:
        assert await batcher.call(echo, [], ["connect"]) == b"connect"  # connected (the pipe's first call)
        connection = batcher._replies
        gc.collect()  # redis-py closes a collected connection object's transport: the pipe holds it
        assert await batcher.call(slow, [], ["loaded"]) == b"loaded"
        first = [batcher.call(slow, [], ["a0"])] + [batcher.call(echo, [], [f"a{i}"]) for i in range(1, 50)]
        await asyncio.sleep(0)  # the first batch is written, not answered yet
        second = [batcher.call(echo, [], [f"b{i}"]) for i in range(50)]
        second[10].cancel()  # its caller left
        await asyncio.sleep(0)
        assert batcher.round_trips == 4 and not first[-1].done()  # two writes, the first not answered yet
        assert await asyncio.gather(*first) == [f"a{i}".encode() for i in range(50)]
        answered = await asyncio.gather(*second[:10], *second[11:])
        assert answered == [f"b{i}".encode() for i in range(50) if i != 10]
        assert batcher._replies is connection and not connection.lost  # all on the first connection
    finally:
        await batcher.close()


async def test_an_error_reply_fails_only_its_own_call(client: Any) -> None:
    batcher = ScriptPipe(client, timeout_s=0.25)
    echo, fail = client.register_script(ECHO), client.register_script(FAIL)
    try:
        replies = await asyncio.gather(batcher.call(echo, [], ["a"]), batcher.call(fail, [], []),
                                       batcher.call(echo, [], ["b"]), return_exceptions=True)  # fmt: skip
        assert replies[0] == b"a" and replies[2] == b"b"
        assert isinstance(replies[1], ResponseError) and batcher.round_trips == 1
        # a script Redis does not know yet (NOSCRIPT) is loaded and run
        fresh = client.register_script("return 'fresh-' .. ARGV[1]")
        assert await batcher.call(fresh, [], [str(os.getpid())]) == f"fresh-{os.getpid()}".encode()
    finally:
        await batcher.close()


async def test_a_restarted_redis_is_reached_on_a_new_connection_without_an_error() -> None:
    import redis.asyncio as redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    server = PrivateRedis().start()
    # as the limiter's client: the script is loaded again through it, on a pooled connection
    # just as stale, which its one retry replaces
    client = redis.Redis.from_url(server.url, socket_timeout=0.5, socket_connect_timeout=0.5,
                                  retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)))  # fmt: skip
    batcher = ScriptPipe(client, timeout_s=0.25)
    echo = client.register_script(ECHO)
    try:
        assert await batcher.call(echo, [], ["before"]) == b"before"
        server.kill()
        server.start()  # the batcher's connection is now stale
        assert await batcher.call(echo, [], ["after"]) == b"after"
    finally:
        await batcher.close()
        await client.aclose()
        server.stop()


async def test_a_frozen_redis_fails_the_calls_waiting_within_the_timeout_then_is_reached_again() -> None:
    import redis.asyncio as redis

    server = PrivateRedis().start()
    client = redis.Redis.from_url(server.url, socket_timeout=0.3, socket_connect_timeout=0.3)
    batcher = ScriptPipe(client, timeout_s=0.3)
    echo = client.register_script(ECHO)
    try:
        assert await batcher.call(echo, [], ["before"]) == b"before"
        server.freeze()  # SIGSTOP: the socket stays open, nothing answers
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiting = [batcher.call(echo, [], [str(i)]) for i in range(3)]
        replies = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5)
        assert all(isinstance(r, RedisTimeoutError) for r in replies), replies
        assert loop.time() - started < 2.0  # failed by the pipe's timer, not left hanging
        server.thaw()
        assert await batcher.call(echo, [], ["after"]) == b"after"  # on a new connection
    finally:
        server.thaw()
        await batcher.close()
        await client.aclose()
        server.stop()


async def test_a_script_redis_has_not_seen_still_runs_in_the_order_its_call_was_made(
    private_redis: PrivateRedis,
) -> None:
    """On a Redis that never loaded the script (new, restarted, flushed), its first call must
    not run after the calls made behind it: a NOSCRIPT answered by loading and running it
    again on another connection would put an enqueue after its own leave."""
    import redis.asyncio as redis

    client = redis.Redis.from_url(private_redis.url)
    pipe = ScriptPipe(client, timeout_s=1.0)
    put = client.register_script("redis.call('SET', KEYS[1], ARGV[1]) return 1")
    drop = client.register_script("return redis.call('DEL', KEYS[1])")
    try:
        await client.script_flush()
        await drop(keys=["warm"])  # this one Redis knows; `put` it has never seen
        done = [pipe.call(put, ["k"], ["v"]), pipe.call(drop, ["k"], [])]  # one turn: one write
        assert await asyncio.gather(*done) == [1, 1]  # the drop found what the put had set
        assert await client.exists("k") == 0
        await client.script_flush()  # flushed under an open connection: NOSCRIPT, still answered
        assert await pipe.call(put, ["k2"], ["v"]) == 1
    finally:
        await pipe.close()
        await client.aclose()
