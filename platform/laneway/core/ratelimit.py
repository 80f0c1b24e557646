"""Per-tenant and per-key limits: RPM and TPM token buckets, max concurrent requests, and
token quotas per UTC day and month.

At admission a request reserves 1 request and prompt + max_tokens tokens; when it ends the
tokens it did not use are refunded. A bucket of capacity C refills at C per minute, so the
Retry-After of a refusal is exactly when the bucket can hold the request. An API key's own
limits (TenantSnapshot.key_*) are enforced in addition to its tenant's, in buckets of its own.

Quotas (core/quota.py) count the tokens of every tenant per calendar period (so a quota set
mid-month applies to the month's real use, and admins see it); a request that would take a
tenant past a quota is refused until the period resets. Reserved like TPM, refunded like TPM.

Two backends with one contract: process memory (one gateway), and Redis (one atomic Lua
script per decision, on Redis's clock, so any number of replicas enforce one limit; the
quota periods come from the limiter's wall clock, which tests inject; far from a tenant's
limits a replica admits at once on Redis's last answer, see Headroom). Both count quotas from
the usage table when their counters are gone: memory at start-up, Redis when a counter turns
out lost (core/quota_recovery.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.core.dependencies import DependencyHealth
from laneway.core.errors import GatewayError, dependency_unavailable
from laneway.core.quota import PERIOD_KINDS, Period, period, quota_exceeded, quota_limit, quota_too_small, quotas
from laneway.core.quota_recovery import CounterRecovery
from laneway.core.redis_batch import ScriptPipe
from laneway.db.repositories import UsageRepository
from laneway.types import TenantSnapshot

log = logging.getLogger(__name__)

# A concurrency slot whose holder vanished (a replica crashed) is reclaimed after this long.
STALE_HOLDER_S = 600
SETTLE_LINGER_S = 0.005  # how long a settle waits for a batch of reserves to ride with
# A replica admits at once (Headroom) on what Redis said within this long; older: Redis decides.
ADMIT_AT_ONCE_FOR_S = 1.0
# ... and while fewer than this many of its reserves admitted at once are unanswered: past it,
# requests wait for Redis again, so a Redis that falls behind slows admission (backpressure)
# instead of receiving reserves faster than it runs them.
ADMIT_AT_ONCE_UNANSWERED = 64


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


def key_rate_limited(tenant: TenantSnapshot, wait_s: float) -> GatewayError:
    return GatewayError(
        429,
        f"Rate limit reached for this API key of tenant '{tenant.name}' (key RPM {tenant.key_rpm or 'unlimited'}, "
        f"key TPM {tenant.key_tpm or 'unlimited'}). Retry in {wait_s:.1f} s.",
        code="rate_limit_exceeded",
        retry_after=wait_s,
    )


def key_too_many_concurrent(tenant: TenantSnapshot) -> GatewayError:
    return GatewayError(
        429,
        f"This API key of tenant '{tenant.name}' already has {tenant.key_max_concurrency} requests in flight.",
        code="concurrency_limit_exceeded",
        retry_after=1,
    )


def check_size(tenant: TenantSnapshot, tokens: int) -> None:
    """Refuse a request no wait would let through: larger than a TPM bucket or a whole quota."""
    if tenant.tpm and tokens > tenant.tpm:
        raise too_large(tenant, tokens)
    if tenant.key_tpm and tokens > tenant.key_tpm:
        raise GatewayError(
            429,
            f"Request too large: it needs {tokens} tokens (prompt + max_tokens) and this API key may use "
            f"{tenant.key_tpm} tokens per minute. Lower max_tokens or shorten the prompt.",
            code="request_too_large",
            type="rate_limit_error",
        )
    for kind in PERIOD_KINDS:
        limit = quota_limit(tenant, kind)
        if limit and tokens > limit:
            raise quota_too_small(tenant, kind, limit, tokens)


@dataclass(slots=True)
class Reservation:
    """What one request took from its tenant's limits; settled once when it ends."""

    tenant: TenantSnapshot
    request_id: str
    tokens: int  # reserved: prompt + max_tokens
    local: bool = True  # held by process memory (the memory limiter, or Redis's fallback)
    # The quota periods it was counted in ("day:2026-03-31", "month:2026-03"): the refund goes
    # back to them even when it lands after the boundary.
    periods: tuple[str, ...] = ()
    # Redis: each period counter's epoch when it was counted (core/quota_recovery.py): a
    # counter lost and begun again since then never held this reservation.
    epochs: tuple[str, ...] = ()
    # Redis, admitted at once (RedisRateLimiter.reserve_at_once): the reserve's reply, still to
    # come when the request began; its settle waits for it (the epochs come with it).
    answer: asyncio.Future[Any] | None = None


class RateLimiter(Protocol):
    wall_clock: Callable[[], float]  # epoch seconds: which quota period is current (injectable)

    async def reserve(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation:
        """Take 1 request and `tokens` tokens, and a concurrency slot; raise GatewayError(429) if not."""

    def reserve_at_once(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation | None:
        """reserve()'s decision where it can be taken without waiting: the reservation, or the
        refusal raised; None: await reserve(), which crosses the network (the caller protects
        it from cancellation: a reservation made while the client left must be given back)."""

    def settle(self, reservation: Reservation, used_tokens: int) -> None:
        """The request ended: give back its concurrency slot and the tokens it did not use.
        Never blocks and never raises: a remote settle happens in the background."""

    async def quota_used(self, tenant_id: int) -> dict[str, int]:
        """Tokens counted against the tenant in the current day and month ({"day": n, "month": n}),
        reservations in flight included. For admins: never called on the request path."""

    async def load_used(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        """Count this day's and month's tokens from the usage table, the durable truth: at
        start-up (memory), or whenever a counter turns out lost (Redis)."""

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
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self._clock = clock
        self.wall_clock = wall_clock  # epoch seconds: which quota period is current
        self._rpm: dict[int, TokenBucket] = {}
        self._tpm: dict[int, TokenBucket] = {}
        self._in_flight: dict[int, set[str]] = {}
        self._key_rpm: dict[int, TokenBucket] = {}  # by API key id
        self._key_tpm: dict[int, TokenBucket] = {}
        self._key_in_flight: dict[int, set[str]] = {}
        self._used: dict[int, dict[str, int]] = {}  # tenant -> period name -> tokens counted

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

    def reserve_at_once(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation | None:
        return self.reserve_now(tenant, tokens, request_id)

    def reserve_now(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation:
        check_size(tenant, tokens)
        wall = self.wall_clock()
        periods = [period(kind, wall) for kind in PERIOD_KINDS]
        used = self._used.setdefault(tenant.id, {})
        for p, limit in quotas(tenant, wall):  # past a quota only its reset helps: said first
            if used.get(p.name, 0) + tokens > limit:
                raise quota_exceeded(tenant, p, limit, used.get(p.name, 0), wall)
        holders = self._in_flight.setdefault(tenant.id, set())
        if tenant.max_concurrency and len(holders) >= tenant.max_concurrency:
            raise too_many_concurrent(tenant)
        key = tenant.api_key_id
        key_holders = self._key_in_flight.get(key, set())
        if tenant.key_max_concurrency and len(key_holders) >= tenant.key_max_concurrency:
            raise key_too_many_concurrent(tenant)
        now = self._clock()
        rpm = self._bucket(self._rpm, tenant.id, tenant.rpm, now) if tenant.rpm else None
        tpm = self._bucket(self._tpm, tenant.id, tenant.tpm, now) if tenant.tpm else None
        key_rpm = self._bucket(self._key_rpm, key, tenant.key_rpm, now) if tenant.key_rpm else None
        key_tpm = self._bucket(self._key_tpm, key, tenant.key_tpm, now) if tenant.key_tpm else None
        wait = max(rpm.wait_for(1) if rpm else 0.0, tpm.wait_for(tokens) if tpm else 0.0)
        key_wait = max(key_rpm.wait_for(1) if key_rpm else 0.0, key_tpm.wait_for(tokens) if key_tpm else 0.0)
        if wait > 0 or key_wait > 0:
            raise key_rate_limited(tenant, key_wait) if key_wait > wait else rate_limited(tenant, wait)
        for bucket, amount in ((rpm, 1), (tpm, tokens), (key_rpm, 1), (key_tpm, tokens)):
            if bucket is not None:
                bucket.level -= amount
        holders.add(request_id)
        self._key_in_flight.setdefault(key, set()).add(request_id)
        self._count(used, periods, tokens)
        return Reservation(tenant, request_id, tokens, periods=tuple(p.name for p in periods))

    @staticmethod
    def _count(used: dict[str, int], periods: list[Period], tokens: int) -> None:
        for p in periods:
            if p.name not in used:  # a new period: the last one's count is not needed any more
                for name in [n for n in used if n.startswith(p.kind + ":")]:
                    del used[name]
            used[p.name] = used.get(p.name, 0) + tokens

    async def load_used(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        """Start this day's and month's counts from the usage table (at start-up): in memory
        mode a restart must not hand every tenant a fresh quota. Rows still unwritten when the
        last process ended (the spool) are not counted."""
        wall = self.wall_clock()
        async with sessions() as session:
            repo = UsageRepository(session)
            for kind in PERIOD_KINDS:
                p = period(kind, wall)
                for tenant_id, tokens in (await repo.tokens_since(p.start)).items():
                    self._used.setdefault(tenant_id, {})[p.name] = tokens

    async def quota_used(self, tenant_id: int) -> dict[str, int]:
        wall = self.wall_clock()
        used = self._used.get(tenant_id, {})
        return {kind: used.get(period(kind, wall).name, 0) for kind in PERIOD_KINDS}

    def settle(self, reservation: Reservation, used_tokens: int) -> None:
        tenant = reservation.tenant
        for flights, ident in ((self._in_flight, tenant.id), (self._key_in_flight, tenant.api_key_id)):
            holders = flights.get(ident)
            if holders is not None:
                holders.discard(reservation.request_id)
                if not holders:
                    del flights[ident]
        unused = reservation.tokens - used_tokens
        if unused <= 0:
            return
        now = self._clock()
        for table, ident, capacity in ((self._tpm, tenant.id, tenant.tpm),
                                       (self._key_tpm, tenant.api_key_id, tenant.key_tpm)):  # fmt: skip
            if capacity:
                bucket = self._bucket(table, ident, capacity, now)
                bucket.level = min(bucket.capacity, bucket.level + unused)
        counted = self._used.get(tenant.id, {})
        for name in reservation.periods:
            if name in counted:  # else its period is over and forgotten: nothing to give back to
                counted[name] = max(0, counted[name] - unused)

    async def close(self) -> None:
        return None


# KEYS: the tenant's rpm, tpm, inflight; its API key's rpm, tpm, inflight; the tenant's token
# counters of the current day and month, and each counter's epoch hash. ARGV: rpm, tpm, need,
# maxc, request id, stale, the key's rpm, tpm, maxc, the day's and the month's quota (0: none),
# each counter's TTL, the epoch a counter begun now gets (core/quota_recovery.py), and "1" for
# a request already admitted by this replica (RedisRateLimiter.reserve_at_once): taken whatever
# the limits say, so that the counters stay the true record of what was served.
# Verdicts: 0 taken (then: the counters still to be seeded from the usage rows, bit 1 the
# day's, 2 the month's; each counter's epoch; and the room each limit has left after this
# request - the tenant's rpm, tpm, concurrency, the key's rpm, tpm, concurrency, the day's and
# the month's quota - 0 for a limit not set: Headroom.answered); 1 tenant rate (wait ms);
# 2 tenant concurrency; 3 key rate (wait ms); 4 key concurrency; 5 day quota, 6 month quota
# (tokens used).
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rpm, tpm, need = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local maxc, stale = tonumber(ARGV[4]), tonumber(ARGV[6])
local krpm, ktpm, kmaxc = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local quota = {tonumber(ARGV[10]), tonumber(ARGV[11])}
local admitted = ARGV[15] == '1'
local used = {0, 0}
for i = 1, 2 do
  if quota[i] > 0 then
    used[i] = tonumber(redis.call('GET', KEYS[6 + i]) or '0')
    if used[i] + need > quota[i] and not admitted then return {4 + i, used[i]} end
  end
end
local function level(key, cap)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local l, ts = tonumber(v[1]) or cap, tonumber(v[2]) or now
  return math.min(cap, l + math.max(0, now - ts) * cap / 60)
end
local function held(key)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - stale)
  return redis.call('ZCARD', key)
end
local c, kc = 0, 0
if maxc > 0 then
  c = held(KEYS[3])
  if c >= maxc and not admitted then return {2, 1000} end
end
if kmaxc > 0 then
  kc = held(KEYS[6])
  if kc >= kmaxc and not admitted then return {4, 1000} end
end
local function waits(rk, tk, r, tt)
  local wait, lr, lt = 0, 0, 0
  if r > 0 then
    lr = level(rk, r)
    if lr < 1 then wait = math.max(wait, (1 - lr) * 60 / r) end
  end
  if tt > 0 then
    lt = level(tk, tt)
    if lt < need then wait = math.max(wait, (need - lt) * 60 / tt) end
  end
  return wait, lr, lt
end
local wait, lr, lt = waits(KEYS[1], KEYS[2], rpm, tpm)
local kwait, klr, klt = waits(KEYS[4], KEYS[5], krpm, ktpm)
if not admitted then
  if kwait > wait then return {3, math.ceil(kwait * 1000)} end
  if wait > 0 then return {1, math.ceil(wait * 1000)} end
end
local function store(key, l)
  redis.call('HSET', key, 'level', tostring(l), 'ts', tostring(now))
  redis.call('EXPIRE', key, 120)
end
if rpm > 0 then store(KEYS[1], lr - 1) end
if tpm > 0 then store(KEYS[2], lt - need) end
if krpm > 0 then store(KEYS[4], klr - 1) end
if ktpm > 0 then store(KEYS[5], klt - need) end
if maxc > 0 then redis.call('ZADD', KEYS[3], now, ARGV[5]); redis.call('EXPIRE', KEYS[3], stale) end
if kmaxc > 0 then redis.call('ZADD', KEYS[6], now, ARGV[5]); redis.call('EXPIRE', KEYS[6], stale) end
local unseeded, epochs = 0, {}
for i = 1, 2 do
  -- every tenant is counted (admins see it; a quota set mid-month applies to the month's use)
  if redis.call('EXISTS', KEYS[6 + i]) == 0 then
    -- a new period, or Redis lost the counter: begin it; the gateway adds the usage rows
    redis.call('SET', KEYS[6 + i], need, 'EX', ARGV[11 + i])
    local epoch = ARGV[14] .. '/' .. t[1] .. '.' .. t[2]  -- unique even on a frozen wall clock
    redis.call('HSET', KEYS[8 + i], 'epoch', epoch, 'seeded', -1)
    redis.call('EXPIRE', KEYS[8 + i], ARGV[11 + i])
    unseeded, epochs[i] = unseeded + i, epoch
  else
    redis.call('INCRBY', KEYS[6 + i], need)
    local e = redis.call('HMGET', KEYS[8 + i], 'epoch', 'seeded')
    epochs[i] = e[1] or ''
    if e[1] and e[2] == '-1' then unseeded = unseeded + i end
  end
end
-- what is left of each limit once this request is counted (a replica admits at once within it)
return {0, unseeded, epochs[1], epochs[2], math.floor(lr - 1), math.floor(lt - need), maxc - c - 1,
        math.floor(klr - 1), math.floor(klt - need), kmaxc - kc - 1, quota[1] - used[1] - need,
        quota[2] - used[2] - need}
"""

_READ = "return redis.call('MGET', unpack(KEYS))"  # quota_used: the counters, in the pipe's order

# KEYS as _RESERVE's (the reservation's periods). ARGV: request id, tpm, tokens to give back,
# the key's tpm, tokens used, when it ended (the wall clock, as the usage row's created_at),
# the epochs of the day's and the month's counter it was counted in. A counter whose period is
# over has expired: it is not brought back. One begun again since the reservation (Redis lost
# it) never held the reservation: nothing is given back to it, and the tokens used are added
# when the request ended after the epoch (its usage row is after it, so the rows the gateway
# adds - those before it - do not hold it); core/quota_recovery.py.
_SETTLE = """
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
local tpm, give, ktpm = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]) or 0
local used, ended = tonumber(ARGV[5]) or 0, tonumber(ARGV[6]) or 0
for i = 1, 2 do
  if redis.call('EXISTS', KEYS[6 + i]) == 1 then
    local epoch = redis.call('HGET', KEYS[8 + i], 'epoch') or ''
    if epoch == (ARGV[6 + i] or '') then
      if give > 0 and redis.call('DECRBY', KEYS[6 + i], give) < 0 then
        redis.call('SET', KEYS[6 + i], 0, 'KEEPTTL')
      end
    elseif used > 0 and epoch ~= '' then
      local began = tonumber(string.match(epoch, '^[^/]+'))
      if began and ended >= began then redis.call('INCRBY', KEYS[6 + i], used) end
    end
  end
end
if give > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  local function refund(key, cap)
    local v = redis.call('HMGET', key, 'level', 'ts')
    local l, ts = tonumber(v[1]) or cap, tonumber(v[2]) or now
    l = math.min(cap, l + math.max(0, now - ts) * cap / 60 + give)
    redis.call('HSET', key, 'level', tostring(l), 'ts', tostring(now))
    redis.call('EXPIRE', key, 120)
  end
  if tpm > 0 then refund(KEYS[2], tpm) end
  if ktpm > 0 then refund(KEYS[5], ktpm) end
end
return 0
"""


def _epochs(reply: list[Any]) -> tuple[str, str]:
    """The counters' epochs in _RESERVE's reply when it took the request."""
    return tuple(e.decode() if isinstance(e, bytes) else str(e) for e in reply[2:4])  # type: ignore[return-value]


# A period's counter outlives its period by this much (a settle that lands just after the
# boundary still finds it; admins can read yesterday's for a while).
COUNTER_GRACE_S = 3600


class Headroom:
    """What a tenant's limits (and its API key's) had left at Redis's latest answer for it, and
    what this replica has admitted at once since, not yet answered (reserve_at_once).

    Redis answers one connection's calls in order, so at each answer the requests still
    unanswered are exactly those this replica sent after it. It admits at once only while they
    stay within `share` (10 %) of the room the answer left, in every limit: so one replica never
    passes a limit, and replicas racing for the last of one pass it by at most what each
    admitted within one round trip of the others, that share of the room it last heard of.
    Below ten requests' room (1 / share) nothing is admitted at once: Redis decides each
    request, as before.
    """

    __slots__ = ("answered_at", "pending", "pending_tokens", "periods", "request_room", "tenant", "token_room")

    def __init__(self, tenant: TenantSnapshot, periods: tuple[str, ...]) -> None:
        self.tenant = tenant  # the snapshot it was measured for: an admin change makes a new one
        self.periods = periods
        self.request_room = 0.0  # the smallest room of the limits counted in requests ...
        self.token_room = 0.0  # ... and in tokens (inf: no such limit)
        self.answered_at = 0.0
        self.pending = 0  # admitted at once, not answered yet
        self.pending_tokens = 0

    def answered(self, room: list[Any], at: float) -> None:
        """Redis's room after a reserve (_RESERVE's reply, in its order); 0 where no limit is set."""
        t = self.tenant
        requests = ((room[0], t.rpm), (room[2], t.max_concurrency), (room[3], t.key_rpm),
                    (room[5], t.key_max_concurrency))  # fmt: skip
        tokens = ((room[1], t.tpm), (room[4], t.key_tpm), (room[6], quota_limit(t, "day")),
                  (room[7], quota_limit(t, "month")))  # fmt: skip
        self.request_room = min((float(r) for r, cap in requests if cap), default=math.inf)
        self.token_room = min((float(r) for r, cap in tokens if cap), default=math.inf)
        self.answered_at = at

    def admits(self, tokens: int, share: float) -> bool:
        return (self.pending + 1 <= share * self.request_room
                and self.pending_tokens + tokens <= share * self.token_room)  # fmt: skip


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
    - Settles go off the response path, riding with the next batch of reserves
      (core/redis_batch.py); those that fail are kept (bounded) and retried until Redis
      answers, so a tenant's concurrency holders and refunds are never lost to an outage.
    """

    def __init__(
        self,
        url: str,
        prefix: str = "laneway:",
        *,
        max_connections: int = 64,
        timeout_s: float = 0.25,
        failure_mode: str = "open",
        retry_after_s: float = 1.0,
        share: float = 0.1,
        health: DependencyHealth | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
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
        self._read = self._redis.register_script(_READ)
        self._settle = self._redis.register_script(_SETTLE)
        self._batch = ScriptPipe(self._redis, timeout_s=timeout_s)  # a loop turn's reserves: one write
        self.failure_mode = failure_mode
        self._retry_after = retry_after_s
        self._health = health or DependencyHealth()
        self._clock = clock
        self.wall_clock = wall_clock  # epoch seconds: which quota period is current
        self.fallback = MemoryRateLimiter(clock, lambda: self.wall_clock())
        self._open_until = 0.0  # breaker: Redis is not asked before this time
        self._probing = False
        self._settles: deque[tuple[list[str], list[int | str]]] = deque(maxlen=100_000)  # failed: retried
        self._outstanding = 0  # settles handed to the batcher, not answered yet
        self._key_cache: dict[tuple[int, int, tuple[str, ...]], list[str]] = {}
        self._share = share  # of a limit's room a replica may admit at once (Headroom); 0: never
        self._headroom: dict[tuple[int, int], Headroom] = {}  # (tenant, API key) -> its room
        self.admitted_at_once = 0  # requests admitted without waiting for Redis (metrics, tests)
        self._unanswered = 0  # of those, the ones whose reserve Redis has not answered yet
        self.decided_by_redis = 0  # requests Redis answered for (admitted or refused)
        self._settler: asyncio.Task[None] | None = None
        self._closing = False
        self.recovery: CounterRecovery | None = None  # set by load_used(): counters from the usage rows

    def _keys(self, tenant_id: int) -> list[str]:
        base = f"{self._prefix}rl:{{{tenant_id}}}:"  # one hash slot per tenant (Redis Cluster)
        return [base + "rpm", base + "tpm", base + "inflight"]

    def _counter(self, tenant_id: int, period_name: str) -> str:
        return f"{self._prefix}rl:{{{tenant_id}}}:used:{period_name}"

    def _epoch(self, tenant_id: int, period_name: str) -> str:
        """The counter's epoch hash: when it began counting, and what was added from the usage rows."""
        return f"{self._prefix}rl:{{{tenant_id}}}:epoch:{period_name}"

    def _all_keys(self, tenant: TenantSnapshot, periods: tuple[str, ...]) -> list[str]:
        """_RESERVE's and _SETTLE's KEYS; the key's buckets share its tenant's hash slot.
        Kept per tenant, key and periods (eleven strings built on every call otherwise)."""
        at = (tenant.id, tenant.api_key_id, periods)
        keys = self._key_cache.get(at)
        if keys is None:
            if len(self._key_cache) >= 4096:  # a new day: the old periods' lists go
                self._key_cache.clear()
            keys = self._key_cache[at] = self._build_keys(tenant, periods)
        return keys

    def _build_keys(self, tenant: TenantSnapshot, periods: tuple[str, ...]) -> list[str]:
        key_base = f"{self._prefix}rl:{{{tenant.id}}}:key:{tenant.api_key_id}:"
        return [*self._keys(tenant.id), key_base + "rpm", key_base + "tpm", key_base + "inflight",
                *(self._counter(tenant.id, name) for name in periods),
                *(self._epoch(tenant.id, name) for name in periods)]  # fmt: skip

    async def load_used(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        """The counters live in Redis, shared: nothing to load at start-up. What this replica
        keeps is the way back to the usage table for a counter Redis turns out to have lost
        (core/quota_recovery.py), and its fallback's counts for an outage."""
        self.recovery = CounterRecovery(self._redis, sessions, self._counter, self._epoch, lambda: self.wall_clock())

    async def quota_used(self, tenant_id: int) -> dict[str, int]:
        """From Redis (an admin read, one round trip); raises RedisError when it is down. Read
        through the limiter's own connection, after what it sent before: the requests this
        replica admitted at once are counted."""
        wall = self.wall_clock()
        names = [self._counter(tenant_id, period(kind, wall).name) for kind in PERIOD_KINDS]
        values = await self._batch.call(self._read, names, [])
        return {kind: int(v or 0) for kind, v in zip(PERIOD_KINDS, values, strict=True)}

    @property
    def degraded(self) -> bool:
        return self._clock() < self._open_until

    def _trip(self, exc: BaseException) -> None:
        self._open_until = self._clock() + self._retry_after
        self._headroom.clear()  # what Redis said before the fault is not acted on after it
        what = "serving with this replica's own limits" if self.failure_mode == "open" else "refusing with 503"
        self._health.failed("redis", exc, what)

    def _call(
        self, tenant: TenantSnapshot, tokens: int, request_id: str, admitted: bool
    ) -> tuple[list[Period], list[str], list[int | str]]:
        """_RESERVE's periods, KEYS and ARGV for this request."""
        wall = self.wall_clock()
        periods = [period(kind, wall) for kind in PERIOD_KINDS]
        args: list[int | str] = [
            tenant.rpm or 0,
            tenant.tpm or 0,
            tokens,
            tenant.max_concurrency or 0,
            request_id,
            STALE_HOLDER_S,
            tenant.key_rpm or 0,
            tenant.key_tpm or 0,
            tenant.key_max_concurrency or 0,
            *(quota_limit(tenant, p.kind) or 0 for p in periods),
            *(int(p.seconds_left(wall)) + COUNTER_GRACE_S for p in periods),
            repr(wall),  # a counter begun now counts the usage rows before this (quota_recovery)
            "1" if admitted else "0",
        ]
        return periods, self._all_keys(tenant, tuple(p.name for p in periods)), args

    def reserve_at_once(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation | None:
        """Admit without waiting for Redis where this replica may (Headroom): the reserve goes
        out with the next batch, taken whatever Redis then says, and its settle follows its
        reply. While Redis is down the fallback decides at once too. Else None: reserve()."""
        decided = self._decided_without_redis(tenant, tokens, request_id)
        if decided is not None:
            return decided
        room = self._headroom.get((tenant.id, tenant.api_key_id))
        if (room is None or room.tenant is not tenant or not room.admits(tokens, self._share)
                or self._unanswered >= ADMIT_AT_ONCE_UNANSWERED
                or self._clock() - room.answered_at > ADMIT_AT_ONCE_FOR_S):  # fmt: skip
            return None
        periods, keys, args = self._call(tenant, tokens, request_id, admitted=True)
        names = tuple(p.name for p in periods)
        if names != room.periods:  # a new day: Redis says first
            return None
        room.pending += 1
        room.pending_tokens += tokens
        self._outstanding += 1
        self._unanswered += 1
        # Sent at the end of this loop turn, with whatever else this turn sends (the lingering
        # settles): not lingering on a timer of its own, whose wake-up costs more than the
        # write it would share (at 300/s: 1.21x memory's CPU with a 5 ms linger, see README).
        answer = self._batch.call(self._reserve, keys, args)
        reservation = Reservation(tenant, request_id, tokens, local=False, periods=names, answer=answer)
        answer.add_done_callback(partial(self._admitted_answer, room, reservation, periods))
        self.admitted_at_once += 1
        return reservation

    def _admitted_answer(
        self, room: Headroom, reservation: Reservation, periods: list[Period], answer: asyncio.Future[Any]
    ) -> None:
        """Redis's reply to a reserve admitted at once: the room it leaves, the epochs."""
        self._outstanding -= 1
        self._unanswered -= 1
        room.pending -= 1
        room.pending_tokens -= reservation.tokens
        exc = asyncio.CancelledError() if answer.cancelled() else answer.exception()
        if exc is not None:  # its settle forgets the holder, as for a reserve whose answer was lost
            self._headroom.pop((reservation.tenant.id, reservation.tenant.api_key_id), None)
            if isinstance(exc, RedisError | OSError | asyncio.CancelledError):
                self._trip(exc)
            else:
                log.error("a rate-limit reserve failed: %r", exc)
            return
        reply = answer.result()
        room.answered(reply[4:], self._clock())
        reservation.epochs = self._counted(reservation.tenant, periods, int(reply[1]), _epochs(reply))

    def _counted(
        self, tenant: TenantSnapshot, periods: list[Period], unseeded: int, counted_in: tuple[str, ...]
    ) -> tuple[str, ...]:
        """The epochs a reservation was counted in; counters begun without their usage rows are
        seeded from them in the background (core/quota_recovery.py)."""
        if unseeded and self.recovery is not None:  # off the request path: a background task
            for i, p in enumerate(periods):
                if unseeded & (1 << i):
                    self.recovery.schedule(tenant.id, p, counted_in[i])
        return counted_in

    async def reserve(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation:
        decided = self._decided_without_redis(tenant, tokens, request_id)
        if decided is not None:
            return decided
        probe = self._open_until > 0  # the breaker was open: this request is its probe
        self._probing = probe
        periods, keys, args = self._call(tenant, tokens, request_id, admitted=False)
        at = (tenant.id, tenant.api_key_id)
        try:
            reply = await self._batch.call(self._reserve, keys, args)
        except (RedisError, OSError) as exc:  # redis' TimeoutError is a RedisError; OSError: refused
            self._trip(exc)
            # The script may have run before the answer was lost: forget its holder later.
            self._queue_settle(keys, [request_id, 0, 0, 0, 0, 0])
            return self._without_redis(tenant, tokens, request_id)
        finally:
            if probe:
                self._probing = False
        if probe:
            self._open_until = 0.0
            self._health.recovered("redis")
        self.decided_by_redis += 1
        verdict, wait_ms = reply[0], reply[1]
        if verdict != 0:
            self._headroom.pop(at, None)  # at a limit: Redis decides each request until it has room again
            wall = self.wall_clock()
        if verdict == 2:
            raise too_many_concurrent(tenant)
        if verdict == 1:
            raise rate_limited(tenant, int(wait_ms) / 1000.0)
        if verdict == 4:
            raise key_too_many_concurrent(tenant)
        if verdict == 3:
            raise key_rate_limited(tenant, int(wait_ms) / 1000.0)
        if verdict in (5, 6):  # the second number is the tokens the period has used
            p = periods[verdict - 5]
            raise quota_exceeded(tenant, p, quota_limit(tenant, p.kind) or 0, int(wait_ms), wall)
        names = tuple(p.name for p in periods)
        room = self._headroom.get(at)
        if room is None or room.tenant is not tenant or room.periods != names:
            if len(self._headroom) >= 4096:
                self._headroom.clear()
            room = self._headroom[at] = Headroom(tenant, names)
        room.answered(reply[4:], self._clock())
        counted_in = self._counted(tenant, periods, int(wait_ms), _epochs(reply))
        return Reservation(tenant, request_id, tokens, local=False, periods=names, epochs=counted_in)

    def _decided_without_redis(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation | None:
        """What reserve() and reserve_at_once() decide before Redis: a request larger than its
        limits is refused; while the breaker is open (or its probe is out) the fallback decides.
        None: Redis's to decide."""
        check_size(tenant, tokens)
        if self._clock() < self._open_until or self._probing:
            return self._without_redis(tenant, tokens, request_id)
        return None

    def _without_redis(self, tenant: TenantSnapshot, tokens: int, request_id: str) -> Reservation:
        if self.failure_mode == "closed":
            raise dependency_unavailable("rate limiter", retry_after=self._retry_after)
        return self.fallback.reserve_now(tenant, tokens, request_id)

    def settle(self, reservation: Reservation, used_tokens: int) -> None:
        if reservation.local:
            self.fallback.settle(reservation, used_tokens)
            return
        tenant = reservation.tenant
        keys = self._all_keys(tenant, reservation.periods)
        epochs, answer = reservation.epochs, reservation.answer
        if answer is not None:  # admitted at once: the settle goes after the reserve's reply
            if not answer.done():  # (counted in pending_settles as its reserve, until answered)
                answer.add_done_callback(partial(self._settle_answered, reservation, used_tokens))
                return
            if answer.cancelled() or answer.exception() is not None:  # it may have run: forget its holder
                self._queue_settle(keys, [reservation.request_id, 0, 0, 0, 0, 0])
                return
            epochs = _epochs(answer.result())
        unused = max(0, reservation.tokens - used_tokens)
        self._queue_settle(keys, [reservation.request_id, tenant.tpm or 0, unused, tenant.key_tpm or 0,
                                  used_tokens, repr(self.wall_clock()), *epochs])  # fmt: skip

    def _settle_answered(self, reservation: Reservation, used_tokens: int, _: asyncio.Future[Any]) -> None:
        self.settle(reservation, used_tokens)

    def _queue_settle(self, keys: list[str], args: list[int | str]) -> None:
        """Send it with the next batch of reserves, or alone after SETTLE_LINGER_S: under load
        a settle rides in a write that goes out anyway, and a concurrency slot or a refund
        comes back a few milliseconds later. One that fails is kept and retried."""
        self._outstanding += 1
        linger = 0.0 if self._closing else SETTLE_LINGER_S
        reply = self._batch.call(self._settle, keys, args, linger=linger)
        reply.add_done_callback(partial(self._settle_sent, keys, args))

    def _settle_sent(self, keys: list[str], args: list[int | str], reply: asyncio.Future[Any]) -> None:
        self._outstanding -= 1
        exc = asyncio.CancelledError() if reply.cancelled() else reply.exception()
        if exc is None:
            return
        if not isinstance(exc, RedisError | OSError | asyncio.CancelledError):
            log.error("a rate-limit settle failed and is dropped: %r", exc)
            return
        self._trip(exc)
        self._settles.append((keys, args))
        if self._settler is None or self._settler.done():
            self._settler = asyncio.get_running_loop().create_task(self._run_settles(), name="redis-settles")

    @property
    def pending_settles(self) -> int:
        """Settles not yet answered by Redis (and reserves admitted at once): in flight, or kept
        after a fault."""
        return self._outstanding + len(self._settles)

    async def _run_settles(self) -> None:
        """Retry the settles that failed, in batches of up to 256, backing off while Redis
        does not answer (a tenant's holders and refunds are never lost to an outage)."""
        backoff = self._retry_after
        while self._settles:
            if not self._closing:
                await asyncio.sleep(backoff)
            batch = [self._settles.popleft() for _ in range(min(256, len(self._settles)))]
            replies = [self._batch.call(self._settle, keys, args) for keys, args in batch]
            failed, fault = [], None
            for call, reply in zip(batch, replies, strict=True):
                try:
                    await reply
                except (RedisError, OSError) as exc:
                    failed.append(call)
                    fault = exc
            if fault is None:
                backoff = self._retry_after
                continue
            self._trip(fault)
            self._settles.extendleft(reversed(failed))  # first in line again
            if self._closing:
                return  # close() gave up waiting; what is left expires in Redis
            backoff = min(backoff * 2, 30.0)

    async def settled(self, timeout_s: float = 2.0) -> bool:
        """Wait until every queued settle has been sent (tests, shutdown); False on timeout."""
        deadline = self._clock() + timeout_s
        while self.pending_settles:
            if self._clock() > deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    async def close(self, timeout_s: float = 2.0) -> None:
        """Send what is still queued (for up to timeout_s), then close the connections."""
        self._closing = True
        self._batch.flush_soon()
        try:
            async with asyncio.timeout(timeout_s):
                while self._outstanding or (self._settler is not None and not self._settler.done()):
                    if self._settler is not None and not self._settler.done():
                        await asyncio.shield(self._settler)
                    else:
                        await asyncio.sleep(0.002)
        except TimeoutError:
            if self._settler is not None:
                self._settler.cancel()
        if self.recovery is not None:
            await self.recovery.close()
        await self._batch.close()
        await self._redis.aclose()
