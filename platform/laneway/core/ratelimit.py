"""Per-tenant limits: RPM and TPM token buckets, and max concurrent requests.

At admission a request reserves 1 request and prompt + max_tokens tokens; when it ends the
tokens it did not use are refunded. A bucket of capacity C refills at C per minute, so the
Retry-After of a refusal is exactly when the bucket can hold the request.

Two backends with one contract: process memory (one gateway), and Redis (one atomic Lua
script per decision, on Redis's clock, so any number of replicas enforce one limit).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import RedisError

from laneway.core.dependencies import DependencyHealth
from laneway.core.errors import GatewayError, dependency_unavailable
from laneway.core.redis_batch import ScriptBatcher, run_scripts
from laneway.types import TenantSnapshot

# A concurrency slot whose holder vanished (a replica crashed) is reclaimed after this long.
STALE_HOLDER_S = 600


def too_large(tenant: TenantSnapshot, tokens: int) -> GatewayError:
    return GatewayError(
        429,
        f"Request too large: it needs {tokens} tokens (prompt + max_tokens) and tenant '{tenant.name}' "
        f"may use {tenant.tpm} tokens per minute. Lower max_tokens or shorten the prompt.",
        code="request_too_large",
        type="rate_limit_error",
    )


def rate_limited(tenant: TenantSnapshot, wait_s: float) -> GatewayError:
    return GatewayError(
        429,
        f"Rate limit reached for tenant '{tenant.name}' (RPM {tenant.rpm or 'unlimited'}, "
        f"TPM {tenant.tpm or 'unlimited'}). Retry in {wait_s:.1f} s.",
        code="rate_limit_exceeded",
        retry_after=wait_s,
    )


def too_many_concurrent(tenant: TenantSnapshot) -> GatewayError:
    return GatewayError(
        429,
        f"Tenant '{tenant.name}' already has {tenant.max_concurrency} requests in flight.",
        code="concurrency_limit_exceeded",
        retry_after=1,
    )


@dataclass(slots=True)
class Reservation:
    """What one request took from its tenant's limits; settled once when it ends."""

    tenant: TenantSnapshot
    request_id: str
    tokens: int  # reserved: prompt + max_tokens
    local: bool = True  # held by process memory (the memory limiter, or Redis's fallback)


class RateLimiter(Protocol):
    # True when reserve() crosses the network: the caller then protects it from cancellation
    # (a reservation made while the client left must still be given back).
    remote: bool

    async def reserve(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation:
        """Take 1 request and `tokens` tokens, and a concurrency slot; raise GatewayError(429) if not."""

    def settle(self, reservation: Reservation, used_tokens: int) -> None:
        """The request ended: give back its concurrency slot and the tokens it did not use.
        Never blocks and never raises: a remote settle happens in the background."""

    async def close(self) -> None: ...


@dataclass(slots=True)
class TokenBucket:
    """Capacity `capacity`, refilled continuously at capacity per minute."""

    capacity: float
    level: float
    updated: float

    def refill(self, now: float, capacity: float) -> None:
        self.capacity = capacity
        self.level = min(capacity, self.level + max(0.0, now - self.updated) * capacity / 60.0)
        self.updated = now

    def wait_for(self, amount: float) -> float:
        """Seconds until the bucket holds `amount` (0 when it does now)."""
        return 0.0 if self.level >= amount else (amount - self.level) * 60.0 / self.capacity


class MemoryRateLimiter:
    remote = False

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rpm: dict[int, TokenBucket] = {}
        self._tpm: dict[int, TokenBucket] = {}
        self._in_flight: dict[int, set[str]] = {}

    def _bucket(self, table: dict[int, TokenBucket], tenant_id: int, capacity: int, now: float) -> TokenBucket:
        bucket = table.get(tenant_id)
        if bucket is None:
            bucket = table[tenant_id] = TokenBucket(capacity, capacity, now)
        bucket.refill(now, capacity)
        return bucket

    def in_flight(self, tenant_id: int) -> int:
        return len(self._in_flight.get(tenant_id, ()))

    @property
    def holders(self) -> int:
        """Concurrency holders of every tenant (0 when nothing runs: a leak shows here)."""
        return sum(len(h) for h in self._in_flight.values())

    async def reserve(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation:
        return self.reserve_now(tenant, tokens, request_id)

    def reserve_now(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation:
        if tenant.tpm and tokens > tenant.tpm:
            raise too_large(tenant, tokens)
        holders = self._in_flight.setdefault(tenant.id, set())
        if tenant.max_concurrency and len(holders) >= tenant.max_concurrency:
            raise too_many_concurrent(tenant)
        now = self._clock()
        rpm = self._bucket(self._rpm, tenant.id, tenant.rpm, now) if tenant.rpm else None
        tpm = self._bucket(self._tpm, tenant.id, tenant.tpm, now) if tenant.tpm else None
        wait = max(rpm.wait_for(1) if rpm else 0.0, tpm.wait_for(tokens) if tpm else 0.0)
        if wait > 0:
            raise rate_limited(tenant, wait)
        if rpm:
            rpm.level -= 1
        if tpm:
            tpm.level -= tokens
        holders.add(request_id)
        return Reservation(tenant, request_id, tokens)

    def settle(self, reservation: Reservation, used_tokens: int) -> None:
        tenant = reservation.tenant
        holders = self._in_flight.get(tenant.id)
        if holders is not None:
            holders.discard(reservation.request_id)
            if not holders:
                del self._in_flight[tenant.id]
        unused = reservation.tokens - used_tokens
        if tenant.tpm and unused > 0:
            bucket = self._bucket(self._tpm, tenant.id, tenant.tpm, self._clock())
            bucket.level = min(bucket.capacity, bucket.level + unused)

    async def close(self) -> None:
        return None


_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rpm, tpm, need = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local maxc, stale = tonumber(ARGV[4]), tonumber(ARGV[6])
local function level(key, cap)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local l, ts = tonumber(v[1]) or cap, tonumber(v[2]) or now
  return math.min(cap, l + math.max(0, now - ts) * cap / 60)
end
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - stale)
  if redis.call('ZCARD', KEYS[3]) >= maxc then return {2, 1000} end
end
local wait, lr, lt = 0, 0, 0
if rpm > 0 then
  lr = level(KEYS[1], rpm)
  if lr < 1 then wait = math.max(wait, (1 - lr) * 60 / rpm) end
end
if tpm > 0 then
  lt = level(KEYS[2], tpm)
  if lt < need then wait = math.max(wait, (need - lt) * 60 / tpm) end
end
if wait > 0 then return {1, math.ceil(wait * 1000)} end
local function store(key, l)
  redis.call('HSET', key, 'level', tostring(l), 'ts', tostring(now))
  redis.call('EXPIRE', key, 120)
end
if rpm > 0 then store(KEYS[1], lr - 1) end
if tpm > 0 then store(KEYS[2], lt - need) end
if maxc > 0 then redis.call('ZADD', KEYS[3], now, ARGV[5]); redis.call('EXPIRE', KEYS[3], stale) end
return {0, 0}
"""

_SETTLE = """
redis.call('ZREM', KEYS[3], ARGV[1])
local tpm, give = tonumber(ARGV[2]), tonumber(ARGV[3])
if tpm > 0 and give > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  local v = redis.call('HMGET', KEYS[2], 'level', 'ts')
  local l, ts = tonumber(v[1]) or tpm, tonumber(v[2]) or now
  l = math.min(tpm, l + math.max(0, now - ts) * tpm / 60 + give)
  redis.call('HSET', KEYS[2], 'level', tostring(l), 'ts', tostring(now))
  redis.call('EXPIRE', KEYS[2], 120)
end
return 0
"""


class RedisRateLimiter:
    """Limits shared by every replica, in Redis, with a contract for when Redis misbehaves.

    - A bounded *blocking* pool (redis-py's default pool raises MaxConnectionsError past its
      size), socket and connect timeouts (a frozen Redis must not hang requests), and one
      retry on a connection error (a pooled connection gone stale after a Redis restart).
    - A fault opens a breaker for `retry_after_s`: meanwhile requests do not wait on Redis at
      all. Then one request probes it. `failure_mode` says what happens while it is open:
      "open" serves with this replica's own limits (process memory, the same tenant limits:
      with N replicas a tenant may get up to N times its limit while Redis is down), "closed"
      refuses with 503 rate_limiter_unavailable + Retry-After. Never a 500.
    - Settles are batched in one pipeline by a background task, off the response path; those
      that fail are kept (bounded) and retried until Redis answers, so a tenant's concurrency
      holders and refunds are never lost to an outage.
    """

    remote = True

    def __init__(
        self,
        url: str,
        prefix: str = "laneway:",
        *,
        max_connections: int = 64,
        timeout_s: float = 0.25,
        failure_mode: str = "open",
        retry_after_s: float = 1.0,
        health: DependencyHealth | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        import redis.asyncio as redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError

        if failure_mode not in ("open", "closed"):
            raise ValueError(f"redis failure mode must be 'open' or 'closed', not {failure_mode!r}")
        pool = redis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_s,  # waiting for a free pooled connection
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            health_check_interval=30,
        )
        self._redis: Any = redis.Redis(connection_pool=pool)
        self._prefix = prefix
        self._reserve = self._redis.register_script(_RESERVE)
        self._settle = self._redis.register_script(_SETTLE)
        self._batch = ScriptBatcher(self._redis)  # a loop turn's reserves share one round trip
        self.failure_mode = failure_mode
        self._retry_after = retry_after_s
        self._health = health or DependencyHealth()
        self._clock = clock
        self.fallback = MemoryRateLimiter(clock)
        self._open_until = 0.0  # breaker: Redis is not asked before this time
        self._probing = False
        self._settles: deque[tuple[list[str], list[int | str]]] = deque(maxlen=100_000)
        self._settles_ready = asyncio.Event()
        self._settler: asyncio.Task[None] | None = None
        self._closing = False

    def _keys(self, tenant_id: int) -> list[str]:
        base = f"{self._prefix}rl:{{{tenant_id}}}:"  # one hash slot per tenant (Redis Cluster)
        return [base + "rpm", base + "tpm", base + "inflight"]

    @property
    def degraded(self) -> bool:
        return self._clock() < self._open_until

    def _trip(self, exc: BaseException) -> None:
        self._open_until = self._clock() + self._retry_after
        what = "serving with this replica's own limits" if self.failure_mode == "open" else "refusing with 503"
        self._health.failed("redis", exc, what)

    async def reserve(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation:
        if tenant.tpm and tokens > tenant.tpm:
            raise too_large(tenant, tokens)
        if self._clock() < self._open_until or self._probing:
            return self._without_redis(tenant, tokens, request_id)
        probe = self._open_until > 0  # the breaker was open: this request is its probe
        self._probing = probe
        args: list[int | str] = [
            tenant.rpm or 0,
            tenant.tpm or 0,
            tokens,
            tenant.max_concurrency or 0,
            request_id,
            STALE_HOLDER_S,
        ]
        keys = self._keys(tenant.id)
        try:
            verdict, wait_ms = await self._batch.call(self._reserve, keys, args)
        except (RedisError, OSError) as exc:  # redis' TimeoutError is a RedisError; OSError: refused
            self._trip(exc)
            # The script may have run before the answer was lost: forget its holder later.
            self._queue_settle(keys, [request_id, 0, 0])
            return self._without_redis(tenant, tokens, request_id)
        finally:
            if probe:
                self._probing = False
        if probe:
            self._open_until = 0.0
            self._health.recovered("redis")
        if verdict == 2:
            raise too_many_concurrent(tenant)
        if verdict == 1:
            raise rate_limited(tenant, int(wait_ms) / 1000.0)
        return Reservation(tenant, request_id, tokens, local=False)

    def _without_redis(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation:
        if self.failure_mode == "closed":
            raise dependency_unavailable("rate limiter", retry_after=self._retry_after)
        return self.fallback.reserve_now(tenant, tokens, request_id)

    def settle(self, reservation: Reservation, used_tokens: int) -> None:
        if reservation.local:
            self.fallback.settle(reservation, used_tokens)
            return
        tenant = reservation.tenant
        unused = max(0, reservation.tokens - used_tokens)
        self._queue_settle(self._keys(tenant.id), [reservation.request_id, tenant.tpm or 0, unused])

    def _queue_settle(self, keys: list[str], args: list[int | str]) -> None:
        self._settles.append((keys, args))
        self._settles_ready.set()
        if self._settler is None or self._settler.done():
            self._settler = asyncio.get_running_loop().create_task(self._run_settles(), name="redis-settles")

    @property
    def pending_settles(self) -> int:
        return len(self._settles)

    async def _run_settles(self) -> None:
        """Send queued settles in pipelines of up to 256; on a fault keep them and retry."""
        backoff = self._retry_after
        while self._settles or not self._closing:
            if not self._settles:
                self._settles_ready.clear()
                await self._settles_ready.wait()
                continue
            batch = [self._settles[i] for i in range(min(256, len(self._settles)))]
            try:
                replies = await run_scripts(self._redis, [(self._settle, keys, args) for keys, args in batch])
                failed = next((r for r in replies if isinstance(r, Exception)), None)
                if failed is not None:
                    raise failed
            except (RedisError, OSError) as exc:
                self._trip(exc)
                if self._closing:
                    return  # close() gave up waiting; what is left expires in Redis
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            backoff = self._retry_after
            for _ in batch:
                self._settles.popleft()

    async def settled(self, timeout_s: float = 2.0) -> bool:
        """Wait until every queued settle has been sent (tests, shutdown); False on timeout."""
        deadline = self._clock() + timeout_s
        while self._settles:
            if self._clock() > deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    async def close(self, timeout_s: float = 2.0) -> None:
        """Send what is still queued (for up to timeout_s), then close the connections."""
        self._closing = True
        self._settles_ready.set()
        if self._settler is not None:
            try:
                async with asyncio.timeout(timeout_s):
                    await asyncio.shield(self._settler)
            except TimeoutError:
                self._settler.cancel()
        await self._redis.aclose()
