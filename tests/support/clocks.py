"""A wall clock the test sets, for the limiters' calendar windows (days, months) and budgets."""

from __future__ import annotations

import time
from datetime import UTC, datetime


class Wall:
    """A settable UTC wall clock (epoch seconds), called like time.time: Wall() reads now, Wall(at)
    starts at an ISO time; set(at) moves it. Every limiter (or replica) handed it reads the same."""

    def __init__(self, at: str | None = None) -> None:
        self.now = time.time()
        if at is not None:
            self.set(at)

    def set(self, at: str) -> None:
        self.now = datetime.fromisoformat(at).replace(tzinfo=UTC).timestamp()

    def __call__(self) -> float:
        return self.now
