"""Admin login throttling: per client address and per username, in this replica's memory.

After FREE_FAILURES failed logins (within WINDOW_S) an address or a username is locked for
BASE_DELAY_S, doubling with every further failure up to MAX_DELAY_S; a locked login gets 429
with Retry-After and is never verified (no argon2 work). Failures are forgotten WINDOW_S after
the last failure or lock. Concurrent attempts count: once the free failures are used up, only
one attempt at a time is checked.

A success clears its username's failures and makes the address *familiar* for that username
(remembered for FAMILIAR_S). Attempts from a familiar address are throttled per address only,
not by the username's counter, so an attacker hammering "admin" from elsewhere cannot lock
the real admin out from the addresses it logs in from (the "smart lockout" idea: separate
counters for familiar and unfamiliar locations).

Behind a reverse proxy the client address is the proxy's unless uvicorn trusts its
forwarded headers (forwarded_allow_ips): then scope["client"] is the real client.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from laneway.admin.security import PasswordVerifier
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError

FREE_FAILURES = 5
WINDOW_S = 15 * 60.0
BASE_DELAY_S = 1.0
MAX_DELAY_S = 15 * 60.0
FAMILIAR_S = 30 * 24 * 3600.0
MAX_ENTRIES = 100_000  # the least recently touched are dropped beyond this (memory bound)


@dataclass
class _Record:
    failures: int = 0
    last_s: float = 0.0  # the last failure
    locked_until: float = 0.0
    in_flight: int = 0


@dataclass
class LoginAttempt:
    throttle: LoginThrottle
    username: str
    address: str
    keys: list[tuple[str, ...]]
    done: bool = False

    def finish(self, ok: bool | None) -> None:
        """ok: the password was right; False: wrong; None: never checked (refused, cancelled)."""
        if not self.done:
            self.done = True
            self.throttle._finish(self, ok)


@dataclass
class LoginThrottle:
    clock: Callable[[], float] = time.monotonic
    free_failures: int = FREE_FAILURES
    window_s: float = WINDOW_S
    base_delay_s: float = BASE_DELAY_S
    max_delay_s: float = MAX_DELAY_S
    max_entries: int = MAX_ENTRIES
    _records: OrderedDict[tuple[str, ...], _Record] = field(default_factory=OrderedDict)
    _familiar: OrderedDict[tuple[str, str], float] = field(default_factory=OrderedDict)
    throttled: int = 0  # attempts refused with 429 (for tests and logs)

    def begin(self, username: str, address: str) -> LoginAttempt:
        """Admit a login attempt, or raise 429 with Retry-After without checking anything."""
        now = self.clock()
        keys: list[tuple[str, ...]] = [("address", address)]
        if not self._is_familiar(username, address, now):
            keys.append(("username", username))
        wait = 0.0
        for key in keys:
            rec = self._record(key, now)
            if now < rec.locked_until:
                wait = max(wait, rec.locked_until - now)
            elif rec.in_flight and rec.failures + rec.in_flight >= self.free_failures:
                wait = max(wait, 1.0)  # the one allowed check is under way
        if wait > 0:
            self.throttled += 1
            raise GatewayError(
                ErrorCode.TOO_MANY_LOGIN_ATTEMPTS,
                f"Too many failed logins from this address or for this username; try again in "
                f"{max(1, int(wait + 0.999))} seconds.",
                retry_after=wait,
            )
        for key in keys:
            self._records[key].in_flight += 1
        return LoginAttempt(self, username, address, keys)

    def _finish(self, attempt: LoginAttempt, ok: bool | None) -> None:
        now = self.clock()
        for key in attempt.keys:
            rec = self._records.get(key)
            if rec is None:
                continue
            rec.in_flight = max(0, rec.in_flight - 1)
            if ok is False:
                rec.failures += 1
                rec.last_s = now
                if rec.failures >= self.free_failures:
                    delay = self.base_delay_s * 2 ** min(rec.failures - self.free_failures, 40)
                    rec.locked_until = now + min(self.max_delay_s, delay)
        if ok:
            user = self._records.get(("username", attempt.username))
            if user is not None:
                user.failures, user.locked_until = 0, 0.0
            self._familiar[(attempt.username, attempt.address)] = now
            self._familiar.move_to_end((attempt.username, attempt.address))
            while len(self._familiar) > self.max_entries:
                self._familiar.popitem(last=False)

    def _is_familiar(self, username: str, address: str, now: float) -> bool:
        seen = self._familiar.get((username, address))
        return seen is not None and now - seen < FAMILIAR_S

    def _record(self, key: tuple[str, ...], now: float) -> _Record:
        rec = self._records.get(key)
        if rec is None:
            rec = self._records[key] = _Record()
            while len(self._records) > self.max_entries:
                oldest, old = next(iter(self._records.items()))
                if old.in_flight:  # never drop one with a check under way: its finish would be lost
                    self._records.move_to_end(oldest)
                    break
                self._records.popitem(last=False)
        elif not rec.in_flight and now - max(rec.last_s, rec.locked_until) > self.window_s:
            rec.failures, rec.locked_until = 0, 0.0  # forgiven
        self._records.move_to_end(key)
        return rec


@dataclass
class LoginGuard:
    """What an admin login goes through: the throttle, then the bounded password check."""

    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    verifier: PasswordVerifier = field(default_factory=PasswordVerifier)

    async def close(self) -> None:
        self.verifier.close()
