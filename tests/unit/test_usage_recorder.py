"""The usage writer's queue around a write in flight (the database side: tests/db/test_usage_durability.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from laneway.usage import UsageRecorder


class HeldWrites(UsageRecorder):
    """A recorder whose writes wait for `release` (a slow database), then succeed or fail."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(None, **kwargs)  # type: ignore[arg-type]
        self.release = asyncio.Event()
        self.writing = asyncio.Event()
        self.fail = False
        self.rows: list[str] = []

    async def _write(self, batch: list[dict[str, Any]]) -> None:
        self.writing.set()
        await self.release.wait()
        if self.fail:
            raise ConnectionError("the database went away")
        self.rows += [r["request_id"] for r in batch]


def row(i: int) -> dict[str, Any]:
    return {"request_id": f"r{i}"}


async def test_rows_shed_for_space_are_never_the_ones_being_written() -> None:
    """A full queue sheds its oldest rows; the batch in flight is out of the queue, so a row
    recorded meanwhile cannot push out a row that is then counted as written, nor a row that
    was written be dropped from the count."""
    recorder = HeldWrites(interval_s=60, batch_size=10, max_pending=10)
    for i in range(10):
        recorder.record(row(i))
    flush = asyncio.ensure_future(recorder.flush())
    await recorder.writing.wait()
    assert recorder.pending == 10  # in flight, still not written
    for i in range(10, 15):
        recorder.record(row(i))
    assert recorder.dropped == 0 and recorder.pending == 15
    recorder.release.set()
    assert await flush
    assert recorder.rows == [f"r{i}" for i in range(10)] and recorder.written == 10
    assert [r["request_id"] for r in recorder.queued_rows()] == [f"r{i}" for i in range(10, 15)]


async def test_a_failed_write_puts_its_batch_back_in_front_in_order() -> None:
    recorder = HeldWrites(interval_s=60, batch_size=3)
    for i in range(5):
        recorder.record(row(i))
    recorder.fail = True
    recorder.release.set()
    assert not await recorder.flush()
    recorder.record(row(5))
    assert [r["request_id"] for r in recorder.queued_rows()] == [f"r{i}" for i in range(6)]
    recorder.fail = False
    recorder._retry_at = 0.0
    assert await recorder.flush()
    assert recorder.rows == [f"r{i}" for i in range(6)] and recorder.pending == 0
