"""A FIFO pool of engine slots: a freed slot goes straight to the oldest waiter.

asyncio.Queue lets a newcomer take an item that was put for a woken waiter before that
waiter runs ("barging"); under load that starves a few requests for hundreds of ms. Here a
release hands the slot to the first waiter's future, so service order is arrival order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class SlotPool(Generic[T]):
    def __init__(self, slots: Iterable[T]) -> None:
        self._free: deque[T] = deque(slots)
        self._waiters: deque[asyncio.Future[T]] = deque()

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    async def acquire(self) -> T:
        if self._free and not self._waiters:
            return self._free.popleft()
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result())  # handed over just as we were cancelled: pass it on
            else:
                self._waiters.remove(waiter)
            raise

    def release(self, slot: T) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._free.append(slot)
