"""Tell every gateway replica that the configuration changed.

On PostgreSQL an admin change sends NOTIFY laneway_config and every replica LISTENs: the
change reaches them in milliseconds. Polling (LANEWAY_POLICY_POLL_INTERVAL_S) stays as the
fallback, and is the only path on SQLite, where there is nothing to listen to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from laneway.core.dependencies import DependencyHealth, database_unreachable

log = logging.getLogger("laneway.config")

CHANNEL = "laneway_config"


class ConfigChanges:
    def __init__(
        self, engine: AsyncEngine, apply: Callable[[], Awaitable[None]], health: DependencyHealth | None = None
    ) -> None:
        self._engine = engine
        self._apply = apply
        self._health = health or DependencyHealth()  # the process's: one report of a database outage
        self._task: asyncio.Task[None] | None = None
        self._pending: asyncio.Task[None] | None = None
        self.received = 0  # notifications applied (for tests and logs)
        self.connected = False  # LISTEN is on: a change committed from now on reaches this replica
        self._connections = 0

    @property
    def listening(self) -> bool:
        return self._engine.dialect.name == "postgresql"

    async def notify(self) -> None:
        """Announce a change (after it is committed); a no-op on SQLite."""
        if self.listening:
            async with self._engine.connect() as conn:
                await conn.execute(text(f"NOTIFY {CHANNEL}"))
                await conn.commit()

    async def start(self) -> None:
        if self.listening:
            self._task = asyncio.create_task(self._listen(), name="config-listen")

    async def stop(self) -> None:
        for task in (self._task, self._pending):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _listen(self) -> None:
        import asyncpg

        dsn = self._engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        while True:
            try:
                conn = await asyncpg.connect(dsn)
                closed = asyncio.Event()
                conn.add_termination_listener(lambda _conn, done=closed: done.set())
                await conn.add_listener(CHANNEL, self._on_notify)
                self.connected = True
                self._connections += 1
                if self._connections > 1:  # back after a drop: what changed meanwhile was not heard
                    self._on_notify()
                try:
                    await closed.wait()  # until the server or the network drops us
                finally:
                    self.connected = False
                    with contextlib.suppress(Exception):
                        await conn.close()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if database_unreachable(exc):  # an outage: reported with the others, a line an interval
                    self._health.failed("database", exc, "not listening for config changes; polling covers it")
                else:
                    log.warning("listening for config changes failed (%s); polling covers it, retrying", exc)
            await asyncio.sleep(2)

    def _on_notify(self, *_: Any) -> None:
        if self._pending is None or self._pending.done():  # a burst of changes: one reload
            self._pending = asyncio.ensure_future(self._run_apply())

    async def _run_apply(self) -> None:
        try:
            await self._apply()
            self.received += 1
        except Exception as exc:
            if database_unreachable(exc):
                self._health.failed("database", exc, "a config change not applied; the next poll retries")
            else:
                log.exception("applying a config change failed; the next poll retries")
