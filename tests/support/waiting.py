"""Wait with a deadline until a condition holds: from a test's thread (wait_for) or from a
coroutine on the event loop (until), which must yield to the loop between polls. Every wait in
the suite goes through these: a wait names what it waits for, gives up with that name, and
returns as soon as the condition holds, never a fixed sleep that is too short under load and
too long otherwise. Where the code can signal (an event, a future), await that instead; a fixed
sleep is left only where time passing is what a test checks (a comment says so)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], within: float = 10.0, step: float = 0.002, what: str = "condition") -> float:
    """Poll (from a test thread) until predicate() holds; return how long it took."""
    start = time.perf_counter()
    while not predicate():
        assert time.perf_counter() - start < within, f"{what} not reached within {within} s"
        time.sleep(step)
    return time.perf_counter() - start


async def until(
    predicate: Callable[[], Any | Awaitable[Any]], within: float = 10.0, step: float = 0.005, what: str = "condition"
) -> float:
    """Poll (from a coroutine, letting the loop run between polls) until predicate() holds,
    awaiting it when it returns an awaitable (a request, a query); return how long it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        held = predicate()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return loop.time() - start
        assert loop.time() - start < within, f"{what} not reached within {within} s"
        await asyncio.sleep(step)
