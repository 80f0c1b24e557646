"""Admin passwords (argon2id) and session tokens (random; only their sha256 is stored).

argon2id with 64 MiB takes about 0.3 s of CPU (in 4 lanes, i.e. up to 4 threads): it never
runs on the event loop. PasswordVerifier runs it in a small pool of low-priority threads
(argon2-cffi releases the GIL) and bounds how many verifications may wait; beyond the bound
a login is refused at once (429) instead of queueing CPU work behind the serving path.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError

_hasher = PasswordHasher()
# Verified when the username is unknown, so a wrong name costs as long as a wrong password.
_DUMMY_HASH = _hasher.hash("laneway-dummy-password")


MIN_PASSWORD_CHARS = 10


def hash_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_CHARS:
        raise ValueError(f"admin passwords must have at least {MIN_PASSWORD_CHARS} characters")
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    try:
        return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


# One worker on small machines (a verification already uses 4 lanes), two from 8 CPUs up.
HASH_THREADS = min(2, max(1, (os.cpu_count() or 1) // 4))
# Verifications running or waiting for a worker; one more is refused with 429 (login_busy).
MAX_PENDING_VERIFICATIONS = 8
# Hashing threads run at this nice level (Linux): the event loop wins the CPU when both want it.
HASH_THREAD_NICE = 10


def _lower_priority() -> None:
    if sys.platform == "linux":  # per-thread nice; argon2's own lane threads inherit it
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HASH_THREAD_NICE)


class PasswordVerifier:
    """argon2 off the event loop: a bounded pool, and a bounded number of pending checks."""

    def __init__(self, threads: int = HASH_THREADS, max_pending: int = MAX_PENDING_VERIFICATIONS) -> None:
        self.max_pending = max_pending
        self.pending = 0  # running or queued; decremented when the thread is done, not the request
        self.refused = 0
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="argon2", initializer=_lower_priority)

    def submit(self, password_hash: str | None, password: str) -> asyncio.Future[bool]:
        """Start verifying; the future resolves in the loop even if the request is cancelled
        meanwhile (shield it). 429 at once when the pool's backlog is full."""
        if self.pending >= self.max_pending:
            self.refused += 1
            raise GatewayError(
                ErrorCode.LOGIN_BUSY,
                "Too many logins are being checked right now; try again in a moment.",
                retry_after=1,
            )
        self.pending += 1
        future = asyncio.wrap_future(self._pool.submit(verify_password, password_hash, password))
        future.add_done_callback(self._done)
        return future

    def _done(self, _: asyncio.Future[bool]) -> None:
        self.pending -= 1

    async def hash(self, password: str) -> str:
        return await asyncio.wrap_future(self._pool.submit(hash_password, password))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def new_session_token() -> tuple[str, str, str]:
    """(cookie secret, its sha256, the CSRF token bound to the session)."""
    token = secrets.token_urlsafe(32)
    return token, hashlib.sha256(token.encode()).hexdigest(), secrets.token_urlsafe(24)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
