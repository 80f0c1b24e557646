"""BatchRunner: this replica's share of every tenant's batches, as background work.

Lines are leased from the database (db/batch_store.py), any replica working on any batch;
each runs through the pipeline in the background lane, which takes an engine slot only when
no foreground request waits for it and hands it back as the line ends (core/scheduler.py).
The runner keeps each tenant's lines in flight up to the engines' slots plus a few, so a
freed slot is taken from the lane's queue at once, without a database round trip, and the
scheduler's weighted fair order shares the idle capacity among tenants.

A line's result is written once (the store's conditional update); a line refused for its
pace (a rate limit, a quota, a full queue) goes back to pending until its Retry-After. A
replica that dies holds its lines until their leases pass; SIGTERM stops claiming, lets
what runs finish within the drain and hands back the rest. While the database is out of
reach the loop goes on polling; the outage is the dependency reporter's to log (a line an
interval, core/dependencies.py), not a traceback each tick."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from laneway.api.batches.finalize import finalize
from laneway.api.batches.lines import run_line
from laneway.api.services import ApiServices
from laneway.core.dependencies import DependencyHealth, database_unreachable
from laneway.db.batch_store import BatchStore, ClaimedItem
from laneway.metrics import Reading

log = logging.getLogger("laneway.batches")
MIN_TICK_GAP_S = 0.02
IDLE_POLL_FACTOR = 5  # with nothing to do, look for batches created on other replicas this much less often
# With no batch open on any replica, one indexed read this much less often than poll_s, not
# the round's four queries: a batch created on this replica kicks the runner at once, one
# created on another is found within this.
NO_BATCH_POLL_FACTOR = 10
STATES_EVERY_S = 10.0  # the lines-by-state gauge: one GROUP BY query this often, not per scrape
WRITE_TRIES = 3  # a result's write, while the database blinks; past it the lease runs out and the line reruns


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        api: ApiServices,
        *,
        owner: str,
        slots: Callable[[str], int],
        poll_s: float = 1.0,
        lease_s: float = 60.0,
        health: DependencyHealth | None = None,
    ) -> None:
        self.store, self.api, self.owner = store, api, owner
        self._health = health or DependencyHealth()  # the process's: one report of a database outage
        self._slots = slots  # an alias's engine slots, as this replica sees them: how much work to keep queued
        self.finished: Counter[str] = Counter()  # this replica's lines, by how they ended (and retries)
        self.tokens = 0  # tokens of the lines this replica ran: rate() is the batch throughput
        self.states: dict[str, int] = {}  # every replica's lines by state, read from the database
        self._last_states = 0.0
        self.poll_s, self.lease_s = poll_s, lease_s
        self._running: dict[int, tuple[ClaimedItem, asyncio.Task[None]]] = {}
        self._models_of: dict[str, str] = {}  # batch id -> its model, for the batches this replica ran
        self._claiming = True
        self._quiet = True  # the last round found nothing to do: first ask whether any batch is open
        self._kicked = False  # work was announced here (a batch created): no need to ask
        self._none_open = False  # the last ask found none (the lines-by-state gauge is read once then)
        self._wake = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._last_renew = 0.0

    # ---- lifecycle ----
    async def start(self) -> None:
        self._loop = asyncio.create_task(self._run(), name="batch-runner")

    def stop_claiming(self) -> None:
        """SIGTERM: take no more lines; those running finish within the drain."""
        self._claiming = False
        self._wake.set()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop the loop, give running lines `grace_s` to write what they got, hand back the rest."""
        self.stop_claiming()
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
        tasks = [task for _, task in self._running.values()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        try:
            handed = await self.store.release(self.owner)
        except Exception as exc:  # the database is gone: the leases run out and another replica takes them
            self._failed(exc, "could not hand back this replica's batch lines; their leases will expire")
            return
        if handed:
            log.info("handed back %d batch lines for another replica", handed)

    def kick(self) -> None:
        """Look for work now (a batch was created, a line ended)."""
        self._kicked = True
        self._wake.set()

    @property
    def in_flight(self) -> int:
        return len(self._running)

    # ---- the loop ----
    async def _run(self) -> None:
        while True:
            pace = 1
            try:
                if await self._open():
                    self._quiet = not await self._tick()
                    pace = IDLE_POLL_FACTOR if self._quiet else 1
                else:
                    pace = NO_BATCH_POLL_FACTOR
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database blinked: the next tick tries again
                self._failed(exc, "batch runner tick failed; the next tick tries again")
            # Lines that end close together share one tick (its queries), and an idle runner
            # polls less: a batch created here kicks it, one created elsewhere waits a little.
            await asyncio.sleep(MIN_TICK_GAP_S)
            self._wake.clear()
            try:
                async with asyncio.timeout(self.poll_s * pace):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _open(self) -> bool:
        """Whether a round of the work may find any: yes while the last one found some, after
        a kick, or when some batch is open anywhere (asked only after a quiet round)."""
        kicked, self._kicked = self._kicked, False
        if kicked or self._running or not self._quiet:
            self._none_open = False
            return True
        if await self.store.any_open():
            self._none_open = False
            return True
        if not self._none_open:  # the last batch ended: the gauge's final counts, once
            self._none_open = True
            self._last_states = time.monotonic()
            self.states = await self.store.counts_by_state()
        return False

    async def _tick(self) -> bool:
        """One round of the work; whether there was any (lines, batches to finish)."""
        await self.store.expire_due()
        active = await self._claim() if self._claiming else 0
        now = time.monotonic()
        if self._running and now - self._last_renew >= self.lease_s / 3:
            self._last_renew = now
            await self.store.renew(self.owner, list(self._running), self.lease_s)
        ended = await self.store.to_finalize(self.owner, self.lease_s)
        for batch_id in ended:
            await finalize(self.store, self.owner, batch_id)
        if now - self._last_states >= STATES_EVERY_S:
            self._last_states = now
            self.states = await self.store.counts_by_state()
        return bool(active or ended or self._running)

    async def _claim(self) -> int:
        """Each tenant with work on a model gets up to its slots plus a quarter in flight: enough
        that the background lane's queue always holds a next line, shared fairly by the
        scheduler, and few enough that a cancel stops all but those."""
        held = Counter((item.tenant_id, self._models_of[item.batch_id]) for item, _ in self._running.values())
        active = await self.store.active_batches()
        running = {item.batch_id for item, _ in self._running.values()}
        self._models_of = {b: m for b, m in self._models_of.items() if b in running}  # forget ended batches
        for batch_id, tenant_id, model in active:
            room = max(1, self._slots(model)) * 5 // 4 + 1 - held[tenant_id, model]
            if room <= 0:
                continue
            self._models_of[batch_id] = model
            for item in await self.store.claim(batch_id, self.owner, room, self.lease_s):
                held[tenant_id, model] += 1
                task = asyncio.create_task(self._line(item), name=f"batch-line-{item.id}")
                self._running[item.id] = (item, task)
        return len(active)

    async def _line(self, item: ClaimedItem) -> None:
        try:
            outcome = await run_line(self.api, item.endpoint, item.custom_id, item.key_sha256, item.body)
            if outcome.retry_after is not None:
                until = datetime.now(UTC) + timedelta(seconds=outcome.retry_after)
                await self._write(lambda: self.store.retry_later(item.id, self.owner, until))
                self._count("retried")
            else:
                state = "succeeded" if outcome.ok else "failed"
                if await self._write(lambda: self.store.finish(item.id, self.owner, state, outcome.line.decode())):
                    self._count(state, outcome.tokens)
        finally:
            self._running.pop(item.id, None)
            self._wake.set()

    async def _write(self, write: Callable[[], Awaitable[object]]) -> bool:
        for attempt in range(WRITE_TRIES):
            try:
                result = await write()
                return result is not False
            except Exception as exc:
                if attempt == WRITE_TRIES - 1:
                    self._failed(exc, "could not write a batch line's result; it will run again")
                    return False
                await asyncio.sleep(0.5 * 2**attempt)
        return False

    def _failed(self, exc: Exception, what: str) -> None:
        """A database outage goes to the reporter (counted; a line an interval, with `what`);
        anything else is a bug, logged in full."""
        if database_unreachable(exc):
            self._health.failed("database", exc, what)
        else:
            log.warning("%s", what, exc_info=exc)

    def _count(self, state: str, tokens: int = 0) -> None:
        self.finished[state] += 1
        self.tokens += tokens

    def readings(self) -> list[Reading]:
        out: list[Reading] = [
            (
                "laneway_batch_lines_in_flight",
                "Batch lines this replica is running or queueing.",
                "gauge",
                {},
                len(self._running),
            ),
            (
                "laneway_batch_tokens_total",
                "Prompt and completion tokens of the batch lines this replica ran.",
                "counter",
                {},
                self.tokens,
            ),
        ]
        for state, n in sorted(self.finished.items()):
            out.append(
                (
                    "laneway_batch_lines_total",
                    "Batch lines this replica ended, by state (succeeded, failed) or sent back to wait (retried).",
                    "counter",
                    {"state": state},
                    n,
                )
            )
        for state, n in sorted(self.states.items()):
            out.append(
                (
                    "laneway_batch_lines",
                    "Every replica's batch lines by state (pending, running, "
                    "succeeded, failed, expired, cancelled), read from the database.",
                    "gauge",
                    {"state": state},
                    n,
                )
            )
        return out
