"""The runtime's lifecycle: services start in dependency order and stop in reverse, a start
that fails stops what had started, and one failing stop does not keep the others running."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from laneway.core.config_watch import ConfigChanges
from laneway.engines.registry import EngineRegistry
from laneway.runtime import Lifecycle, Runtime
from laneway.settings import Settings
from support import seed, sim_model

# Without Redis or tracing (each adds its step where it starts: tracing first, redis after the
# policies, shared slots after the auth sweeps).
START_ORDER = [
    "login guard",
    "database",
    "engines",
    "warm-up",
    "policies",
    "rate limiter",
    "budget alerts",
    "usage recorder",
    "auth sweeps",
    "gateway",
    "loop lag",
    "config changes",
    "config poll",
    "admin and api",
    "batch runner",
    "requests",
]
NOTHING_TO_STOP = {"policies", "gateway", "admin and api"}  # built, not started: no stop of their own


def stops_of(started: list[str]) -> list[str]:
    """The steps that stop, in the order they must: the reverse of their start."""
    return [name for name in reversed(started) if name not in NOTHING_TO_STOP]


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
    assert runtime.lifecycle.stopped == stops_of(START_ORDER)
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
    assert runtime.lifecycle.stopped == stops_of(started)  # the usage recorder flushed, the pool closed
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


async def test_a_step_that_fails_half_way_stops_its_own_part_and_those_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step starts one service or leaves nothing of it running: engines that started before
    the load failed are closed by their step, then what came before stops in reverse."""
    closed: list[str] = []

    async def fail_load(self: EngineRegistry, specs: object) -> None:
        raise RuntimeError("an engine would not start")

    async def close(self: EngineRegistry) -> None:
        closed.append("engines")

    monkeypatch.setattr(EngineRegistry, "load", fail_load)
    monkeypatch.setattr(EngineRegistry, "close", close)
    runtime = Runtime(settings(tmp_path))
    with pytest.raises(RuntimeError, match="would not start"):
        await runtime.start()
    assert closed == ["engines"] and not runtime.running
    assert runtime.lifecycle.started == ["login guard", "database"]
    assert runtime.lifecycle.stopped == ["database", "login guard"]


async def test_the_lifecycle_runs_named_steps_in_order_and_stops_them_in_reverse() -> None:
    ran: list[str] = []

    def step(name: str, *, stops: bool = True, fails: bool = False):  # type: ignore[no-untyped-def]
        async def stop() -> None:
            ran.append(f"stop {name}")

        async def start():  # type: ignore[no-untyped-def]
            if fails:
                raise ConnectionError(f"{name} refused")
            ran.append(f"start {name}")
            return stop if stops else None

        return name, start

    lifecycle = Lifecycle()
    with pytest.raises(ConnectionError, match="redis refused"):
        await lifecycle.start([step("pool"), step("policies", stops=False), step("cache"), step("redis", fails=True)])
    assert ran == ["start pool", "start policies", "start cache", "stop cache", "stop pool"]
    assert lifecycle.started == ["pool", "policies", "cache"] and lifecycle.stopped == ["cache", "pool"]


def test_the_runtime_reads_the_gateway_through_its_public_methods() -> None:
    """Composition wires the gateway and asks it questions (dry_run, replicas_changed,
    replica_figures, default_max_tokens); it never reaches into its stages."""
    stages = {"preparer", "waiting", "failover", "dispatch"}
    runtime = Path(__file__).resolve().parents[2] / "platform" / "laneway" / "runtime"
    reached = [
        f"{path.name}:{node.lineno} .{node.attr}"
        for path in sorted(runtime.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in stages
    ]
    assert reached == []
