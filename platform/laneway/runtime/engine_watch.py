"""The engine watcher: deployment edits from the database applied live, ejected deployments
checked again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.core.dependencies import DependencyHealth, database_unreachable
from laneway.db.repositories import DeploymentSpec, ModelRepository
from laneway.engines.registry import EngineRegistry

log = logging.getLogger("laneway")


async def enabled_deployments(sessions: async_sessionmaker[AsyncSession]) -> list[DeploymentSpec]:
    async with sessions() as session:
        return await ModelRepository(session).enabled_deployments()


async def watch_engines(
    registry: EngineRegistry,
    sessions: async_sessionmaker[AsyncSession],
    every_s: float,
    health: DependencyHealth,
    *,
    after_sync: Callable[[], None] = lambda: None,
    after_health: Callable[[], None] = lambda: None,
) -> None:
    """Live engine changes and health: apply deployment edits from the database (a model
    alias swapped to another engine, with no restart) and re-check ejected deployments.
    `after_sync` runs after each sync (the lane-cap check: policies are polled at this pace too),
    `after_health` after each health check (dispatch again: a replica may be back)."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await registry.sync(lambda: enabled_deployments(sessions))
            after_sync()
        except Exception as exc:
            if database_unreachable(exc):  # an outage: the running engines stay; a line a minute
                health.failed("database", exc, "keeping the running engines")
            else:
                log.exception("engine sync failed; will retry")
        try:
            await registry.check_health()  # needs no database: runs through an outage too
            after_health()
        except Exception:
            log.exception("engine health check failed; will retry")
