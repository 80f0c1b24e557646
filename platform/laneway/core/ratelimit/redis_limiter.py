"""Limits shared by every gateway replica, kept in Redis: one atomic Lua script per decision
(reserve.lua), on Redis's clock, so any number of replicas enforce one limit. Far from a
tenant's limits a replica admits at once on Redis's last answer (headroom.py). Quota counters
Redis turns out to have lost are counted again from the usage table (counter_recovery.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import dependency_unavailable
from laneway.core.budgets import AlertHook, Budget, budget_exceeded, budget_too_small, budgets
from laneway.core.dependencies import DependencyHealth
from laneway.core.quota import PERIOD_KINDS, Period, period, quota_exceeded, quota_limit
from laneway.core.ratelimit import script_calls as calls
from laneway.core.ratelimit.counter_recovery import CounterRecovery
from laneway.core.ratelimit.errors import (
    check_size,
    key_rate_limited,
    key_too_many_concurrent,
    rate_limited,
    too_many_concurrent,
)
from laneway.core.ratelimit.headroom import ADMIT_AT_ONCE_FOR_S, ADMIT_AT_ONCE_UNANSWERED, Headroom
from laneway.core.ratelimit.memory import MemoryRateLimiter
from laneway.core.ratelimit.protocol import LimiterReadings, Reservation, SharedLimitReadings
from laneway.core.ratelimit.redis_keys import LimitKeys
from laneway.core.ratelimit.scripts import READ_COUNTERS, RESERVE, reply_epochs
from laneway.core.ratelimit.settle_queue import SettleQueue
from laneway.core.redis_hub import RedisHub
from laneway.types import TenantSnapshot

log = logging.getLogger("laneway.core.ratelimit")


class RedisRateLimiter:
    """Limits shared by every replica, in Redis, with a contract for when Redis misbehaves.

    - Every call goes through the hub (core/redis_hub): one pipelined connection with a
      timeout (a frozen Redis must not hang requests), replaced after a Redis restart with
      the calls it had not answered sent once more.
    - A fault opens a breaker for `retry_after_s`: meanwhile requests do not wait on Redis at
      all. Then one request probes it. `failure_mode` says what happens while it is open:
      "open" serves with this replica's own limits (process memory, the same tenant limits:
      with N replicas a tenant may get up to N times its limit while Redis is down), "closed"
      refuses with 503 rate_limiter_unavailable + Retry-After. Never a 500.
    - Settles go off the response path through a SettleQueue (settle_queue.py), kept and
      retried until Redis answers.
    """

    def __init__(
        self,
        redis: str | RedisHub,
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
        """`redis`: a URL (the limiter builds a hub of its own and closes it) or the process's
        shared hub (its owner closes it; `max_connections` and `timeout_s` are then the hub's)."""
        if failure_mode not in ("open", "closed"):
            raise ValueError(f"redis failure mode must be 'open' or 'closed', not {failure_mode!r}")
        self._owns_hub = isinstance(redis, str)  # a hub of its own: closed with it
        self.hub = (
            RedisHub(redis, timeout_s=timeout_s, max_connections=max_connections) if isinstance(redis, str) else redis
        )
        self._prefix = prefix
        self.keys = LimitKeys(prefix)
        self.failure_mode = failure_mode
        self._retry_after = retry_after_s
        self._health = health or DependencyHealth()
        self._clock = clock
        self.wall_clock = wall_clock  # epoch seconds: which quota period is current
        self.fallback = MemoryRateLimiter(clock, lambda: self.wall_clock())
        self._open_until = 0.0  # breaker: Redis is not asked before this time
        self._probing = False
        self.settles = SettleQueue(self.hub, retry_after_s, self._trip, clock)  # reserves admitted at once count too
        self._share = share  # of a limit's room a replica may admit at once (Headroom); 0: never
        self._headroom: dict[tuple[int, int], Headroom] = {}  # (tenant, API key) -> its room
        self.admitted_at_once = 0  # requests admitted without waiting for Redis (metrics, tests)
        self._unanswered = 0  # of those, the ones whose reserve Redis has not answered yet
        self.decided_by_redis = 0  # requests Redis answered for (admitted or refused)
        self.recovery: CounterRecovery | None = None  # set by load_used(): counters from the usage rows
        self.alert: AlertHook | None = None  # money budgets past alert_share (reserve.lua says once)
        self.alert_share = 0.0

    async def load_used(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        """The counters live in Redis, shared: nothing to load at start-up. What this replica
        keeps is the way back to the usage table for a counter Redis turns out to have lost
        (counter_recovery.py), and its fallback's counts for an outage."""
        self.recovery = CounterRecovery(
            self.hub, sessions, self.keys.counter, self.keys.epoch, lambda: self.wall_clock()
        )

    async def quota_used(self, tenant_id: int) -> dict[str, int]:
        """From Redis (an admin read, one round trip); raises RedisError when it is down. Read
        through the limiter's own connection, after what it sent before: the requests this
        replica admitted at once are counted."""
        wall = self.wall_clock()
        names = [self.keys.counter(tenant_id, period(kind, wall).name) for kind in PERIOD_KINDS]
        values = await self.hub.call(READ_COUNTERS, names, [])
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
        self,
        tenant: TenantSnapshot,
        tokens: int,
        request_id: str,
        admitted: bool,
        spend: list[Budget] | None = None,
        cost: int = 0,
    ) -> tuple[list[Period], list[str], list[int | str]]:
        """RESERVE's periods, KEYS and ARGV for this request (its budgets' after the rest)."""
        wall = self.wall_clock()
        periods = [period(kind, wall) for kind in PERIOD_KINDS]
        args = calls.reserve_args(
            tenant, tokens, request_id, admitted, periods, wall, spend or [], cost, self.alert_share
        )
        keys = self.keys.for_call(tenant, tuple(p.name for p in periods))
        return periods, calls.with_budget_keys(self.keys, tenant.id, keys, [b.name for b in spend or ()]), args

    def reserve_at_once(
        self, tenant: TenantSnapshot, tokens: int, request_id: str, cost: int = 0
    ) -> Reservation | None:
        """Admit without waiting for Redis where this replica may (Headroom; never under a money
        budget, exact across replicas): the reserve goes out with the next batch, taken whatever
        Redis then says, and its settle follows its reply. Else None: reserve()."""
        decided = self._decided_without_redis(tenant, tokens, request_id, cost)
        if decided is not None or tenant.budgeted:
            return decided
        room = self._headroom.get((tenant.id, tenant.api_key_id))
        if (
            room is None
            or room.tenant is not tenant
            or not room.admits(tokens, self._share)
            or self._unanswered >= ADMIT_AT_ONCE_UNANSWERED
            or self._clock() - room.answered_at > ADMIT_AT_ONCE_FOR_S
        ):
            return None
        periods, keys, args = self._call(tenant, tokens, request_id, admitted=True)
        names = tuple(p.name for p in periods)
        if names != room.periods:  # a new day: Redis says first
            return None
        room.pending += 1
        room.pending_tokens += tokens
        self.settles.outstanding += 1
        self._unanswered += 1
        # Sent at the end of this loop turn, with whatever else this turn sends (the lingering
        # settles): not lingering on a timer of its own, whose wake-up costs more than the
        # write it would share.
        answer = self.hub.call(RESERVE, keys, args)
        reservation = Reservation(tenant, request_id, tokens, local=False, periods=names, answer=answer)
        answer.add_done_callback(partial(self._admitted_answer, room, reservation, periods))
        self.admitted_at_once += 1
        return reservation

    def _admitted_answer(
        self, room: Headroom, reservation: Reservation, periods: list[Period], answer: asyncio.Future[Any]
    ) -> None:
        """Redis's reply to a reserve admitted at once: the room it leaves, the epochs."""
        self.settles.outstanding -= 1
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
        reservation.epochs = self._counted(reservation.tenant, periods, int(reply[1]), reply_epochs(reply))

    def _counted(
        self, tenant: TenantSnapshot, periods: list[Period], unseeded: int, counted_in: tuple[str, ...]
    ) -> tuple[str, ...]:
        """The epochs a reservation was counted in; counters begun without their usage rows are
        seeded from them in the background (counter_recovery.py)."""
        if unseeded and self.recovery is not None:  # off the request path: a background task
            for i, p in enumerate(periods):
                if unseeded & (1 << i):
                    self.recovery.schedule(tenant.id, p, counted_in[i])
        return counted_in

    async def reserve(self, tenant: TenantSnapshot, tokens: int, request_id: str, cost: int = 0) -> Reservation:
        decided = self._decided_without_redis(tenant, tokens, request_id, cost)
        if decided is not None:
            return decided
        probe = self._open_until > 0  # the breaker was open: this request is its probe
        self._probing = probe
        spend = budgets(tenant, self.wall_clock()) if tenant.budgeted else []
        periods, keys, args = self._call(tenant, tokens, request_id, False, spend, cost)
        at = (tenant.id, tenant.api_key_id)
        try:
            reply = await self.hub.call(RESERVE, keys, args)
        except (RedisError, OSError) as exc:  # redis' TimeoutError is a RedisError; OSError: refused
            self._trip(exc)
            # The script may have run before the answer was lost: forget its holder later.
            self.settles.send(keys, [request_id, 0, 0, 0, 0, 0])
            return self._without_redis(tenant, tokens, request_id, cost)
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
        if verdict >= 7:  # a money budget: the second number is what it has spent
            raise budget_exceeded(tenant, spend[verdict - 7], int(wait_ms), wall)
        names = tuple(p.name for p in periods)
        room = self._headroom.get(at)
        if room is None or room.tenant is not tenant or room.periods != names:
            if len(self._headroom) >= 4096:
                self._headroom.clear()
            room = self._headroom[at] = Headroom(tenant, names)
        room.answered(reply[4:], self._clock())
        counted_in = self._counted(tenant, periods, int(wait_ms), reply_epochs(reply))
        unseeded, budget_epochs = calls.reply_budgets(reply, len(spend))
        if unseeded and self.recovery is not None:  # budget counters begun now: seeded as the quotas'
            self.recovery.schedule_budgets(tenant.id, spend, unseeded, budget_epochs)
        calls.alert_crossed(self.alert, tenant, reply, spend)
        return Reservation(
            tenant,
            request_id,
            tokens,
            local=False,
            periods=names,
            epochs=counted_in,
            cost=cost,
            budgets=tuple(b.name for b in spend),
            budget_epochs=budget_epochs,
        )

    def _decided_without_redis(
        self, tenant: TenantSnapshot, tokens: int, request_id: str, cost: int
    ) -> Reservation | None:
        """What reserve() and reserve_at_once() decide before Redis: a request larger than its
        limits is refused; while the breaker is open (or its probe is out) the fallback decides.
        None: Redis's to decide."""
        check_size(tenant, tokens)
        for b in budgets(tenant, self.wall_clock()) if tenant.budgeted else ():
            if cost > b.limit:
                raise budget_too_small(tenant, b, cost)
        if self._clock() < self._open_until or self._probing:
            return self._without_redis(tenant, tokens, request_id, cost)
        return None

    def _without_redis(self, tenant: TenantSnapshot, tokens: int, request_id: str, cost: int) -> Reservation:
        if self.failure_mode == "closed":
            raise dependency_unavailable(
                ErrorCode.RATE_LIMITER_UNAVAILABLE, "rate limiter", retry_after=self._retry_after
            )
        return self.fallback.reserve_now(tenant, tokens, request_id, cost)

    def settle(self, reservation: Reservation, used_tokens: int, used_cost: int = 0) -> None:
        if reservation.local:
            self.fallback.settle(reservation, used_tokens, used_cost)
            return
        tenant = reservation.tenant
        keys = calls.with_budget_keys(
            self.keys, tenant.id, self.keys.for_call(tenant, reservation.periods), reservation.budgets
        )
        epochs, answer = reservation.epochs, reservation.answer
        if answer is not None:  # admitted at once: the settle goes after the reserve's reply
            if not answer.done():  # (counted in pending_settles as its reserve, until answered)
                answer.add_done_callback(partial(self._settle_answered, reservation, used_tokens))
                return
            if answer.cancelled() or answer.exception() is not None:  # it may have run: forget its holder
                self.settles.send(keys, [reservation.request_id, 0, 0, 0, 0, 0])
                return
            epochs = reply_epochs(answer.result())
        unused = max(0, reservation.tokens - used_tokens)
        self.settles.send(
            keys,
            [
                reservation.request_id,
                tenant.tpm or 0,
                unused,
                tenant.key_tpm or 0,
                used_tokens,
                repr(self.wall_clock()),
                *epochs,
                *calls.settle_args(reservation, used_cost),
            ],
        )

    def _settle_answered(self, reservation: Reservation, used_tokens: int, _: asyncio.Future[Any]) -> None:
        self.settle(reservation, used_tokens)

    @property
    def _redis(self) -> Any:
        """redis-py's client on the hub's URL: tests read Redis's state through it."""
        return self.hub.client

    def _keys(self, tenant_id: int) -> list[str]:  # tests: the tenant's keys
        return self.keys.tenant(tenant_id)

    def readings(self) -> LimiterReadings:
        shared = SharedLimitReadings(self.pending_settles, self.admitted_at_once, self.decided_by_redis)
        return LimiterReadings(local_holders=self.fallback.holders, shared=shared)

    @property
    def pending_settles(self) -> int:
        """Settles not yet answered by Redis (and reserves admitted at once): in flight, or kept
        after a fault."""
        return self.settles.pending

    async def settled(self, timeout_s: float = 2.0) -> bool:
        """Wait until every queued settle has been sent (tests, shutdown); False on timeout."""
        return await self.settles.settled(timeout_s)

    async def close(self, timeout_s: float = 2.0) -> None:
        """Send what is still queued (for up to timeout_s), then close the connections."""
        await self.settles.drain(timeout_s)
        if self.recovery is not None:
            await self.recovery.close()
        if self._owns_hub:
            await self.hub.close()
