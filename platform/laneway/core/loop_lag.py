"""Event-loop lag: how late the loop runs a timer, i.e. what every request on this replica
waits extra because something else is hogging the loop (a hash, a long prompt, a bug)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable


class LoopLagMonitor:
    def __init__(
        self, interval_s: float = 0.05, keep: int = 1200, on_sample: Callable[[float], None] | None = None
    ) -> None:
        self.interval_s = interval_s
        self._listeners: list[Callable[[float], None]] = [on_sample] if on_sample is not None else []
        self.samples: deque[float] = deque(maxlen=keep)  # lag of each tick, seconds (last minute)
        self.max_s = 0.0  # the worst since the last reset_max()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def subscribe(self, listener: Callable[[float], None]) -> Callable[[], None]:
        """Call `listener(lag)` on every tick too (one timer for all periodic checks: each timer
        more wakes an idle gateway 20 times a second); -> unsubscribe."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def reset_max(self) -> float:
        worst, self.max_s = self.max_s, 0.0
        return worst

    @property
    def last_s(self) -> float:
        return self.samples[-1] if self.samples else 0.0

    async def _run(self) -> None:
        while True:
            expected = time.perf_counter() + self.interval_s
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, time.perf_counter() - expected)
            self.samples.append(lag)
            self.max_s = max(self.max_s, lag)
            for listener in self._listeners:
                listener(lag)
