"""Money budgets on process memory and on real Redis (the same contract): a tenant's and a key's
budget refuse exactly at their limit, a settle gives back what was not spent, a request larger
than a whole budget is request_too_large, the soft threshold's hook is told once per period."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from laneway.contracts.errors import GatewayError
from laneway.core.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter, Reservation
from laneway.types import TenantSnapshot
from support import REDIS_URL, Wall, require_service


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    wall = Wall("2026-03-31T23:00:00")
    if request.param == "memory":
        yield MemoryRateLimiter(wall_clock=wall)
        return
    require_service("Redis", "127.0.0.1", 6379)
    redis_limiter = RedisRateLimiter(REDIS_URL, prefix=f"lwtest:{uuid.uuid4().hex}:", wall_clock=wall)
    yield redis_limiter
    await redis_limiter.close()


async def settle(limiter: RateLimiter, reservation: Reservation, tokens: int, cost: int) -> None:
    limiter.settle(reservation, tokens, cost)
    if isinstance(limiter, RedisRateLimiter):
        assert await limiter.settled()


async def code_of(limiter: RateLimiter, t: TenantSnapshot, cost: int) -> str | None:
    try:
        reservation = await limiter.reserve(t, 1, uuid.uuid4().hex, cost)
    except GatewayError as exc:
        return exc.code
    await settle(limiter, reservation, 1, cost)
    return None


async def test_refused_exactly_at_the_limit_and_refunded_to_the_cost(limiter: RateLimiter) -> None:
    t = TenantSnapshot(id=1, name="acme", api_key_id=1, budget_per_day=100)
    held = await limiter.reserve(t, 10, "a", 60)  # reserved at its most cost
    assert await code_of(limiter, t, 41) == "budget_exceeded"  # 60 + 41 > 100
    await settle(limiter, held, 5, 20)  # it cost 20: 40 given back
    assert await code_of(limiter, t, 80) is None  # 20 + 80 == 100: at the limit, taken
    assert await code_of(limiter, t, 1) == "budget_exceeded"
    assert await code_of(limiter, t, 0) is None  # a request to an unpriced model costs nothing
    assert await code_of(limiter, t, 101) == "request_too_large"
    limiter.wall_clock.set("2026-04-01T00:00:00")  # type: ignore[attr-defined]
    assert await code_of(limiter, t, 100) is None  # a new day


async def test_a_keys_budget_binds_that_key_only(limiter: RateLimiter) -> None:
    one = TenantSnapshot(id=2, name="acme", api_key_id=7, key_budget_per_month=50)
    other = TenantSnapshot(id=2, name="acme", api_key_id=8)
    assert await code_of(limiter, one, 50) is None
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(one, 1, "x", 1)
    assert info.value.code == "budget_exceeded" and "API key 7" in info.value.message
    assert info.value.headers["X-Laneway-Budget-Reset"] == "2026-04-01T00:00:00Z"
    assert await code_of(limiter, other, 500) is None


async def test_the_soft_threshold_is_said_once_per_period(limiter: RateLimiter) -> None:
    said: list[tuple[str, int]] = []

    def hook(tenant: TenantSnapshot, budget: Any, spent: int) -> None:
        said.append((budget.name, spent))

    limiter.alert, limiter.alert_share = hook, 0.8
    t = TenantSnapshot(id=3, name="acme", api_key_id=1, budget_per_day=100)
    for cost in (50, 29, 1, 5, 5):  # 79: not yet; 80: past it; then no more
        assert await code_of(limiter, t, cost) is None
    assert said == [("cost:day:2026-03-31", 80)]
    limiter.wall_clock.set("2026-04-01T00:00:00")  # type: ignore[attr-defined]
    assert await code_of(limiter, t, 90) is None
    assert said[1:] == [("cost:day:2026-04-01", 90)]
