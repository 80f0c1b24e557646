"""How the gateway's dependencies (Redis, the database) are doing, as one small shared record.

Every fault is counted (a metric read at scrape time); a dependency's faults are logged at
most once a minute, with how many there were since the last line, so an outage of Redis
under load writes a line a minute, not ten thousand. `degraded` says which dependencies a
component is working around right now (a fallback in use, stale data served).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

log = logging.getLogger("laneway.dependencies")


class DependencyHealth:
    def __init__(self, *, log_every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._log_every = log_every_s
        self.errors: Counter[str] = Counter()  # faults per dependency, ever
        self.error_kinds: Counter[tuple[str, str]] = Counter()  # (dependency, exception type)
        self.degraded: dict[str, bool] = {}
        self._last_log: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()

    def failed(self, dependency: str, exc: BaseException, consequence: str) -> None:
        """Record one fault of `dependency`; `consequence` says what the gateway did about it."""
        self.errors[dependency] += 1
        self.error_kinds[dependency, type(exc).__name__] += 1
        self.degraded[dependency] = True
        self._unlogged[dependency] += 1
        now = self._clock()
        last = self._last_log.get(dependency)
        if last is None or now - last >= self._log_every:
            self._last_log[dependency] = now
            n, self._unlogged[dependency] = self._unlogged[dependency], 0
            log.warning("%s fault (%d since the last report): %s: %s; %s",
                        dependency, n, type(exc).__name__, exc, consequence)  # fmt: skip

    def recovered(self, dependency: str) -> None:
        if self.degraded.get(dependency):
            self.degraded[dependency] = False
            log.info("%s is reachable again", dependency)
