"""How the gateway's dependencies (Redis, the database) are doing, as one small shared record.

Every fault is counted (a metric read at scrape time); a dependency's faults are logged at
most once a minute, with how many there were since the last line, so an outage of Redis
under load writes a line a minute, not ten thousand. `degraded` says which dependencies a
component is working around right now (a fallback in use, stale data served).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import Counter
from collections.abc import Callable

from sqlalchemy import exc as sa_exc

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
            log.warning(
                "%s fault (%d since the last report): %s: %s; %s", dependency, n, type(exc).__name__, exc, consequence
            )

    def recovered(self, dependency: str) -> None:
        if self.degraded.get(dependency):
            self.degraded[dependency] = False
            log.info("%s is reachable again", dependency)


def database_unreachable(exc: BaseException) -> bool:
    """True when `exc` says the database could not be reached (refused, timed out, shutting
    down or starting up), not that a statement was wrong: an outage to count and ride out
    quietly, where anything else is a bug to log in full."""
    if isinstance(exc, OSError):  # refused, reset, timed out (TimeoutError is an OSError)
        return True
    if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        return _outage_sqlstate(exc.orig)
    # The driver's own errors, unwrapped: the config poll reads its counter through the raw
    # connection (db/config_version.py), where asyncpg's and sqlite3's reach the caller as they are.
    return isinstance(exc, sqlite3.OperationalError) or _outage_sqlstate(exc)


def _outage_sqlstate(exc: BaseException | None) -> bool:
    # SQLSTATE 08: connection exception; 57: shutting down / starting up; 53: out of resources.
    return str(getattr(exc, "sqlstate", "") or "")[:2] in ("08", "57", "53")
