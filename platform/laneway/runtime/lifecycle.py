"""The start-up steps of a Runtime, and their stops in reverse order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("laneway")

Stop = Callable[[], Awaitable[object]]


class Lifecycle:
    """Named steps, stopped in the reverse of the order they started. One stop that fails is
    logged and the others still run: a flaky Redis at shutdown must not leave the usage
    rows unflushed or the database pool open."""

    def __init__(self) -> None:
        self._stops: list[tuple[str, Stop]] = []
        self.started: list[str] = []  # in order, for logs and tests
        self.stopped: list[str] = []

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
