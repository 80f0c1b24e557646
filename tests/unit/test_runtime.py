"""The runtime's lifecycle: services start in dependency order and stop in reverse, a start
that fails stops what had started, and one failing stop does not keep the others running."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from laneway.core.config_watch import ConfigChanges
from laneway.runtime import Lifecycle, Runtime
from laneway.settings import Settings
from support import seed, sim_model

# Without Redis or tracing (each adds its step where it starts: tracing first, shared slots
# after the auth sweeps).
START_ORDER = [
    "login guard",
    "database",
    "engines",
    "warm-up",
    "rate limiter",
    "budget alerts",
    "usage recorder",
    "auth sweeps",
    "loop lag",
    "config changes",
    "config poll",
    "batch runner",
    "requests",
]


def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, bootstrap_demo=False)


async def test_services_start_in_order_and_stop_in_reverse(tmp_path: Path) -> None:
    await seed(Settings(data_dir=tmp_path).resolved_database_url, models={"sim": sim_model("sim")})
    runtime = Runtime(settings(tmp_path))
    await runtime.start()
    assert runtime.running and runtime.lifecycle.started == START_ORDER
    assert runtime.gateway.registry.aliases() == ["sim"] and runtime.api.gateway is runtime.gateway
    recorder, loop_lag = runtime.recorder, runtime.loop_lag
    await runtime.stop()
    # The requests still running go first, the database pool last.
    assert runtime.lifecycle.stopped == START_ORDER[::-1]
    assert not runtime.running
    assert recorder._task is not None and recorder._task.done()
    assert loop_lag._task is not None and loop_lag._task.done()


async def test_a_failed_start_stops_what_had_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(self: ConfigChanges) -> None:
        raise RuntimeError("LISTEN refused")

    monkeypatch.setattr(ConfigChanges, "start", refuse)
    runtime = Runtime(settings(tmp_path))
    with pytest.raises(RuntimeError, match="LISTEN refused"):
        await runtime.start()
    started = START_ORDER[: START_ORDER.index("loop lag") + 1]
    assert runtime.lifecycle.started == started and not runtime.running
    assert runtime.lifecycle.stopped == started[::-1]  # the usage recorder flushed, the pool closed
    assert runtime.recorder._task is not None and runtime.recorder._task.done()
    assert runtime.loop_lag._task is not None and runtime.loop_lag._task.done()


async def test_one_failing_stop_does_not_keep_the_others_running(caplog: pytest.LogCaptureFixture) -> None:
    stopped: list[str] = []

    def step(name: str, *, fails: bool = False):  # type: ignore[no-untyped-def]
        async def stop() -> None:
            await asyncio.sleep(0)
            if fails:
                raise ConnectionError("redis went away")
            stopped.append(name)

        return stop

    lifecycle = Lifecycle()
    lifecycle.started_step("pool", step("pool"))
    lifecycle.started_step("no stop")
    lifecycle.started_step("limiter", step("limiter", fails=True))
    lifecycle.started_step("recorder", step("recorder"))
    await lifecycle.stop()
    assert stopped == ["recorder", "pool"]
    assert lifecycle.stopped == ["recorder", "limiter", "pool"]
    assert "stopping limiter failed" in caplog.text
    await lifecycle.stop()  # once stopped, nothing runs twice
    assert stopped == ["recorder", "pool"]
