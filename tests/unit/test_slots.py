import asyncio

import pytest
from laneway.engines.slots import SlotPool


async def test_released_slot_goes_to_the_oldest_waiter_not_a_newcomer() -> None:
    pool = SlotPool(["a"])
    held = await pool.acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        slot = await pool.acquire()
        order.append(i)
        await asyncio.sleep(0)
        pool.release(slot)

    tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
    await asyncio.sleep(0)
    pool.release(held)
    # A newcomer arriving right after the release must queue behind the three.
    tasks.append(asyncio.create_task(waiter(99)))
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 99]
    assert pool.free == 1 and pool.waiting == 0


async def test_a_cancelled_waiter_does_not_lose_the_slot() -> None:
    pool = SlotPool([1])
    held = await pool.acquire()
    t = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0)
    pool.release(held)  # handed to t's future ...
    t.cancel()  # ... and t is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await t
    assert pool.free == 1
    assert await asyncio.wait_for(pool.acquire(), 1) == 1
