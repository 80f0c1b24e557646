"""Token buckets and concurrency, on process memory and on real Redis (same contract)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from laneway.contracts.errors import GatewayError
from laneway.core.ratelimit import (
    ADMIT_AT_ONCE_UNANSWERED,
    MemoryRateLimiter,
    RateLimiter,
    RedisRateLimiter,
    Reservation,
    TokenBucket,
)
from laneway.types import TenantSnapshot
from support import REDIS_URL, PrivateRedis, require_service


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


# Admitting at once (RedisRateLimiter.reserve_at_once, core/ratelimit/headroom.py): far from its
# limits a request does not wait for Redis; Redis still counts it, and near a limit decides.


async def take(limiter: RedisRateLimiter, t: TenantSnapshot, tokens: int, request_id: str) -> Reservation:
    """As the pipeline reserves: at once where the limiter may, else waiting for Redis."""
    return limiter.reserve_at_once(t, tokens, request_id) or await limiter.reserve(t, tokens, request_id)


async def redis_state(prefix: str, tenant_id: int) -> tuple[int, float, int]:
    """(concurrency holders, rpm bucket level, tokens counted today) as Redis has them."""
    import redis.asyncio as redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        base = f"{prefix}rl:{{{tenant_id}}}:"
        holders = await client.zcard(base + "inflight")
        level = await client.hget(base + "rpm", "level")
        days = [k for k in await client.keys(base + "used:day:*")]
        today = int(await client.get(days[0])) if days else 0
    finally:
        await client.aclose()
    return holders, float(level) if level is not None else float("nan"), today


@pytest.fixture
async def redis_limiter() -> AsyncIterator[RedisRateLimiter]:
    require_service("Redis", "127.0.0.1", 6379)
    limiter = RedisRateLimiter(REDIS_URL, prefix=f"lwtest:{uuid.uuid4().hex}:")
    yield limiter
    await limiter.close()


async def test_far_from_its_limits_a_request_is_admitted_at_once_and_still_counted(
    redis_limiter: RedisRateLimiter,
) -> None:
    limiter, prefix = redis_limiter, redis_limiter._prefix
    t = tenant(rpm=1000, tpm=1_000_000, max_concurrency=100)
    assert limiter.reserve_at_once(t, 10, "first") is None  # nothing known of its room yet: Redis decides
    held = [await limiter.reserve(t, 10, "first")]
    for i in range(20):  # no await between them: every one decided here and now
        reservation = limiter.reserve_at_once(t, 10, f"r{i}")
        if reservation is None:
            break
        held.append(reservation)
    assert len(held) > 5 and limiter.admitted_at_once == len(held) - 1
    # Redis counts each of them (a holder, a request, the tokens) once its batch has gone out.
    assert (await limiter.quota_used(t.id))["day"] == 10 * len(held)  # read after them, in order
    holders, level, today = await redis_state(prefix, t.id)
    assert holders == len(held) and level == pytest.approx(1000 - len(held), abs=1) and today == 10 * len(held)
    for reservation in held:
        limiter.settle(reservation, 4)  # before the answers of some: the settle follows its reserve's
    assert await limiter.settled()
    holders, _, today = await redis_state(prefix, t.id)
    assert holders == 0 and today == 4 * len(held)
    # A lowered limit (a new snapshot) is Redis's to apply at once, not the old room's: the
    # bucket is clamped to the new capacity, 2.
    lowered = tenant(rpm=2, tpm=1_000_000, max_concurrency=100)
    assert limiter.reserve_at_once(lowered, 10, "a") is None
    await take(limiter, lowered, 10, "a")
    await take(limiter, lowered, 10, "b")
    with pytest.raises(GatewayError) as info:
        await take(limiter, lowered, 10, "c")
    assert info.value.code == "rate_limit_exceeded"


async def test_near_a_limit_redis_decides_so_one_replica_never_passes_it(redis_limiter: RedisRateLimiter) -> None:
    t = tenant(rpm=25)
    admitted, refused = 0, 0
    for i in range(40):  # in bursts, some answered meanwhile, some not
        try:
            await take(redis_limiter, t, 1, f"r{i}")
            admitted += 1
        except GatewayError as exc:
            assert exc.code == "rate_limit_exceeded"
            refused += 1
    assert redis_limiter.admitted_at_once > 0  # the room was shared while there was some
    assert (admitted, refused) == (25, 15)


async def test_two_replicas_admitting_at_once_pass_a_limit_by_their_share_at_most() -> None:
    """Each replica admits at once at most share (10 %) of the room it last heard of; what the
    other took meanwhile it learns one round trip later. So a limit raced for by two replicas
    may be passed by a few requests (Headroom's bound), never by more."""
    require_service("Redis", "127.0.0.1", 6379)
    prefix = f"lwtest:{uuid.uuid4().hex}:"
    a, b = RedisRateLimiter(REDIS_URL, prefix), RedisRateLimiter(REDIS_URL, prefix)
    t = tenant(max_concurrency=150, tpm=1_000_000)
    try:
        outcomes: list[object] = []
        for wave in range(20):  # each replica's requests of a wave arrive together, interleaved
            outcomes += await asyncio.gather(
                *(_attempt(a if i % 2 else b, t, f"r{wave}.{i}") for i in range(20)), return_exceptions=True
            )
        admitted = [o for o in outcomes if isinstance(o, Reservation)]
        assert all(isinstance(o, Reservation | GatewayError) for o in outcomes), outcomes
        assert a.admitted_at_once > 0 and b.admitted_at_once > 0
        assert 150 <= len(admitted) <= 150 + 2 * 0.1 * 150  # every holder is still held: nothing refunds
        assert await a.settled() and await b.settled()
        holders, _, _ = await redis_state(prefix, t.id)
        assert holders == len(admitted)  # Redis counted every one
    finally:
        await a.close()
        await b.close()


async def _attempt(limiter: RedisRateLimiter, t: TenantSnapshot, request_id: str) -> Reservation:
    await asyncio.sleep(0)  # the replicas' requests arrive interleaved
    return await take(limiter, t, 10, request_id)


async def test_a_reserve_admitted_at_once_that_redis_never_answered_leaves_no_holder(
    private_redis: PrivateRedis,
) -> None:
    prefix = f"lwtest:{uuid.uuid4().hex}:"
    limiter = RedisRateLimiter(private_redis.url, prefix, timeout_s=0.2, retry_after_s=0.2)
    t = tenant(max_concurrency=100)
    try:
        await limiter.reserve(t, 10, "first")  # Redis answered: the room is known
        private_redis.freeze()
        reservation = limiter.reserve_at_once(t, 10, "lost")
        assert reservation is not None and reservation.answer is not None
        with pytest.raises(Exception):  # noqa: B017 - Redis's timeout, whatever its class
            await reservation.answer
        assert limiter.degraded  # the breaker opened: meanwhile the replica's own limits decide
        limiter.settle(reservation, 0)
        private_redis.thaw()  # the frozen Redis now runs the reserve it had been sent ...
        assert await limiter.settled(timeout_s=10)  # ... and the settle that forgets its holder
        import redis.asyncio as redis

        client = redis.Redis.from_url(private_redis.url)
        try:
            assert await client.zrange(f"{prefix}rl:{{{t.id}}}:inflight", 0, -1) == [b"first"]
        finally:
            await client.aclose()
    finally:
        private_redis.thaw()
        await limiter.close()


async def test_a_redis_that_falls_behind_slows_admission_at_once(redis_limiter: RedisRateLimiter) -> None:
    """However much room a tenant has (here: no limit at all), only so many reserves admitted
    at once may wait for Redis's answer; past that, requests wait for Redis (backpressure)."""
    t = tenant()
    first = await redis_limiter.reserve(t, 10, "first")
    admitted = [first]
    for i in range(100):  # nothing is answered meanwhile: the loop never runs
        reservation = redis_limiter.reserve_at_once(t, 10, f"r{i}")
        if reservation is None:
            break
        admitted.append(reservation)
    assert len(admitted) == 1 + ADMIT_AT_ONCE_UNANSWERED
    for reservation in admitted:
        redis_limiter.settle(reservation, 10)
    assert await redis_limiter.settled()
    assert redis_limiter.reserve_at_once(t, 10, "again") is not None  # answered: room again


async def test_shutdown_sends_the_reserves_admitted_at_once_and_their_settles(redis_limiter: RedisRateLimiter) -> None:
    """close() right after requests admitted at once ended, before Redis answered any of
    their reserves: each reserve and then its settle still reach Redis, and no holder is left."""
    t = tenant(max_concurrency=1000)
    held = [await redis_limiter.reserve(t, 10, "first")]
    held += [r for i in range(10) if (r := redis_limiter.reserve_at_once(t, 10, f"r{i}")) is not None]
    assert len(held) == 11 and all(r.answer is not None and not r.answer.done() for r in held[1:])
    for reservation in held:
        redis_limiter.settle(reservation, 4)  # each waits for its reserve's answer
    await redis_limiter.close()
    holders, _, today = await redis_state(redis_limiter._prefix, t.id)
    assert holders == 0 and today == 4 * len(held)
