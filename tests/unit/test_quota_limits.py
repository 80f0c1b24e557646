"""Token quotas per UTC day and month, and an API key's own limits, on process memory and on
real Redis (the same contract). The limiters' wall clock is injected: no test waits for midnight."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from laneway.contracts.errors import GatewayError
from laneway.core.quota import period
from laneway.core.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter, Reservation
from laneway.types import TenantSnapshot
from support import REDIS_URL, Wall, require_service


def tenant(**kw: object) -> TenantSnapshot:
    fields: dict[str, object] = {"id": 1, "name": "acme", "api_key_id": 1, **kw}
    return TenantSnapshot(**fields)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    wall = Wall("2026-03-31T23:59:00")
    if request.param == "memory":
        yield MemoryRateLimiter(wall_clock=wall)
        return
    require_service("Redis", "127.0.0.1", 6379)
    redis_limiter = RedisRateLimiter(REDIS_URL, prefix=f"lwtest:{uuid.uuid4().hex}:", wall_clock=wall)
    yield redis_limiter
    await redis_limiter.close()


def wall_of(limiter: RateLimiter) -> Wall:
    assert isinstance(limiter.wall_clock, Wall)
    return limiter.wall_clock


async def settle(limiter: RateLimiter, reservation: Reservation, used_tokens: int) -> None:
    limiter.settle(reservation, used_tokens)
    if isinstance(limiter, RedisRateLimiter):
        assert await limiter.settled()


def test_periods_are_calendar_days_and_months_in_utc() -> None:
    at = datetime(2026, 12, 31, 23, 30, tzinfo=UTC).timestamp()
    day, month = period("day", at), period("month", at)
    assert (day.name, day.resets_at) == ("day:2026-12-31", datetime(2027, 1, 1, tzinfo=UTC))
    assert (month.name, month.resets_at) == ("month:2026-12", datetime(2027, 1, 1, tzinfo=UTC))
    assert day.seconds_left(at) == 1800
    feb = period("month", datetime(2028, 2, 29, 12, tzinfo=UTC).timestamp())  # a leap year
    assert feb.start == datetime(2028, 2, 1, tzinfo=UTC) and feb.resets_at == datetime(2028, 3, 1, tzinfo=UTC)


async def test_daily_quota_refuses_until_midnight_utc_then_resets(limiter: RateLimiter) -> None:
    t = tenant(tokens_per_day=100)
    a = await limiter.reserve(t, 60, "a")
    await settle(limiter, a, 50)  # 10 unused tokens come back: 50 counted
    await limiter.reserve(t, 50, "b")  # exactly the quota
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(t, 1, "c")
    err = info.value
    assert err.status == 429 and err.code == "quota_exceeded" and err.type == "rate_limit_error"
    assert err.headers["Retry-After"] == "60"  # 23:59:00 -> midnight
    assert err.headers["X-Laneway-Quota-Reset"] == "2026-04-01T00:00:00Z"
    assert "daily quota of 100 tokens" in err.message and "2026-04-01T00:00:00Z" in err.message
    assert await limiter.quota_used(1) == {"day": 100, "month": 100}
    wall_of(limiter).set("2026-04-01T00:00:01")
    await limiter.reserve(t, 100, "d")  # a new day (and a new month): from zero
    assert await limiter.quota_used(1) == {"day": 100, "month": 100}


async def test_monthly_quota_outlives_the_day_and_resets_on_the_first(limiter: RateLimiter) -> None:
    wall_of(limiter).set("2026-03-30T10:00:00")
    t = tenant(tokens_per_month=100, tokens_per_day=80)
    await limiter.reserve(t, 80, "a")
    wall_of(limiter).set("2026-03-31T10:00:00")  # the next day: the daily quota is fresh
    await limiter.reserve(t, 20, "b")
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(t, 5, "c")
    assert info.value.code == "quota_exceeded" and "monthly quota of 100" in info.value.message
    assert info.value.headers["Retry-After"] == str(14 * 3600)  # 10:00 -> 00:00 on April 1st
    assert info.value.headers["X-Laneway-Quota-Reset"] == "2026-04-01T00:00:00Z"
    wall_of(limiter).set("2026-04-01T00:00:00")
    await limiter.reserve(t, 80, "d")


async def test_a_refund_after_the_boundary_goes_back_to_its_own_period(limiter: RateLimiter) -> None:
    t = tenant(tokens_per_day=100)
    a = await limiter.reserve(t, 100, "a")  # reserved at 23:59 on March 31st
    wall_of(limiter).set("2026-04-01T00:00:30")
    b = await limiter.reserve(t, 90, "b")
    await settle(limiter, a, 10)  # its 90 unused belong to March 31st, not to April 1st
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(t, 20, "c")
    assert info.value.code == "quota_exceeded"
    await settle(limiter, b, 0)
    assert (await limiter.quota_used(1))["day"] == 0


async def test_a_request_larger_than_the_whole_quota_is_too_large(limiter: RateLimiter) -> None:
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(tenant(tokens_per_day=100), 101, "a")
    assert info.value.code == "request_too_large" and "daily quota of 100" in info.value.message
    assert "Retry-After" not in info.value.headers  # waiting would not help


async def test_every_tenant_is_counted_so_a_quota_set_later_applies_to_the_day(limiter: RateLimiter) -> None:
    await limiter.reserve(tenant(), 70, "a")
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(tenant(tokens_per_day=100), 40, "b")
    assert info.value.code == "quota_exceeded"


async def test_key_rpm_is_its_own_bucket_inside_the_tenants(limiter: RateLimiter) -> None:
    limited = tenant(rpm=100, key_rpm=2, api_key_id=7)
    other_key = tenant(rpm=100, api_key_id=8)
    await limiter.reserve(limited, 1, "a")
    await limiter.reserve(limited, 1, "b")
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(limited, 1, "c")
    assert info.value.code == "rate_limit_exceeded" and "API key" in info.value.message
    assert 29 <= int(info.value.headers["Retry-After"]) <= 30  # one request at 2/min
    await limiter.reserve(other_key, 1, "d")  # the tenant still has room for its other keys


async def test_key_tpm_refunds_and_too_large(limiter: RateLimiter) -> None:
    t = tenant(key_tpm=100)
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(t, 101, "x")
    assert info.value.code == "request_too_large" and "API key" in info.value.message
    a = await limiter.reserve(t, 80, "a")
    with pytest.raises(GatewayError):
        await limiter.reserve(t, 50, "b")
    await settle(limiter, a, 20)
    await limiter.reserve(t, 50, "b")


async def test_key_concurrency_counts_only_that_keys_requests(limiter: RateLimiter) -> None:
    t = tenant(max_concurrency=10, key_max_concurrency=1, api_key_id=7)
    a = await limiter.reserve(t, 1, "a")
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(t, 1, "b")
    assert info.value.code == "concurrency_limit_exceeded" and "API key" in info.value.message
    await limiter.reserve(tenant(max_concurrency=10, api_key_id=8), 1, "c")
    await settle(limiter, a, 0)
    await limiter.reserve(t, 1, "b")


async def test_the_tenant_limit_still_binds_a_key_with_a_wider_one(limiter: RateLimiter) -> None:
    t = tenant(rpm=1, key_rpm=5)
    await limiter.reserve(t, 1, "a")
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(t, 1, "b")
    assert "tenant 'acme' (RPM 1" in info.value.message


async def test_two_redis_limiters_share_one_daily_quota() -> None:
    require_service("Redis", "127.0.0.1", 6379)
    prefix, wall = f"lwtest:{uuid.uuid4().hex}:", Wall("2026-05-10T12:00:00")
    a = RedisRateLimiter(REDIS_URL, prefix, wall_clock=wall)
    b = RedisRateLimiter(REDIS_URL, prefix, wall_clock=wall)
    t = tenant(tokens_per_day=50)
    outcomes = []
    try:
        for i in range(8):
            try:
                await (a if i % 2 else b).reserve(t, 10, f"r{i}")
                outcomes.append(True)
            except GatewayError as exc:
                assert exc.code == "quota_exceeded"
                outcomes.append(False)
    finally:
        await a.close()
        await b.close()
    assert outcomes == [True] * 5 + [False] * 3


async def test_a_reservation_whose_counter_redis_lost_is_counted_once_and_never_refunded() -> None:
    """Redis loses the counters (here: their keys deleted) while reservations are in flight;
    the next reserve begins them again. A settle from before gives nothing back to the new
    counter (it never held the reservation) and adds what was used when the request ended
    after the new epoch (its usage row is then not among those the seed adds)."""
    require_service("Redis", "127.0.0.1", 6379)
    prefix = f"lwtest:{uuid.uuid4().hex}:"
    wall = Wall("2026-03-31T12:00:00")
    limiter = RedisRateLimiter(REDIS_URL, prefix=prefix, wall_clock=wall)
    try:
        t = tenant(tokens_per_day=100)
        early, late = await limiter.reserve(t, 60, "early"), await limiter.reserve(t, 30, "late")
        await limiter.hub.client.delete(*await limiter.hub.client.keys(prefix + "*"))  # as a restart, no persistence
        wall.set("2026-03-31T12:00:01")
        fresh = await limiter.reserve(t, 10, "fresh")
        assert fresh.epochs != early.epochs
        wall.set("2026-03-31T12:00:00.5")
        await settle(limiter, early, 25)  # ended before the epoch: the seed's rows hold it
        assert (await limiter.quota_used(1))["day"] == 10
        wall.set("2026-03-31T12:00:02")
        await settle(limiter, late, 5)  # ended after it: counted here, its 25 unused not given back
        assert (await limiter.quota_used(1))["day"] == 15
        await settle(limiter, fresh, 0)  # the new counter's own: refunded as ever
        assert (await limiter.quota_used(1))["day"] == 5
    finally:
        await limiter.close()
