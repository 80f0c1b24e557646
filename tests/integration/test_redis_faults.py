"""Redis as a dependency with a contract, against a redis-server of the test's own that is
killed, frozen (SIGSTOP) and restarted: requests never get a 500 and never hang, fail-open
serves with local limits, fail-closed refuses with 503 + Retry-After, usage rows say what
happened, and the settles that could not be sent land once Redis is back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from laneway.core.ratelimit.headroom import ADMIT_AT_ONCE_FOR_S
from support import Gateway, PrivateRedis, sim_model, start_gateway, wait_for

BODY = {"model": "sim", "prompt": "hi", "max_tokens": 3}


def gateway_on(redis: PrivateRedis, data: Path, **settings: Any) -> Gateway:
    return start_gateway(
        data,
        seed_with={
            "models": {"sim": sim_model("sim", max_concurrency=256, decode_ms_base=0.5, decode_ms_per_seq=0.0)},
            "lanes": [{"name": "standard", "max_concurrency": 256, "max_queue_depth": 1000, "queue_timeout_s": 30}],
            "tenants": {"acme": {"max_concurrency": 1000, "rpm": 100_000}},
        },
        redis_url=redis.url,
        usage_flush_interval_s=0.05,
        **settings,
    )


@pytest.fixture
def gw(private_redis: PrivateRedis, tmp_path: Path) -> Iterator[Gateway]:
    g = gateway_on(private_redis, tmp_path)
    yield g
    g.stop()


def post(gw: Gateway, timeout: float = 10.0) -> httpx.Response:
    return httpx.post(
        gw.api_url + "/completions", headers={"Authorization": f"Bearer {gw.keys['acme']}"}, json=BODY, timeout=timeout
    )


def holders(gw: Gateway) -> int:
    limiter = gw.gateway.limiter

    async def count() -> int:
        return int(await limiter.hub.client.zcard(limiter.keys.tenant(1)[2]))

    return int(gw.server.call(count()))


def redis_errors(gw: Gateway) -> float:
    for line in httpx.get(gw.base_url + "/metrics").text.splitlines():
        if line.startswith('laneway_dependency_errors_total{dependency="redis"}'):
            return float(line.split()[-1])
    return 0.0


def test_redis_killed_fail_open_serves_everyone_with_local_limits(gw: Gateway, private_redis: PrivateRedis) -> None:
    assert post(gw).status_code == 200
    private_redis.kill()
    statuses = [post(gw).status_code for _ in range(20)]
    assert statuses == [200] * 20
    rows = gw.usage_rows("acme")
    assert [r.status for r in rows] == [200] * 21  # served, and recorded as served (not 499)
    assert redis_errors(gw) >= 1
    assert gw.gateway.limiter.fallback.in_flight(1) == 0  # the local holders were given back


def test_redis_killed_fail_closed_refuses_with_503_and_retry_after(private_redis: PrivateRedis, tmp_path: Path) -> None:
    gw = gateway_on(private_redis, tmp_path, redis_failure_mode="closed")
    try:
        assert post(gw).status_code == 200
        private_redis.kill()
        # Time passing is what is tested: a tenant far below its limits is admitted at once on
        # Redis's last answer for ADMIT_AT_ONCE_FOR_S (core/ratelimit/headroom.py), so a request
        # that soon after the kill may still be admitted; past it, fail-closed refuses.
        time.sleep(ADMIT_AT_ONCE_FOR_S + 0.2)
        r = post(gw)
        assert r.status_code == 503 and r.json()["error"]["code"] == "rate_limiter_unavailable"
        assert int(r.headers["retry-after"]) >= 1
        assert [row.status for row in gw.usage_rows("acme")] == [200, 503]
    finally:
        gw.stop()


def test_a_frozen_redis_does_not_hang_requests(gw: Gateway, private_redis: PrivateRedis) -> None:
    assert post(gw).status_code == 200
    private_redis.freeze()
    try:
        started = time.monotonic()
        statuses = [post(gw, timeout=5).status_code for _ in range(10)]
        elapsed = time.monotonic() - started
    finally:
        private_redis.thaw()
    assert statuses == [200] * 10
    # The first one waits out the socket timeout; the open breaker spares the rest.
    assert elapsed < 5, elapsed


def test_after_a_restart_stale_pooled_connections_are_replaced(gw: Gateway, private_redis: PrivateRedis) -> None:
    for _ in range(5):
        assert post(gw).status_code == 200  # the pool now holds connections to the old process
    assert gw.server.call(gw.gateway.limiter.settled())
    private_redis.restart()
    before = redis_errors(gw)
    statuses = [post(gw).status_code for _ in range(10)]
    assert statuses == [200] * 10
    assert redis_errors(gw) == before  # one transparent retry per stale connection, not a fault
    assert not gw.gateway.limiter.degraded and holders(gw) == 0


async def test_many_more_requests_in_flight_than_pooled_connections(gw: Gateway) -> None:
    """redis-py's default asyncio pool raises MaxConnectionsError past 100 connections; a
    blocking pool makes the 300th request wait its turn for a connection instead."""
    async with httpx.AsyncClient(
        base_url=gw.api_url,
        headers={"Authorization": f"Bearer {gw.keys['acme']}"},
        limits=httpx.Limits(max_connections=400),
        timeout=60,
    ) as c:
        responses = await asyncio.gather(*(c.post("/completions", json=BODY) for _ in range(300)))
    assert [r.status_code for r in responses] == [200] * 300
    # (On a loaded machine a call may still exceed the 250 ms timeout: that is a fault the
    # breaker absorbs, but running out of pooled connections must never be one.)
    kinds = gw.server.runtime.health.error_kinds
    assert not [k for k in kinds if "MaxConnections" in k[1]], kinds
    await asyncio.to_thread(wait_for, lambda: holders(gw) == 0, 10, 0.01, "every holder settled in Redis")


def test_settles_that_fail_during_an_outage_land_when_redis_is_back(gw: Gateway, private_redis: PrivateRedis) -> None:
    sock_body = {"model": "sim", "prompt": "hi", "max_tokens": 400, "stream": True}
    with httpx.stream(
        "POST",
        gw.api_url + "/completions",
        json=sock_body,
        timeout=30,
        headers={"Authorization": f"Bearer {gw.keys['acme']}"},
    ) as r:
        lines = r.iter_lines()
        next(lines)  # admitted: its holder is in Redis
        assert holders(gw) == 1
        private_redis.freeze()  # it ends while Redis cannot be told
        for _ in lines:
            pass
    limiter = gw.gateway.limiter
    wait_for(lambda: limiter.pending_settles >= 1 or redis_errors(gw) >= 1, what="the settle to fail")
    private_redis.thaw()
    wait_for(lambda: limiter.pending_settles == 0, within=40, what="the queued settle to be sent")
    assert holders(gw) == 0
