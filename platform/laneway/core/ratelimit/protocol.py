"""What every rate limiter offers the pipeline: reserve at admission, settle at the end, and
the readings it publishes for metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.core.budgets import AlertHook
from laneway.types import TenantSnapshot


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
    # Redis: each period counter's epoch when it was counted (counter_recovery.py): a
    # counter lost and begun again since then never held this reservation.
    epochs: tuple[str, ...] = ()
    # Redis, admitted at once (RedisRateLimiter.reserve_at_once): the reserve's reply, still to
    # come when the request began; its settle waits for it (the epochs come with it).
    answer: asyncio.Future[Any] | None = None
    # Money budgets (core/budgets.py): the most it may cost (micro-units), reserved; the budget
    # counters it was counted in (their names), and in Redis each one's epoch.
    cost: int = 0
    budgets: tuple[str, ...] = ()
    budget_epochs: tuple[str, ...] = ()


class RateLimiter(Protocol):
    wall_clock: Callable[[], float]  # epoch seconds: which quota period is current (injectable)
    alert: AlertHook | None  # a money budget past its soft threshold (core/budgets.py)
    alert_share: float  # that threshold, a share of the budget (0: off)

    async def reserve(self, tenant: TenantSnapshot, tokens: int, request_id: str, cost: int = 0) -> Reservation:
        """Take 1 request, `tokens` tokens, `cost` micro-units of the money budgets, and a
        concurrency slot; raise GatewayError(429) if not."""

    def reserve_at_once(
        self, tenant: TenantSnapshot, tokens: int, request_id: str, cost: int = 0
    ) -> Reservation | None:
        """reserve()'s decision where it can be taken without waiting: the reservation, or the
        refusal raised; None: await reserve(), which crosses the network (the caller protects
        it from cancellation: a reservation made while the client left must be given back)."""

    def settle(self, reservation: Reservation, used_tokens: int, used_cost: int = 0) -> None:
        """The request ended: give back its concurrency slot, the tokens and the money it did not use.
        Never blocks and never raises: a remote settle happens in the background."""

    async def quota_used(self, tenant_id: int) -> dict[str, int]:
        """Tokens counted against the tenant in the current day and month ({"day": n, "month": n}),
        reservations in flight included. For admins: never called on the request path."""

    async def load_used(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        """Count this day's and month's tokens from the usage table, the durable truth: at
        start-up (memory), or whenever a counter turns out lost (Redis)."""

    def readings(self) -> LimiterReadings:
        """What it holds and has decided, for metrics (read at scrape time, never blocks)."""

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SharedLimitReadings:
    """A limiter whose limits live in Redis: its settles and how its decisions were taken."""

    settles_pending: int  # not yet answered by Redis (in flight, or kept after a fault)
    admitted_at_once: int  # admitted by this replica on Redis's last answer (Headroom)
    decided_by_redis: int  # answered by Redis itself (admitted or refused)


@dataclass(frozen=True, slots=True)
class LimiterReadings:
    local_holders: int  # concurrency holders in this process's memory (Redis: its fallback's)
    shared: SharedLimitReadings | None = None  # None: the limits are this process's alone
