"""Quota counters in Redis brought back from the usage table when Redis lost them.

In Redis mode a tenant's day and month counters (redis_limiter.py) live only in Redis; a
Redis restarted without persistence would start them at zero and let every tenant spend its
quota again. The usage rows in the database are the durable truth, so a counter is rebuilt
from them:

- Each counter has an *epoch*: the wall-clock time it began counting (plus Redis's time,
  unique), kept next to it with what has been added to it from the usage rows ("seeded", -1
  until the first seed). The reserve script begins a counter that does not exist - a new
  period, or a lost one - and its reply says which counters are not seeded yet: the hot path
  keeps its one round trip and never waits on the database.
- A replica told so seeds the counter in the background (once per tenant, period and epoch
  on that replica, a few at a time): it adds the tokens of the tenant's usage rows of the
  period created *before the epoch*, the use the counter never saw. Rows after the epoch are
  requests the counter counted itself (reserved after it), so nothing is counted twice.
- Seeding is idempotent: the seed script adds only what a larger sum brings
  (seeded := max(seeded, sum)). Replicas seeding one counter at once (each that reserves
  against it before the first seed lands is told), or a seed retried after a lost reply,
  add the rows once; and a replica that began a counter and died before seeding it leaves
  it to the next. The sum is taken again after LATE_ROWS_S, for rows that reached the table
  late (the usage recorder writes in batches).
- A reservation carries the epoch it was counted in. Its settle gives tokens back only to
  that epoch's counter (never to one begun since, which never held them: no count goes
  negative); a request that was in flight when the counter was lost and ends after the new
  epoch adds what it used (its row is after the epoch, outside the seeded sum).

Why not a periodic reconcile, max(counter, rows)? Every replica would query every active
tenant's sum on a timer, and max() loses what was reserved since the loss (the counter holds
new reservations, the rows the old use: each is part of the truth, neither the whole). Why
not a database read on each request's reserve? The hot path would pay a round trip to
PostgreSQL. Here the database is asked once per tenant and period (twice: the late rows), at
the period's first request and after a loss.

What is left: between a loss and the seed (one small aggregate query) the reserve script
checks against the new counter alone, so a few requests may be admitted past the quota; a
request in flight across 00:00 UTC is counted in the day it was admitted in and, through
its row, in the next one's seed (the usage table counts it there too).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.core.budgets import Budget, owner_of
from laneway.core.quota import Period
from laneway.core.ratelimit.scripts import SEED_COUNTER
from laneway.core.redis_hub import RedisHub
from laneway.db.repositories import UsageRepository

log = logging.getLogger(__name__)

# The usage recorder writes every 0.5 s by default: a row of a request that ended before the
# epoch is in the table well within this (unless the database was down: then it is spooled).
LATE_ROWS_S = 10.0
MAX_CONCURRENT = 4  # seeds querying the database at once (a loss begins every active tenant's)
MAX_PENDING = 10_000  # counters waiting for their seed; past it one is left as it is, and logged
MAX_BACKOFF_S = 30.0
# A seed is background work: like a settle, it waits this long for a batch of reserves to ride
# with instead of sending one of its own (and taking lingering settles out early with it).
SEED_LINGER_S = 0.005


def epoch_time(epoch: str) -> datetime:
    """The wall-clock part of an epoch ("1764763200.123/1764763200.120456")."""
    return datetime.fromtimestamp(float(epoch.split("/", 1)[0]), UTC)


class CounterRecovery:
    """Seeds new counters from the usage rows, in background tasks, a few at a time."""

    def __init__(
        self,
        hub: RedisHub,
        sessions: async_sessionmaker[AsyncSession],
        counter_key: Callable[[int, str], str],
        epoch_key: Callable[[int, str], str],
        wall_clock: Callable[[], float],
        *,
        late_rows_s: float = LATE_ROWS_S,
        max_concurrent: int = MAX_CONCURRENT,
    ) -> None:
        self._hub = hub
        self._sessions = sessions
        self._counter_key = counter_key
        self._epoch_key = epoch_key
        self._wall_clock = wall_clock  # the limiter's: which period is current
        self.late_rows_s = late_rows_s
        self._slots = asyncio.Semaphore(max_concurrent)
        # (tenant, period name) -> the epoch being seeded, and its task
        self._tasks: dict[tuple[int, str], tuple[str, asyncio.Task[None]]] = {}
        self.added = 0  # tokens added from usage rows (metrics, tests)
        self.seeds = 0  # seed scripts run

    @property
    def pending(self) -> int:
        return len(self._tasks)

    def schedule_budgets(self, tenant_id: int, spend: list[Budget], unseeded: int, epochs: tuple[str, ...]) -> None:
        """The money budget counters the reserve began (bit j: spend[j]), seeded from the rows' cost."""
        for j, b in enumerate(spend):
            if unseeded & (1 << j):
                self.schedule(tenant_id, b.period, epochs[j], name=b.name)

    def schedule(self, tenant_id: int, p: Period, epoch: str, *, name: str | None = None) -> None:
        """The reserve script says the tenant's counter of `p` is not seeded: seed it, unless
        this replica is doing so already (never blocks). `name`: a money budget's counter
        (core/budgets.py), seeded with the rows' cost; else the token quota's, `p.name`."""
        name = name or p.name
        key = (tenant_id, name)
        running = self._tasks.get(key)
        if running is not None:
            if running[0] == epoch:
                return
            running[1].cancel()  # an older epoch of this counter: the new one is what counts now
        elif len(self._tasks) >= MAX_PENDING:
            log.warning(
                "quota counter %s of tenant %d not seeded from usage rows: %d seeds pending",
                name,
                tenant_id,
                len(self._tasks),
            )
            return
        task = asyncio.get_running_loop().create_task(self._recover(tenant_id, p, epoch, name), name="quota-seed")
        self._tasks[key] = (epoch, task)

        def forget(done: asyncio.Task[None]) -> None:
            if self._tasks.get(key, ("", None))[1] is done:
                del self._tasks[key]

        task.add_done_callback(forget)

    async def _recover(self, tenant_id: int, p: Period, epoch: str, name: str | None = None) -> None:
        if not await self._seed_once(tenant_id, p, epoch, name):
            return
        await asyncio.sleep(self.late_rows_s)
        await self._seed_once(tenant_id, p, epoch, name)

    async def _seed_once(self, tenant_id: int, p: Period, epoch: str, name: str | None = None) -> bool:
        """Add the rows before the epoch, retrying faults until the period is over; False when
        the counter is gone or began again (nothing more to do for this epoch)."""
        name = name or p.name
        backoff = 0.5
        while True:
            try:
                async with self._slots:
                    if name == p.name:
                        tokens = await self.usage_before(tenant_id, p, epoch)
                    else:
                        tokens = await self.cost_before(tenant_id, p, epoch, owner_of(name))
                    keys = [self._counter_key(tenant_id, name), self._epoch_key(tenant_id, name)]
                    added = int(await self._hub.call(SEED_COUNTER, keys, [epoch, tokens], linger=SEED_LINGER_S))
            except (RedisError, OSError, SQLAlchemyError) as exc:
                if self._wall_clock() >= p.resets_at.timestamp():
                    return False  # its period is over: nobody reserves against it any more
                log.warning(
                    "seeding quota counter %s of tenant %d from usage rows failed (%s); retrying in %.1f s",
                    name,
                    tenant_id,
                    exc,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            self.seeds += 1
            if added < 0:
                return False
            self.added += added
            if added:
                log.info("quota counter %s of tenant %d: %d added from usage rows", name, tenant_id, added)
            return True

    async def usage_before(self, tenant_id: int, p: Period, epoch: str) -> int:
        """Tokens of the tenant's usage rows in period p created before the epoch."""
        async with self._sessions() as session:
            used = await UsageRepository(session).tokens_since(p.start, tenant_id, before=epoch_time(epoch))
        return used.get(tenant_id, 0)

    async def cost_before(self, tenant_id: int, p: Period, epoch: str, key_id: int | None) -> int:
        """Cost (micro-units) of the tenant's (or one of its keys') rows in p before the epoch."""
        async with self._sessions() as session:
            spent = await UsageRepository(session).cost_since(
                p.start, tenant_id, key_id=key_id, before=epoch_time(epoch)
            )
        return sum(spent.values())

    async def settled(self, timeout_s: float = 10.0) -> bool:
        """Wait until every seed has run, late passes included (tests); False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._tasks:
                    await asyncio.gather(*(task for _, task in self._tasks.values()), return_exceptions=True)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
