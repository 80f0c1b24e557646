"""Usage rows, written in batches by a background task so requests never wait on the database.

Rows are never lost to a fault of one row or of the database:
- a batch the database rejects for its content (a value it cannot store) is written in
  halves, smaller and smaller, until the offending row is alone: it is set aside (counted,
  logged) and every other row is written; rows are never written twice;
- while the database is unreachable, rows wait in memory (up to `max_pending`; beyond that
  the oldest are dropped and counted) and the writer retries with a growing delay;
- at shutdown, rows that still cannot be written are spooled to a file in `spool_dir`
  and loaded again at the next start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.core.dependencies import DependencyHealth
from laneway.core.pipeline.outcome import Outcome
from laneway.db.repositories import TenantRepository, UsageRepository

log = logging.getLogger("laneway.accounting")
# An API key's last_used_at is written at most this often (per replica): it tells an admin
# whether a key is still in use, and writing it with every batch of usage rows was a row
# update per key per flush.
KEY_TOUCH_EVERY_S = 60.0


def is_row_fault(exc: BaseException) -> bool:
    """True when the database refused the rows themselves (a value it cannot store), not
    when it could not be reached: only then does splitting the batch find the culprit."""
    if isinstance(exc, sa_exc.DataError | sa_exc.IntegrityError):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        # SQLSTATE class 22 (data exception: NUL, too long, out of range) or 23 (integrity).
        sqlstate = str(getattr(exc.orig, "sqlstate", "") or "")
        return sqlstate[:2] in ("22", "23")
    # Raised before anything reached the database: a value the driver cannot encode.
    return isinstance(exc, sa_exc.StatementError)


class UsageRecorder:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        interval_s: float = 0.5,
        batch_size: int = 500,
        max_pending: int = 100_000,
        health: DependencyHealth | None = None,
        spool_dir: Path | None = None,
        key_touch_every_s: float = KEY_TOUCH_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessions = sessions
        self._touch_every = key_touch_every_s
        self._clock = clock
        self._touched: dict[int, float] = {}  # API key id -> when its last_used_at was last written
        self._interval = interval_s
        self._batch = batch_size
        self._max_pending = max_pending
        self._health = health or DependencyHealth()
        self._spool_dir = spool_dir
        self._pending: deque[dict[str, Any]] = deque()
        self._wake = asyncio.Event()  # a full batch: write it now
        self._arrived = asyncio.Event()  # a row after none was pending: the writer's interval starts
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one flush at a time: a batch is never written twice
        self._stopping = False
        self._retry_at = 0.0  # after a database fault, no attempt before this (monotonic)
        self._backoff = interval_s
        self.written = 0
        self.dropped = 0  # oldest rows shed while the database was down for long
        self.rejected = 0  # rows the database refused (set aside, logged)
        self._in_flight: list[dict[str, Any]] = []  # the batch being written (out of the queue meanwhile)

    def finished(self, outcome: Outcome) -> None:
        """The usage row of a finished request (the pipeline's OutcomeSink)."""
        self.record(
            {
                "request_id": outcome.request_id,
                "tenant_id": outcome.tenant_id,
                "api_key_id": outcome.api_key_id,
                "model": outcome.asked_model,
                "served_model": outcome.model if outcome.model != outcome.asked_model else None,
                "deployment": outcome.deployment,
                "lane": outcome.lane,
                "endpoint": outcome.endpoint,
                "stream": outcome.stream,
                "end_user": outcome.end_user,
                "status": outcome.status,
                "finish_reason": outcome.finish_reason,
                "error_code": outcome.error_code,
                "prompt_tokens": outcome.prompt_tokens,
                "completion_tokens": outcome.completion_tokens,
                "queue_ms": outcome.queue_ms,
                "ttft_ms": outcome.ttft_ms,
                "total_ms": outcome.total_ms,
                "tries": outcome.tries,
                "continuations": outcome.continuations,
                "continued_prompt_tokens": outcome.continued_prompt_tokens,
                "early_stop": outcome.early_stop,
                "cost_micros": outcome.cost_micros,
                "failed_deployments": ",".join(t.deployment for t in outcome.failed_tries)[:400] or None,
            }
        )

    def record(self, row: dict[str, Any]) -> None:
        """Non-blocking: queue one usage row."""
        row.setdefault("created_at", datetime.now(UTC))
        if len(self._pending) >= self._max_pending:  # the database is down for long: shed the oldest
            self._pending.popleft()
            self.dropped += 1
        self._pending.append(row)
        if len(self._pending) == 1:
            self._arrived.set()
        if len(self._pending) >= self._batch:
            self._wake.set()

    @property
    def pending(self) -> int:
        """Rows not yet written: queued, or in the batch being written."""
        return len(self._pending) + len(self._in_flight)

    def queued_rows(self) -> list[dict[str, Any]]:
        """A copy of the rows not yet written (for inspection)."""
        return [*self._in_flight, *self._pending]

    async def start(self) -> None:
        self._load_spool()
        self._task = asyncio.create_task(self._run(), name="usage-recorder")

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Write everything still pending (for up to timeout_s), spool what could not be
        written. The writer is asked to stop, not cancelled: a cancellation between commit
        and bookkeeping would write a batch twice."""
        self._stopping = True
        self._wake.set()
        self._arrived.set()
        if self._task is not None:
            await self._task
        self._retry_at = 0.0
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            if not await self.flush():
                await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        self._spool()

    async def _run(self) -> None:
        """With nothing pending the writer sleeps until a row arrives (an idle gateway is not
        woken every interval to find nothing); from the first row on, it writes every interval
        (sooner for a full batch), so rows arriving together share a transaction."""
        while not self._stopping:
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            try:
                async with asyncio.timeout(self._interval):  # no task per wait, unlike wait_for
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if time.monotonic() >= self._retry_at:
                await self.flush()

    async def flush(self) -> bool:
        """Write what is pending; False when the database could not be reached."""
        async with self._lock:
            return await self._flush_pending()

    async def _flush_pending(self) -> bool:
        """Write the rows pending now, in batches. Rows recorded while it writes wait for the next
        flush: under steady traffic a few always arrive during a write, and flushing them too
        kept the writer in a loop of one transaction per handful of rows (measured on
        PostgreSQL at 1,000 requests/s: a transaction every ~7 requests, a quarter of the
        gateway's CPU), where the interval exists to batch them.

        A batch leaves the queue while it is written and goes back to its front if the write
        fails, so rows shed for space during a long outage (the oldest) are never the ones in
        flight."""
        size = self._batch
        left = len(self._pending)
        while left > 0 and self._pending:
            batch = [self._pending.popleft() for _ in range(min(size, left, len(self._pending)))]
            self._in_flight = batch
            try:
                await self._write(batch)
            except BaseException as exc:
                self._pending.extendleft(reversed(batch))  # back in front, in order
                if not isinstance(exc, Exception):  # cancelled: as if not attempted
                    raise
                if not is_row_fault(exc):
                    self._retry_at = time.monotonic() + self._backoff
                    self._backoff = min(self._backoff * 2, 10.0)
                    self._health.failed("database", exc, f"{len(self._pending)} usage rows kept for a retry")
                    return False
                if len(batch) > 1:
                    size = max(1, len(batch) // 2)  # narrow down on the row the database refuses
                    continue
                self._pending.popleft()  # the row the database refuses: set aside
                self.rejected += 1
                log.error("usage row refused by the database and set aside: %s: %.300r", exc, batch[0])
            else:
                self.written += len(batch)
                size = self._batch
            finally:
                self._in_flight = []
            left -= len(batch)
        if self._backoff != self._interval:
            self._backoff = self._interval
            self._health.recovered("database")
        return True

    async def _write(self, batch: list[dict[str, Any]]) -> None:
        now = self._clock()
        touched = self._touched
        due = [key for key in _key_ids(batch) if key not in touched or now - touched[key] >= self._touch_every]
        async with self._sessions() as session, session.begin():
            await UsageRepository(session).add_many(batch)
            if due:
                await TenantRepository(session).touch_keys(due, datetime.now(UTC))
        if due:  # committed: not again within the interval
            if len(touched) > 10_000:  # keys not touched within the interval are due anyway
                self._touched = touched = {k: at for k, at in touched.items() if now - at < self._touch_every}
            touched.update(dict.fromkeys(due, now))

    # ---- the spool: rows that outlive a shutdown during a database outage ----
    def _spool(self) -> None:
        if not self._pending:
            return
        if self._spool_dir is None:
            log.error("%d usage rows could not be written before shutdown and are lost", len(self._pending))
            return
        self._spool_dir.mkdir(parents=True, exist_ok=True)
        path = self._spool_dir / f"usage-{time.time_ns()}-{os.getpid()}.jsonl"
        with path.open("w") as out:
            for row in self._pending:
                out.write(json.dumps(row, default=_encode) + "\n")
        log.warning("%d usage rows could not be written; spooled to %s for the next start", len(self._pending), path)
        self._pending.clear()

    def _load_spool(self) -> None:
        if self._spool_dir is None or not self._spool_dir.is_dir():
            return
        for path in sorted(self._spool_dir.glob("usage-*.jsonl")):
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for row in rows:
                row["created_at"] = datetime.fromisoformat(row["created_at"])
            self._pending.extendleft(reversed(rows))
            path.unlink()
            log.info("loaded %d spooled usage rows from %s", len(rows), path)


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot spool {type(value).__name__}")


def _key_ids(rows: Iterable[dict[str, Any]]) -> set[int]:
    return {r["api_key_id"] for r in rows if r.get("api_key_id") is not None}
