"""Limits in process memory: one gateway's token buckets, concurrency holders and quota
counts (also the Redis limiter's fallback while Redis is down)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.core.budgets import AlertHook, Budget, budget_exceeded, budget_too_small, budgets, counter_name
from laneway.core.quota import PERIOD_KINDS, period, quota_exceeded, quotas
from laneway.core.ratelimit.errors import (
    check_size,
    key_rate_limited,
    key_too_many_concurrent,
    rate_limited,
    too_many_concurrent,
)
from laneway.core.ratelimit.protocol import LimiterReadings, Reservation
from laneway.db.repositories import UsageRepository
from laneway.types import TenantSnapshot


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
        self.alert: AlertHook | None = None
        self.alert_share = 0.0
        self._alerted: set[tuple[int, str]] = set()  # (tenant, budget counter) past the threshold

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

    async def reserve(self, tenant: TenantSnapshot, tokens: int, request_id: str, cost: int = 0) -> Reservation:
        return self.reserve_now(tenant, tokens, request_id, cost)

    def reserve_at_once(
        self, tenant: TenantSnapshot, tokens: int, request_id: str, cost: int = 0
    ) -> Reservation | None:
        return self.reserve_now(tenant, tokens, request_id, cost)

    def reserve_now(self, tenant: TenantSnapshot, tokens: int, request_id: str, cost: int = 0) -> Reservation:
        check_size(tenant, tokens)
        wall = self.wall_clock()
        periods = [period(kind, wall) for kind in PERIOD_KINDS]
        spend = budgets(tenant, wall)
        for b in spend:
            if cost > b.limit:
                raise budget_too_small(tenant, b, cost)
        used = self._used.setdefault(tenant.id, {})
        for p, limit in quotas(tenant, wall):  # past a quota only its reset helps: said first
            if used.get(p.name, 0) + tokens > limit:
                raise quota_exceeded(tenant, p, limit, used.get(p.name, 0), wall)
        for b in spend:
            if used.get(b.name, 0) + cost > b.limit:
                raise budget_exceeded(tenant, b, used.get(b.name, 0), wall)
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
        self._count(used, [p.name for p in periods], tokens)
        self._count(used, [b.name for b in spend], cost)
        if self.alert is not None and self.alert_share > 0:
            self._soft_threshold(tenant, spend, used)
        return Reservation(
            tenant,
            request_id,
            tokens,
            periods=tuple(p.name for p in periods),
            cost=cost,
            budgets=tuple(b.name for b in spend),
        )

    def _soft_threshold(self, tenant: TenantSnapshot, spend: list[Budget], used: dict[str, int]) -> None:
        """Tell the hook of each budget that passed its soft threshold, once per period."""
        for b in spend:
            at = (tenant.id, b.name)
            if used[b.name] >= self.alert_share * b.limit and at not in self._alerted and self.alert is not None:
                if len(self._alerted) >= 100_000:  # past periods' marks (their names carry the date)
                    self._alerted.clear()
                self._alerted.add(at)
                self.alert(tenant, b, used[b.name])

    @staticmethod
    def _count(used: dict[str, int], names: list[str], amount: int) -> None:
        for name in names:
            if name not in used:  # a new period: the last one's count is not needed any more
                kind = name.rsplit(":", 1)[0]  # "day", "cost:day", "key:7:cost:month"
                for old in [n for n in used if n.rsplit(":", 1)[0] == kind]:
                    del used[old]
            used[name] = used.get(name, 0) + amount

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
                for (tenant_id, key_id), cost in (await repo.cost_since(p.start)).items():
                    counts = self._used.setdefault(tenant_id, {})
                    tenant_name = counter_name(None, p)
                    counts[tenant_name] = counts.get(tenant_name, 0) + cost
                    if key_id is not None:
                        counts[counter_name(key_id, p)] = cost

    async def quota_used(self, tenant_id: int) -> dict[str, int]:
        wall = self.wall_clock()
        used = self._used.get(tenant_id, {})
        return {kind: used.get(period(kind, wall).name, 0) for kind in PERIOD_KINDS}

    def settle(self, reservation: Reservation, used_tokens: int, used_cost: int = 0) -> None:
        tenant = reservation.tenant
        for flights, ident in ((self._in_flight, tenant.id), (self._key_in_flight, tenant.api_key_id)):
            holders = flights.get(ident)
            if holders is not None:
                holders.discard(reservation.request_id)
                if not holders:
                    del flights[ident]
        counted = self._used.get(tenant.id, {})
        unspent = reservation.cost - used_cost
        if unspent > 0:
            for name in reservation.budgets:
                if name in counted:  # else its period is over and forgotten
                    counted[name] = max(0, counted[name] - unspent)
        unused = reservation.tokens - used_tokens
        if unused <= 0:
            return
        now = self._clock()
        for table, ident, capacity in (
            (self._tpm, tenant.id, tenant.tpm),
            (self._key_tpm, tenant.api_key_id, tenant.key_tpm),
        ):
            if capacity:
                bucket = self._bucket(table, ident, capacity, now)
                bucket.level = min(bucket.capacity, bucket.level + unused)
        for name in reservation.periods:
            if name in counted:  # else its period is over and forgotten: nothing to give back to
                counted[name] = max(0, counted[name] - unused)

    def readings(self) -> LimiterReadings:
        return LimiterReadings(local_holders=self.holders)

    async def close(self) -> None:
        return None
