"""Poll with a deadline until a condition holds: from a test's thread (wait_for) or from a
coroutine on the event loop (until), which must yield to the loop between polls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], within: float = 10.0, step: float = 0.002, what: str = "condition") -> float:
    """Poll (from a test thread) until predicate() holds; return how long it took."""
    start = time.perf_counter()
    while not predicate():
        assert time.perf_counter() - start < within, f"{what} not reached within {within} s"
        time.sleep(step)
    return time.perf_counter() - start


async def until(
    predicate: Callable[[], Any], within: float = 10.0, step: float = 0.005, what: str = "condition"
) -> float:
    """Poll (from a coroutine, letting the loop run between polls) until predicate() holds;
    return how long it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not predicate():
        assert loop.time() - start < within, f"{what} not reached within {within} s"
        await asyncio.sleep(step)
    return loop.time() - start
