"""core/redis_hub (the one pipelined Redis connection the limiter, the quota counters and the
shared slots call through): lingering calls ride with the next batch, batches in flight side
by side are answered in order, an error reply fails only its own call, a connection lost to a
Redis restart is replaced, a frozen Redis fails the calls waiting on it within the timeout and
is reached again once it thaws, and the URL's credentials and database are honoured."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator
from importlib.resources import files
from typing import Any

import pytest
from laneway.core.redis_hub import LuaScript, RedisHub, parse_redis_url
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from support import REDIS_URL, PrivateRedis, require_service

ECHO = LuaScript("echo", "return ARGV[1]")
FAIL = LuaScript("fail", "return redis.error_reply('nope')")
SLOW = LuaScript("slow", "local n = 0 for i = 1, 3000000 do n = n + 1 end return ARGV[1]")  # tens of ms of Redis' time


@pytest.fixture
async def hub() -> AsyncIterator[RedisHub]:
    require_service("Redis", "127.0.0.1", 6379)
    h = RedisHub(REDIS_URL, timeout_s=0.25)
    yield h
    await h.close()


async def test_a_lingering_call_rides_with_the_next_call_someone_waits_on(hub: RedisHub) -> None:
    assert await hub.call(ECHO, [], ["load"]) == b"load"
    before = hub.round_trips
    lingering = hub.call(ECHO, [], ["settle"], linger=5.0)
    await asyncio.sleep(0.05)  # time passing is the point: nothing sent while it lingers
    assert not lingering.done() and hub.round_trips == before  # it waits for company
    assert await hub.call(ECHO, [], ["reserve"]) == b"reserve"
    assert lingering.done() and lingering.result() == b"settle"
    assert hub.round_trips == before + 1  # both in one write
    alone = hub.call(ECHO, [], ["alone"], linger=0.01)
    assert await alone == b"alone" and hub.round_trips == before + 2  # nobody came: sent after the linger


async def test_batches_in_flight_side_by_side_are_answered_in_the_order_made(hub: RedisHub) -> None:
    """One turn's calls go in one write; the next turn's go out before the first are answered
    (no waiting for the batch in flight), and every call gets its own reply; a call whose
    caller left does not shift the others' replies."""
    assert await hub.call(ECHO, [], ["connect"]) == b"connect"  # connected (the hub's first call)
    connection = hub._replies
    assert await hub.call(SLOW, [], ["loaded"]) == b"loaded"
    before = hub.round_trips
    first = [hub.call(SLOW, [], ["a0"])] + [hub.call(ECHO, [], [f"a{i}"]) for i in range(1, 50)]
    await asyncio.sleep(0)  # the first batch is written, not answered yet
    second = [hub.call(ECHO, [], [f"b{i}"]) for i in range(50)]
    second[10].cancel()  # its caller left
    await asyncio.sleep(0)
    assert hub.round_trips == before + 2 and not first[-1].done()  # two writes, the first not answered yet
    assert await asyncio.gather(*first) == [f"a{i}".encode() for i in range(50)]
    answered = await asyncio.gather(*second[:10], *second[11:])
    assert answered == [f"b{i}".encode() for i in range(50) if i != 10]
    assert hub._replies is connection and connection is not None and not connection.lost  # one connection


async def test_an_error_reply_fails_only_its_own_call(hub: RedisHub) -> None:
    replies = await asyncio.gather(
        hub.call(ECHO, [], ["a"]), hub.call(FAIL, [], []), hub.call(ECHO, [], ["b"]), return_exceptions=True
    )
    assert replies[0] == b"a" and replies[2] == b"b"
    assert isinstance(replies[1], ResponseError) and hub.round_trips == 1
    # a script Redis does not know yet is loaded ahead of its first call, and run
    fresh = LuaScript("fresh", f"return 'fresh-{os.getpid()}-' .. ARGV[1]")
    assert await hub.call(fresh, [], ["x"]) == f"fresh-{os.getpid()}-x".encode()


async def test_a_restarted_redis_is_reached_on_a_new_connection_without_an_error() -> None:
    server = PrivateRedis().start()
    hub = RedisHub(server.url, timeout_s=0.25)
    try:
        assert await hub.call(ECHO, [], ["before"]) == b"before"
        server.kill()
        server.start()  # the hub's connection is now stale, and the new Redis has no scripts
        assert await hub.call(ECHO, [], ["after"]) == b"after"
    finally:
        await hub.close()
        server.stop()


async def test_a_frozen_redis_fails_the_calls_waiting_within_the_timeout_then_is_reached_again() -> None:
    server = PrivateRedis().start()
    hub = RedisHub(server.url, timeout_s=0.3)
    try:
        assert await hub.call(ECHO, [], ["before"]) == b"before"
        server.freeze()  # SIGSTOP: the socket stays open, nothing answers
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiting = [hub.call(ECHO, [], [str(i)]) for i in range(3)]
        replies = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5)
        assert all(isinstance(r, RedisTimeoutError) for r in replies), replies
        assert loop.time() - started < 2.0  # failed by the connection's timer, not left hanging
        server.thaw()
        assert await hub.call(ECHO, [], ["after"]) == b"after"  # on a new connection
    finally:
        server.thaw()
        await hub.close()
        server.stop()


async def test_a_script_redis_has_not_seen_still_runs_in_the_order_its_call_was_made(
    private_redis: PrivateRedis,
) -> None:
    """On a Redis that never loaded the script (new, restarted, flushed), its first call must
    not run after the calls made behind it: a NOSCRIPT answered by loading and running it
    again would put an enqueue after its own leave."""
    put = LuaScript("put", "redis.call('SET', KEYS[1], ARGV[1]) return 1")
    drop = LuaScript("drop", "return redis.call('DEL', KEYS[1])")
    hub = RedisHub(private_redis.url, timeout_s=1.0)
    try:
        await hub.client.script_flush()
        assert await hub.call(drop, ["warm"], []) == 0  # this one the connection has loaded; `put` not
        done = [hub.call(put, ["k"], ["v"]), hub.call(drop, ["k"], [])]  # one turn: one write
        assert await asyncio.gather(*done) == [1, 1]  # the drop found what the put had set
        assert await hub.client.exists("k") == 0
        await hub.client.script_flush()  # flushed under an open connection: NOSCRIPT, still answered
        assert await hub.call(put, ["k2"], ["v"]) == 1
    finally:
        await hub.close()


async def test_the_urls_password_and_database_are_used(private_redis: PrivateRedis) -> None:
    setter = LuaScript("setter", "redis.call('SET', KEYS[1], ARGV[1]) return 1")
    admin = RedisHub(private_redis.url)
    try:
        await admin.client.config_set("requirepass", "s3cret")
        port = private_redis.port
        hub = RedisHub(f"redis://:s3cret@127.0.0.1:{port}/3", timeout_s=1.0)
        try:
            assert await hub.call(setter, ["k"], ["in-3"]) == 1
        finally:
            await hub.close()
        check = RedisHub(f"redis://:s3cret@127.0.0.1:{port}/3")
        try:
            assert await check.client.get("k") == b"in-3"  # SELECT 3 ran before the call
        finally:
            await check.close()
        wrong = RedisHub(f"redis://:wrong@127.0.0.1:{port}/0", timeout_s=1.0)
        try:
            with pytest.raises(AuthenticationError):
                await wrong.call(setter, ["k"], ["x"])
        finally:
            await wrong.close()
    finally:
        await admin.close()


def test_redis_urls_are_read_as_redis_py_reads_them() -> None:
    a = parse_redis_url("redis://user:p%40ss@cache.internal:6380/2")
    assert (a.host, a.port, a.username, a.password, a.db, a.tls) == ("cache.internal", 6380, "user", "p@ss", 2, None)
    assert a.handshake() == [["AUTH", "user", "p@ss"], ["SELECT", "2"]]
    plain = parse_redis_url("redis://127.0.0.1")
    assert (plain.port, plain.db, plain.handshake()) == (6379, 0, [])
    assert parse_redis_url("redis://h/0?db=4").db == 4
    tls = parse_redis_url("rediss://:pw@h:6390/0?ssl_cert_reqs=none")
    assert tls.tls is not None and tls.tls.verify_mode == ssl.CERT_NONE and tls.handshake() == [["AUTH", "pw"]]
    unix = parse_redis_url("unix:///run/redis.sock?db=1")
    assert (unix.unix_path, unix.db) == ("/run/redis.sock", 1)
    for bad in ("http://h:6379", "redis://h:6379/0?client_name=x"):
        with pytest.raises(ValueError):
            parse_redis_url(bad)


def test_the_lua_scripts_are_package_data() -> None:
    """Read through importlib.resources, as from an installed wheel."""
    names: dict[str, Any] = {
        "laneway.core.ratelimit": ("reserve", "settle", "read_counters", "seed_counter"),
        "laneway.core.shared_slots": ("common", "enqueue", "leave", "heartbeat"),
    }
    for package, scripts in names.items():
        for name in scripts:
            assert "redis.call" in files(package).joinpath(f"{name}.lua").read_text("utf-8"), (package, name)
