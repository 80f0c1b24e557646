"""core/redis_batch.py on its own connection: lingering calls ride with the next batch, an
error reply fails only its own call, and a connection lost to a Redis restart is replaced."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from laneway.core.redis_batch import ScriptBatcher
from redis.exceptions import ResponseError
from services import PrivateRedis, require_service

REDIS_URL = os.environ.get("LANEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ECHO = "return ARGV[1]"
FAIL = "return redis.error_reply('nope')"


@pytest.fixture
async def client() -> AsyncIterator[Any]:
    import redis.asyncio as redis

    require_service("Redis", "127.0.0.1", 6379)
    c = redis.Redis.from_url(REDIS_URL, socket_timeout=0.25)
    yield c
    await c.aclose()


async def test_a_lingering_call_rides_with_the_next_call_someone_waits_on(client: Any) -> None:
    batcher = ScriptBatcher(client, own_connection=True)
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


async def test_an_error_reply_fails_only_its_own_call(client: Any) -> None:
    batcher = ScriptBatcher(client, own_connection=True)
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
    batcher = ScriptBatcher(client, own_connection=True)
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
