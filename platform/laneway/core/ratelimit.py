"""Per-tenant limits: RPM and TPM token buckets, and max concurrent requests.

At admission a request reserves 1 request and prompt + max_tokens tokens; when it ends the
tokens it did not use are refunded. A bucket of capacity C refills at C per minute, so the
Retry-After of a refusal is exactly when the bucket can hold the request.

Two backends with one contract: process memory (one gateway), and Redis (one atomic Lua
script per decision, on Redis's clock, so any number of replicas enforce one limit).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from laneway.core.errors import GatewayError
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


class RateLimiter(Protocol):
    async def reserve(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> None:
        """Take 1 request and `tokens` tokens, and a concurrency slot; raise GatewayError(429) if not."""

    async def settle(self, tenant: TenantSnapshot, request_id: str, unused_tokens: int) -> None:
        """The request ended: give back its concurrency slot and the tokens it did not use."""

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

    async def reserve(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> None:
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

    async def settle(self, tenant: TenantSnapshot, request_id: str, unused_tokens: int) -> None:
        self._in_flight.get(tenant.id, set()).discard(request_id)
        if tenant.tpm and unused_tokens > 0:
            bucket = self._bucket(self._tpm, tenant.id, tenant.tpm, self._clock())
            bucket.level = min(bucket.capacity, bucket.level + unused_tokens)

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
    def __init__(self, url: str, prefix: str = "laneway:") -> None:
        import redis.asyncio as redis

        self._redis: Any = redis.Redis.from_url(url)
        self._prefix = prefix
        self._reserve = self._redis.register_script(_RESERVE)
        self._settle = self._redis.register_script(_SETTLE)

    def _keys(self, tenant_id: int) -> list[str]:
        base = f"{self._prefix}rl:{{{tenant_id}}}:"  # one hash slot per tenant (Redis Cluster)
        return [base + "rpm", base + "tpm", base + "inflight"]

    async def reserve(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> None:
        if tenant.tpm and tokens > tenant.tpm:
            raise too_large(tenant, tokens)
        args: list[int | str] = [
            tenant.rpm or 0,
            tenant.tpm or 0,
            tokens,
            tenant.max_concurrency or 0,
            request_id,
            STALE_HOLDER_S,
        ]
        verdict, wait_ms = await self._reserve(keys=self._keys(tenant.id), args=args)
        if verdict == 2:
            raise too_many_concurrent(tenant)
        if verdict == 1:
            raise rate_limited(tenant, int(wait_ms) / 1000.0)

    async def settle(self, tenant: TenantSnapshot, request_id: str, unused_tokens: int) -> None:
        await self._settle(keys=self._keys(tenant.id), args=[request_id, tenant.tpm or 0, max(0, unused_tokens)])

    async def close(self) -> None:
        await self._redis.aclose()
