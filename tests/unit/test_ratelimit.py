"""Token buckets and concurrency, on process memory and on real Redis (same contract)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest
from laneway.core.errors import GatewayError
from laneway.core.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter, Reservation, TokenBucket
from laneway.types import TenantSnapshot
from services import require_service

REDIS_URL = os.environ.get("LANEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tenant(**kw: int) -> TenantSnapshot:
    return TenantSnapshot(id=kw.pop("id", 1), name="acme", api_key_id=1, **kw)  # type: ignore[arg-type]


def test_bucket_wait_is_exactly_the_refill_time() -> None:
    b = TokenBucket(capacity=60, level=0, updated=0)
    assert b.wait_for(30) == pytest.approx(30.0)  # 60/min refills 1 per second
    b.refill(10, 60)
    assert b.level == pytest.approx(10) and b.wait_for(10) == 0


async def test_rpm_refuses_with_retry_after_from_the_bucket() -> None:
    clock = Clock()
    limiter = MemoryRateLimiter(clock)
    t = tenant(rpm=2)
    await limiter.reserve(t, 10, "a")
    await limiter.reserve(t, 10, "b")
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(t, 10, "c")
    assert info.value.status == 429 and info.value.code == "rate_limit_exceeded"
    assert info.value.headers["Retry-After"] == "30"  # one request refills in 60/2 s
    clock.now += 30
    await limiter.reserve(t, 10, "c")


async def test_tpm_reserves_then_refunds_what_was_not_used() -> None:
    clock = Clock()
    limiter = MemoryRateLimiter(clock)
    t = tenant(tpm=100)
    a = await limiter.reserve(t, 80, "a")
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(t, 50, "b")
    assert info.value.headers["Retry-After"] == "18"  # 30 missing tokens at 100/60 per s = 18 s
    limiter.settle(a, used_tokens=20)  # 60 of its 80 come back
    await limiter.reserve(t, 50, "b")


async def test_request_larger_than_tpm_is_refused_as_too_large() -> None:
    with pytest.raises(GatewayError) as info:
        await MemoryRateLimiter().reserve(tenant(tpm=100), 101, "a")
    assert info.value.status == 429 and info.value.code == "request_too_large"


async def test_lowering_a_limit_applies_to_the_next_request() -> None:
    limiter = MemoryRateLimiter(Clock())
    for i in range(10):
        await limiter.reserve(tenant(rpm=100), 1, f"a{i}")
    # Lowered to 1/min: the bucket (90 left) is clamped to the new capacity, 1.
    await limiter.reserve(tenant(rpm=1), 1, "b")
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(tenant(rpm=1), 1, "c")
    assert info.value.headers["Retry-After"] == "60"


async def settle(limiter: RateLimiter, reservation: Reservation, used_tokens: int) -> None:
    """Settle and wait until it has landed (Redis settles are sent in the background)."""
    limiter.settle(reservation, used_tokens)
    if isinstance(limiter, RedisRateLimiter):
        await limiter.settled()


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    if request.param == "memory":
        yield MemoryRateLimiter()
        return
    require_service("Redis", "127.0.0.1", 6379)
    redis_limiter = RedisRateLimiter(REDIS_URL, prefix=f"lwtest:{uuid.uuid4().hex}:")
    yield redis_limiter
    await redis_limiter.close()


async def test_max_concurrency_counts_requests_in_flight(limiter: RateLimiter) -> None:
    t = tenant(max_concurrency=2)
    a = await limiter.reserve(t, 1, "a")
    await limiter.reserve(t, 1, "b")
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(t, 1, "c")
    assert info.value.code == "concurrency_limit_exceeded" and info.value.headers["Retry-After"] == "1"
    await settle(limiter, a, 0)
    await limiter.reserve(t, 1, "c")


async def test_contract_rpm_and_tpm(limiter: RateLimiter) -> None:
    t = tenant(rpm=3, tpm=1000)
    for i in range(3):
        await limiter.reserve(t, 100, f"r{i}")
    with pytest.raises(GatewayError) as info:
        await limiter.reserve(t, 100, "r3")
    assert 19 <= int(info.value.headers["Retry-After"]) <= 20  # 1 request at 3/min
    other = tenant(id=2, tpm=300)
    x = await limiter.reserve(other, 300, "x")
    with pytest.raises(GatewayError):
        await limiter.reserve(other, 100, "y")
    await settle(limiter, x, used_tokens=100)
    await limiter.reserve(other, 100, "y")


async def test_two_redis_limiters_enforce_one_limit() -> None:
    require_service("Redis", "127.0.0.1", 6379)
    prefix = f"lwtest:{uuid.uuid4().hex}:"
    a, b = RedisRateLimiter(REDIS_URL, prefix), RedisRateLimiter(REDIS_URL, prefix)
    t = tenant(rpm=4)
    outcomes = []
    try:
        for i in range(6):
            try:
                await (a if i % 2 else b).reserve(t, 1, f"r{i}")
                outcomes.append(True)
            except GatewayError:
                outcomes.append(False)
    finally:
        await a.close()
        await b.close()
    assert outcomes == [True, True, True, True, False, False]
