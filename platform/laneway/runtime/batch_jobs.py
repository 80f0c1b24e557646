"""Batch jobs in the serving process: the Files and Batches routes' services and this
replica's runner, started after the gateway (the lines run through it) and stopped before
it: on SIGTERM the runner stops claiming first, so what it runs drains with the rest, and
what is left goes back to the database for another replica."""

from __future__ import annotations

import os
import socket

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.api.batches.runner import BatchRunner
from laneway.api.batches.services import BatchServices
from laneway.api.batches.validate import Limits
from laneway.api.services import ApiServices
from laneway.core.dependencies import DependencyHealth
from laneway.core.ids import random_hex
from laneway.db.batch_store import BatchStore
from laneway.engines.registry import EngineRegistry
from laneway.settings import Settings


def replica_name() -> str:
    """Who holds a line's lease: unique per process, readable in the database."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{random_hex()[:8]}"


def batch_services(
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    api: ApiServices,
    registry: EngineRegistry,
    health: DependencyHealth,
) -> tuple[BatchServices, BatchRunner | None]:
    store = BatchStore(sessions)
    runner = None
    if settings.batch_runner:

        def slots(alias: str) -> int:
            return sum(d.engine.info.max_concurrency for d in registry.replicas(alias))

        runner = BatchRunner(
            store,
            api,
            owner=replica_name(),
            slots=slots,
            poll_s=settings.batch_poll_interval_s,
            lease_s=settings.batch_lease_s,
            health=health,
        )
    services = BatchServices(
        store=store,
        api=api,
        limits=Limits(max_lines=settings.batch_max_lines, max_bytes=settings.batch_max_file_bytes),
        window_s=settings.batch_window_s,
        kick=runner.kick if runner is not None else _nothing,
    )
    return services, runner


def _nothing() -> None:
    pass
