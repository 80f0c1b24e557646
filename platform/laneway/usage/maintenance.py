"""The usage tables' upkeep, in the background: day partitions created a week ahead and the
expired ones dropped (db/usage_retention.py), at start and then every `every_s`. Several
replicas may run it at once: each step is idempotent, and a replica that loses a race (the
partition another one just made) logs it and tries again next round."""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.db.usage_retention import RetentionResult, drop_expired, ensure_partitions

log = logging.getLogger("laneway.accounting")


class UsageMaintenance:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        raw_days: int = 90,
        rollup_days: int = 730,
        ahead_days: int = 7,
        every_s: float = 3600.0,
    ) -> None:
        self._sessions = sessions
        self.raw_days, self.rollup_days, self.ahead_days = raw_days, rollup_days, ahead_days
        self._every = every_s
        self._task: asyncio.Task[None] | None = None
        self.last: RetentionResult | None = None

    async def run_once(self) -> RetentionResult:
        async with self._sessions() as session, session.begin():
            made = await ensure_partitions(session, ahead_days=self.ahead_days)
        async with self._sessions() as session, session.begin():
            self.last = result = await drop_expired(session, raw_days=self.raw_days, rollup_days=self.rollup_days)
        if made or result.dropped_partitions or result.deleted_rows:
            log.info(
                "usage upkeep: %d partitions made, %d dropped, %d raw rows and %d rollups deleted",
                len(made),
                len(result.dropped_partitions),
                result.deleted_rows,
                result.deleted_rollups,
            )
        return result

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except (SQLAlchemyError, OSError) as exc:
                log.warning("usage upkeep failed (%s); again in %.0f s", exc, self._every)
            await asyncio.sleep(self._every)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="usage-maintenance")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
