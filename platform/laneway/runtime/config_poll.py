"""The configuration poll: one loop per replica that reads the configuration's version (a
counter the database's triggers move, db/config_version.py) and reloads the policies and the
engines only when it moved, then checks the engines' health.

It used to be two loops, the policies' and the engines', each reading its tables every poll:
an idle gateway's main cost. NOTIFY (core/config_watch.py) still brings a change to every
replica at once on PostgreSQL; the poll is the fallback there and the only path on SQLite."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.core.dependencies import DependencyHealth, database_unreachable
from laneway.db.repositories import DeploymentSpec, ModelRepository
from laneway.engines.registry import EngineRegistry

log = logging.getLogger("laneway")


async def enabled_deployments(sessions: async_sessionmaker[AsyncSession]) -> list[DeploymentSpec]:
    async with sessions() as session:
        return await ModelRepository(session).enabled_deployments()


class ConfigPoll:
    """`version()` reads the counter; `apply()` reloads everything it covers. `seen` is the
    version the replica's configuration was last loaded at (None: unknown, the next poll
    reloads)."""

    def __init__(
        self,
        version: Callable[[], Awaitable[int]],
        apply: Callable[[], Awaitable[None]],
        *,
        seen: int | None = None,
        unsettled: Callable[[], bool] = lambda: False,
    ) -> None:
        self._version = version
        self._apply = apply
        self._unsettled = unsettled  # True: reload at every poll, moved or not
        self.seen = seen
        self.reloads = 0  # applied changes (for tests and logs)

    async def refresh(self, *, force: bool = False) -> bool:
        """Reload if the version moved since the last load (always, with `force`: a NOTIFY,
        which also covers what the counter does not; and while `unsettled()`); whether it
        reloaded. The version is read
        before the reload: a change committed during it moves the counter past what is kept,
        and the next poll reloads again."""
        version = await self._version()
        if version == self.seen and not force and not self._unsettled():
            return False
        await self._apply()
        self.seen = version
        self.reloads += 1
        return True

    async def run(
        self,
        registry: EngineRegistry,
        every_s: float,
        health: DependencyHealth,
        *,
        after_tick: Callable[[], None] = lambda: None,
    ) -> None:
        """Every `every_s`: the configuration if it changed, then the engines' health (ejected
        deployments checked again); `after_tick` then (the lane-cap check, a dispatch: a
        replica may be back)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.refresh()
            except Exception as exc:
                if database_unreachable(exc):  # an outage: the running engines and policies stay
                    health.failed("database", exc, "keeping the running engines and policies")
                else:
                    log.exception("configuration reload failed; the next poll retries")
            try:
                await registry.check_health()  # needs no database: runs through an outage too
                after_tick()
            except Exception:
                log.exception("engine health check failed; will retry")
