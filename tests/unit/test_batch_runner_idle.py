"""The batch runner with no batch open anywhere: one cheap question ("any open batch?") a long
poll apart instead of its round of queries (expiries, claims, finalizing); a batch created on
this replica starts a round at once, one created on another is found at the next question."""

from __future__ import annotations

import asyncio
from collections import Counter

from laneway.api.batches.runner import IDLE_POLL_FACTOR, NO_BATCH_POLL_FACTOR, BatchRunner
from support import until


class Store:
    """The runner's side of BatchStore, counting each call; `open` says whether a batch is."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.open = False

    async def any_open(self) -> bool:
        self.calls["any_open"] += 1
        return self.open

    async def expire_due(self) -> list[str]:
        self.calls["expire_due"] += 1
        return []

    async def active_batches(self) -> list[tuple[str, int, str]]:
        self.calls["active_batches"] += 1
        return []

    async def to_finalize(self, owner: str, lease_s: float) -> list[str]:
        self.calls["to_finalize"] += 1
        return []

    async def counts_by_state(self) -> dict[str, int]:
        self.calls["counts_by_state"] += 1
        return {"pending": 0}

    async def release(self, owner: str) -> int:
        return 0


async def test_with_no_open_batch_it_asks_one_question_and_runs_no_round() -> None:
    store = Store()
    poll_s = 0.01
    runner = BatchRunner(store, None, owner="me", slots=lambda _: 1, poll_s=poll_s)  # type: ignore[arg-type]
    await runner.start()
    try:
        await until(lambda: store.calls["any_open"] >= 1)
        await asyncio.sleep(poll_s * NO_BATCH_POLL_FACTOR * 3)  # time passing is the point: three long polls
        assert store.calls["expire_due"] == store.calls["active_batches"] == store.calls["to_finalize"] == 0
        assert 2 <= store.calls["any_open"] <= 5  # a long poll apart, not every tick
        assert store.calls["counts_by_state"] == 1 and runner.states == {"pending": 0}  # the gauge, read once

        runner.kick()  # a batch created on this replica: a round at once, no question asked
        await until(lambda: store.calls["expire_due"] == 1)
        assert store.calls["active_batches"] == 1 and store.calls["to_finalize"] == 1

        asked = store.calls["any_open"]
        store.open = True  # a batch created on another replica: found at the next question
        await until(
            lambda: store.calls["expire_due"] >= 3, within=poll_s * (NO_BATCH_POLL_FACTOR + 3 * IDLE_POLL_FACTOR) + 1
        )
        assert store.calls["any_open"] > asked
    finally:
        await runner.stop()
