"""Deltas crossing from a decode thread to the request's stream on the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from laneway.engines.base import EngineError
from laneway.types import Delta

# Put on a request's queue when the thread is done with it (after its last delta, or instead).
DONE = object()


async def queued_deltas(out: asyncio.Queue[Any], n: int) -> AsyncGenerator[Delta, None]:
    """What a decode thread sends, until each of the n choices has finished (or the thread is
    done); an exception from it is the engine's failure."""
    left = n
    while True:
        item = await out.get()
        if item is DONE:
            return
        if isinstance(item, BaseException):
            raise EngineError(f"llama.cpp generation failed: {item}") from item
        yield item
        if item.finish_reason is not None:
            left -= 1
            if left == 0:
                return
