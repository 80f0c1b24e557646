"""Event-loop lag: how late the loop runs a timer, i.e. what every request on this replica
waits extra because something else is hogging the loop (a hash, a long prompt, a bug).

The timer ticks every `interval_s` (50 ms) while there is load and every `idle_interval_s`
(1 s) while `busy()` says there is none: at 20 wake-ups a second the tick alone cost an idle
gateway ~0.4 % of a core (bench/overhead.py's idle row: 0.93-1.00 % vs 0.53-0.67 %), and each
wake-up of an idle process is CPU that an idle vllm-router does not spend (bench/idle_cpu.py). Load
coming back calls `wake()` (the load shedder does, on its first arrival after a quiet spell),
which ends the long wait at once with a tick of the listeners (no lag sample: the timer did not
run late), so the signals that act under load (the shedder's, the surge acceptors') look at
once and tick at the short interval from the first request on."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable


class LoopLagMonitor:
    def __init__(
        self,
        interval_s: float = 0.05,
        keep: int = 1200,
        on_sample: Callable[[float], None] | None = None,
        *,
        idle_interval_s: float = 1.0,
        busy: Callable[[], bool] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.idle_interval_s = idle_interval_s
        self._busy = busy  # None: always the short interval
        self._idle = False
        self._woken: asyncio.Event | None = None
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

    def wake(self) -> None:
        """Load is back: end a long idle wait now (cheap when not idle)."""
        if self._idle and self._woken is not None:
            self._idle = False
            self._woken.set()

    @property
    def idle(self) -> bool:
        return self._idle

    def _tell(self, lag: float) -> None:
        for listener in self._listeners:
            listener(lag)

    async def _run(self) -> None:
        self._woken = woken = asyncio.Event()
        while True:
            if self._idle:
                woken.clear()
                expected = time.perf_counter() + self.idle_interval_s
                try:
                    async with asyncio.timeout(self.idle_interval_s):  # no task per wait, unlike wait_for
                        await woken.wait()
                except TimeoutError:
                    pass
                else:  # woken early: no lag to read, but the listeners look now (a connection
                    self._tell(0.0)  # surge is seen from its first request on)
                    continue
            else:
                expected = time.perf_counter() + self.interval_s
                await asyncio.sleep(self.interval_s)
            lag = max(0.0, time.perf_counter() - expected)
            self.samples.append(lag)
            self.max_s = max(self.max_s, lag)
            self._tell(lag)
            self._idle = self._busy is not None and not self._busy()
