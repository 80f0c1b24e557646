"""Random ids for requests and completions (X-Request-Id's req_..., chatcmpl-..., cmpl-...),
made on the hot path of every request and every shed one."""

from __future__ import annotations

import os
import threading


class _RandomHex:
    """128 random bits as 32 hex digits, as uuid4().hex looks, from the OS's random source
    read 256 ids at a time. os.urandom lets go of the GIL for its system call, so each call
    on the event loop's thread could hand the GIL to another thread (the database driver's,
    the log writer's) and wait up to a switch interval (5 ms) to get it back: under load that
    was a measurable share of the loop's time (py-spy at 5x, one id for every shed request).
    Locked: callers may be threads; a fork starts its child on a block of its own."""

    BLOCK = 256

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hex = ""
        self._at = 0

    def __call__(self) -> str:
        with self._lock:
            at = self._at
            if at >= len(self._hex):
                self._hex, at = os.urandom(16 * self.BLOCK).hex(), 0
            self._at = at + 32
            return self._hex[at : at + 32]

    def forget(self) -> None:
        self._hex, self._at = "", 0
        self._lock = threading.Lock()  # a lock held by another thread at the fork stays held


random_hex = _RandomHex()
os.register_at_fork(after_in_child=random_hex.forget)
