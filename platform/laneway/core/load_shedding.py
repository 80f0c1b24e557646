"""Load shedding by the gateway's own saturation, before any work is spent on a request.

When the event loop runs behind, a new request would only wait for the loop, time out at the
client, and take CPU from the requests that can still make it: goodput collapses while every
client waits (measured: 110 -> 23 requests a second at 5x capacity). So the HTTP protocol asks
this object, as soon as a request's headers are parsed and before the app sees it, whether
the loop is saturated, and if so answers a prepared 503 `overloaded` + Retry-After itself
(tens of microseconds: no routing, auth or JSON). Saturation is read from two delays: how late
a request starts after its headers arrived (measured on every request) and how late the
loop-lag monitor's timer fires. A delay over `max_delay_s` while API requests arrive at
`min_rate` a second or more sheds new API requests for `hold_s`; requests already in
progress and streams are never cut.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class LoadShedder:
    def __init__(
        self,
        max_delay_s: float = 0.02,
        hold_s: float = 0.05,
        min_rate: float = 200.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.max_delay_s = max_delay_s
        self.hold_s = hold_s
        # A delay only means saturation under load: a garbage-collection pause while a few
        # requests a second arrive is not a reason to refuse any of them.
        self.min_arrivals = max(1, int(min_rate * _WINDOW_S))
        self.clock = clock
        self._until = 0.0
        self._window_start = 0.0
        self._arrivals = 0  # API requests whose headers arrived in the current window
        self._previous = 0  # ... and in the one before it
        self.shed = 0  # requests refused, ever

    @property
    def enabled(self) -> bool:
        return self.max_delay_s > 0

    def arrived(self) -> None:
        now = self.clock()
        if now - self._window_start >= _WINDOW_S:
            self._previous = self._arrivals if now - self._window_start < 2 * _WINDOW_S else 0
            self._arrivals, self._window_start = 0, now
        self._arrivals += 1

    def observe(self, delay_s: float) -> None:
        """A delay the loop just imposed (a request's start, a timer's firing)."""
        if self.enabled and delay_s > self.max_delay_s and self._arrivals + self._previous >= self.min_arrivals:
            self._until = self.clock() + self.hold_s

    def overloaded(self) -> bool:
        return self.enabled and self.clock() < self._until


_WINDOW_S = 0.1
