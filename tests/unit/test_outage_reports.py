"""A database outage is reported, not replayed: the loops that poll the database (the batch
runner, the config poll, the config listener) go on through it, and its faults reach the
one rate-limited reporter (core/dependencies.py) - a line an interval with the reason, no
traceback a tick. Issue 37 found the batch runner and the config poll writing a traceback
every second each while the database was out of reach. A fault that is no outage (a bug)
is still logged in full."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator

import asyncpg
import pytest
from laneway.api.batches.runner import BatchRunner
from laneway.core.config_watch import ConfigChanges
from laneway.core.dependencies import DependencyHealth
from laneway.db.session import make_engine
from laneway.runtime.config_poll import ConfigPoll
from support import free_port
from support.waiting import until

TICKS = 20


class Clock:
    """The reporter's clock, moved by the test: an interval passes when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    """What laneway logs at WARNING and above (a handler of its own: the app's logging config
    may have replaced the root's)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def reports(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.name == "laneway.dependencies"]

    def tracebacks(self) -> list[str]:
        return [f"{r.name}: {r.getMessage()}" for r in self.records if r.exc_info]


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("laneway")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


class DownStore:
    """The runner's side of BatchStore while the database refuses connections (`error`)."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls: Counter[str] = Counter()

    async def any_open(self) -> bool:
        self.calls["any_open"] += 1
        raise self.error

    async def release(self, owner: str) -> int:
        raise self.error


async def test_the_batch_runner_reports_an_outage_a_line_an_interval(lines: Lines) -> None:
    clock = Clock()
    health = DependencyHealth(log_every_s=60, clock=clock)
    store = DownStore(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)"))
    runner = BatchRunner(store, None, owner="me", slots=lambda _: 1, poll_s=0.001, health=health)  # type: ignore[arg-type]
    await runner.start()
    try:
        await until(lambda: store.calls["any_open"] >= TICKS, what=f"{TICKS} ticks")
        assert len(lines.reports()) == 1 and "ConnectionRefusedError" in lines.reports()[0]
        assert "batch runner tick failed" in lines.reports()[0]  # the reason: who met it, and what it does
        clock.now += 60  # an interval later: one more line, counting the ticks between
        ticked = store.calls["any_open"]
        await until(lambda: store.calls["any_open"] >= ticked + TICKS, what=f"{TICKS} more ticks")
    finally:
        await runner.stop(grace_s=0)  # its hand-back meets the outage too: no traceback either
    assert len(lines.reports()) == 2 and lines.tracebacks() == []
    assert health.errors["database"] >= 2 * TICKS and health.degraded["database"]


async def test_a_batch_runner_fault_that_is_no_outage_is_logged_in_full(lines: Lines) -> None:
    store = DownStore(RuntimeError("a bug"))
    runner = BatchRunner(store, None, owner="me", slots=lambda _: 1, poll_s=0.001)  # type: ignore[arg-type]
    await runner.start()
    try:
        await until(lambda: store.calls["any_open"] >= 2)
    finally:
        await runner.stop(grace_s=0)
    assert lines.reports() == [] and len(lines.tracebacks()) >= 2


class Engines:
    async def check_health(self) -> None:
        pass


async def test_the_config_poll_reports_a_connection_lost_under_its_raw_read(lines: Lines) -> None:
    """The poll reads its counter through asyncpg's own connection (db/config_version.py),
    so a connection lost under it reaches it unwrapped, as asyncpg's error."""
    clock, reads = Clock(), Counter[str]()
    health = DependencyHealth(log_every_s=60, clock=clock)

    async def version() -> int:
        reads["version"] += 1
        raise asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation")

    async def apply() -> None:
        raise AssertionError("nothing to apply: the version was never read")

    poll = ConfigPoll(version, apply)
    task = asyncio.create_task(poll.run(Engines(), 0.001, health))  # type: ignore[arg-type]
    try:
        await until(lambda: reads["version"] >= TICKS, what=f"{TICKS} polls")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert len(lines.reports()) == 1 and "ConnectionDoesNotExistError" in lines.reports()[0]
    assert lines.tracebacks() == [] and health.errors["database"] >= TICKS


async def test_the_config_listener_reports_a_refused_connection_with_the_rest(lines: Lines) -> None:
    health = DependencyHealth(log_every_s=60, clock=Clock())
    engine = make_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/none")  # nothing listens there

    async def apply() -> None:
        pass

    changes = ConfigChanges(engine, apply, health)
    await changes.start()
    try:
        await until(lambda: health.errors["database"] >= 1, what="the refused LISTEN reported")
    finally:
        await changes.stop()
        await engine.dispose()
    assert len(lines.reports()) == 1 and "not listening for config changes" in lines.reports()[0]
    assert [r for r in lines.records if r.name == "laneway.config"] == []
