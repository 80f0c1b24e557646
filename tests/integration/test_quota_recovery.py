"""Quota counters survive Redis losing its data: against a redis-server of the test's own
(no persistence) that is restarted empty, with the usage rows in PostgreSQL as the truth. A
tenant that spent part of its daily quota is refused at the same point after the restart;
two replicas seeding one counter add the rows once; a request in flight across the loss is
counted once, never refunded into a counter that never held it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from laneway.core.quota import period
from support import Gateway, PrivateRedis, replica_pair, sim_model, start_gateway, wait_for

QUOTA = 100


def _seed() -> dict[str, Any]:
    return {
        "models": {
            "sim": sim_model("sim", decode_ms_base=0.5, max_concurrency=64),
            "slow": sim_model("slow", decode_ms_base=40.0, max_concurrency=64),
        },
        "lanes": [{"name": "standard", "max_concurrency": 64, "max_queue_depth": 100, "queue_timeout_s": 30}],
        "tenants": {"capped": {"tokens_per_day": QUOTA}},
    }


def replica(data: Path, redis: PrivateRedis, database_url: str, seed: bool) -> Gateway:
    gw = start_gateway(
        data,
        database_url=database_url,
        seed_with=_seed() if seed else None,
        redis_url=redis.url,
        usage_flush_interval_s=0.05,
    )
    gw.gateway.limiter.recovery.late_rows_s = 0.3  # the second look for late rows, soon
    return gw


@pytest.fixture
def replicas(private_redis: PrivateRedis, pg_database: str, tmp_path: Path) -> Iterator[list[Gateway]]:
    with replica_pair(
        lambda: replica(tmp_path / "a", private_redis, pg_database, seed=True),
        lambda: replica(tmp_path / "b", private_redis, pg_database, seed=False),
    ) as pair:
        yield pair


def complete(gw: Gateway, model: str = "sim", max_tokens: int = 9) -> int:
    client = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["capped"], max_retries=0)
    usage = client.completions.create(model=model, prompt="hi", max_tokens=max_tokens).usage
    assert usage is not None
    return usage.total_tokens


def tenant_id(gw: Gateway) -> int:
    return int(gw.usage_rows("capped")[0].tenant_id)


def counted(gw: Gateway) -> int:
    """Today's counter in Redis (what the quota is checked against)."""
    return gw.server.call(gw.gateway.limiter.quota_used(tenant_id(gw)))["day"]


def recorded(gw: Gateway) -> int:
    """The served requests' tokens in the usage table (a refusal's row has its prompt's)."""
    return sum(r.prompt_tokens + r.completion_tokens for r in gw.usage_rows("capped") if r.status == 200)


def quiet(replicas: list[Gateway], served: int) -> None:
    """Every settle sent, every seed done (late rows included), the served requests' rows written."""
    for gw in replicas:
        assert gw.server.call(gw.gateway.limiter.settled())
        assert gw.server.call(gw.gateway.limiter.recovery.settled())
    rows = replicas[0].usage_rows
    wait_for(lambda: len([r for r in rows("capped") if r.status == 200]) == served, what=f"{served} usage rows")


def test_a_daily_quota_spent_in_part_is_enforced_after_redis_restarts_empty(
    replicas: list[Gateway], private_redis: PrivateRedis
) -> None:
    a, b = replicas
    per_request = complete(a)
    used, served = per_request + complete(b) + complete(a), 3
    quiet(replicas, served)
    assert counted(a) == used == recorded(a)

    private_redis.restart()  # nothing on disk: every counter is gone
    used, served = used + complete(b), served + 1  # begins the day's counter again
    # The rows from before the loss, added once, in the background.
    wait_for(lambda: counted(b) == used, what="the counter seeded from the usage rows")
    while True:
        try:
            used, served = used + complete(replicas[served % 2]), served + 1
        except openai.RateLimitError as exc:
            error = exc.response.json()["error"]
            assert error["code"] == "quota_exceeded", error
            assert f"used {used} of its daily quota of {QUOTA} tokens" in error["message"]
            break
        assert served <= QUOTA // per_request, "a restart handed the tenant a fresh quota"
    assert served == QUOTA // per_request  # refused where it would have been without the restart
    quiet(replicas, served)
    assert counted(a) == recorded(a) == used


def test_two_replicas_seeding_one_counter_at_once_add_the_rows_once(
    replicas: list[Gateway], private_redis: PrivateRedis
) -> None:
    a, b = replicas
    used = sum(complete(gw) for gw in (a, b, a, b))
    quiet(replicas, 4)
    private_redis.restart()
    used += complete(a)  # a begins the counter and seeds it
    limiter, tenant = a.gateway.limiter, tenant_id(a)
    p = period("day", limiter.wall_clock())
    epoch = a.server.call(limiter.hub.client.hget(limiter.keys.epoch(tenant, p.name), "epoch")).decode()

    async def seed_many(gw: Gateway) -> None:  # as if b had been told to seed it too, and retried
        recovery = gw.gateway.limiter.recovery
        await asyncio.gather(*(recovery._seed_once(tenant, p, epoch) for _ in range(3)))

    a.server.call(seed_many(a))
    b.server.call(seed_many(b))
    quiet(replicas, 5)
    assert counted(a) == recorded(a) == used


def test_a_request_in_flight_when_redis_lost_its_data_is_counted_once(
    replicas: list[Gateway], private_redis: PrivateRedis
) -> None:
    a, b = replicas
    used = complete(a)
    quiet(replicas, 1)
    body = {"model": "slow", "prompt": "hi", "max_tokens": 30, "stream": True}
    headers = {"Authorization": f"Bearer {a.keys['capped']}"}
    with httpx.stream("POST", a.api_url + "/completions", json=body, headers=headers, timeout=30) as streaming:
        lines = streaming.iter_lines()
        assert next(lines).startswith("data: ")  # admitted: 1 + 30 tokens reserved in the old counter
        private_redis.restart()
        used += complete(b)  # b begins the counter again: the stream's reservation is not in it
        for _ in lines:
            pass  # it ends after the new epoch: its settle adds what it used, gives nothing back
    quiet(replicas, 3)
    slow = next(r for r in a.usage_rows("capped") if r.model == "slow")
    assert slow.completion_tokens == 30
    used += slow.prompt_tokens + slow.completion_tokens
    assert counted(a) == recorded(a) == used
