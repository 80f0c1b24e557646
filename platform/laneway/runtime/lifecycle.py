"""The start-up steps of a Runtime, and their stops in reverse order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

log = logging.getLogger("laneway")

Stop = Callable[[], Awaitable[object]]
# A start step: starts one service and returns its stop (None: nothing to stop), or raises
# having left nothing of its own running.
Start = Callable[[], Awaitable[Stop | None]]


class Lifecycle:
    """Named steps, stopped in the reverse of the order they started. One stop that fails is
    logged and the others still run: a flaky Redis at shutdown must not leave the usage
    rows unflushed or the database pool open."""

    def __init__(self) -> None:
        self._stops: list[tuple[str, Stop]] = []
        self.started: list[str] = []  # in order, for logs and tests
        self.stopped: list[str] = []

    async def start(self, steps: Iterable[tuple[str, Start]]) -> None:
        """Run the steps in order, each one's stop kept as it returns; when one raises, what had
        started is stopped, in reverse, and the error propagates."""
        try:
            for name, start in steps:
                self.started_step(name, await start())
        except BaseException:
            await self.stop()
            raise

    def started_step(self, name: str, stop: Stop | None = None) -> None:
        self.started.append(name)
        if stop is not None:
            self._stops.append((name, stop))

    async def stop(self) -> None:
        while self._stops:
            name, stop = self._stops.pop()
            try:
                await stop()
            except Exception:
                log.exception("stopping %s failed; stopping the rest", name)
            self.stopped.append(name)


async def cancelled(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
