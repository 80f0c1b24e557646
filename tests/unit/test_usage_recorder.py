"""The usage writer's queue around a write in flight (the database side: tests/db/test_usage_durability.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from laneway.usage import UsageRecorder
from support import until


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


class CountedFlushes(UsageRecorder):
    """A recorder that counts the writer's rounds (each a flush) and writes nowhere."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(None, **kwargs)  # type: ignore[arg-type]
        self.flushes = 0
        self.rows: list[str] = []

    async def flush(self) -> bool:
        self.flushes += 1
        return await super().flush()

    async def _write(self, batch: list[dict[str, Any]]) -> None:
        self.rows += [r["request_id"] for r in batch]


async def test_the_writer_sleeps_while_nothing_is_pending_and_wakes_on_the_first_row() -> None:
    """An idle gateway's writer is not woken every interval to find nothing; the first row
    wakes it, and the rows of one interval still share one write."""
    recorder = CountedFlushes(interval_s=0.02)
    await recorder.start()
    try:
        await asyncio.sleep(0.3)  # time passing is the point: fifteen intervals with nothing to write
        assert recorder.flushes == 0
        for i in range(3):
            recorder.record(row(i))
        await until(lambda: recorder.rows, within=1, what="the first write")
        assert recorder.rows == ["r0", "r1", "r2"] and recorder.flushes == 1  # one write for the three
        await asyncio.sleep(0.3)  # time passing is the point: idle again, no flush
        assert recorder.flushes == 1
    finally:
        await recorder.stop()
    assert recorder._task is not None and recorder._task.done()  # stop() ends the sleeping writer
