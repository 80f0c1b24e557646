"""Usage rows, written in batches by a background task so requests never wait on the database."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.db.repositories import TenantRepository, UsageRepository

log = logging.getLogger("laneway.accounting")


class UsageRecorder:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        interval_s: float = 0.5,
        batch_size: int = 500,
        max_pending: int = 100_000,
    ) -> None:
        self._sessions = sessions
        self._interval = interval_s
        self._batch = batch_size
        self._max_pending = max_pending
        self._pending: list[dict[str, Any]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one flush at a time: a batch is never written twice
        self._stopping = False
        self.written = 0
        self.dropped = 0

    def record(self, row: dict[str, Any]) -> None:
        """Non-blocking: queue one usage row."""
        row.setdefault("created_at", datetime.now(UTC))
        if len(self._pending) >= self._max_pending:  # the database is down for long: shed the oldest
            self._pending.pop(0)
            self.dropped += 1
        self._pending.append(row)
        if len(self._pending) >= self._batch:
            self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def queued_rows(self) -> list[dict[str, Any]]:
        """A copy of the rows not yet written (for inspection)."""
        return list(self._pending)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="usage-recorder")

    async def stop(self) -> None:
        """Write everything still pending. The writer is asked to stop, not cancelled: a
        cancellation between commit and bookkeeping would write a batch twice."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        await self.flush()

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self._interval)
            except TimeoutError:
                pass
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        async with self._lock:
            await self._flush_pending()

    async def _flush_pending(self) -> None:
        while self._pending:
            batch = self._pending[: self._batch]
            try:
                async with self._sessions() as session, session.begin():
                    await UsageRepository(session).add_many(batch)
                    await TenantRepository(session).touch_keys(_key_ids(batch), datetime.now(UTC))
            except Exception:
                log.exception("writing %d usage rows failed; will retry", len(batch))
                return
            del self._pending[: len(batch)]
            self.written += len(batch)


def _key_ids(rows: Iterable[dict[str, Any]]) -> set[int]:
    return {r["api_key_id"] for r in rows if r.get("api_key_id") is not None}
