"""Live registry changes without HTTP: overlapping syncs start one set of engines, and an
admin edit's engines start (all or nothing) before anything is installed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from laneway.db.repositories import DeploymentSpec
from laneway.engines.config import SimConfig
from laneway.engines.kinds import EngineKind
from laneway.engines.registry import EngineRegistry, EngineStartError
from laneway.engines.sim import SimEngine

STARTED: list[str] = []


class SlowStartSim(SimEngine):
    """A sim engine whose start takes a while (like loading a model) and is counted."""

    async def start(self) -> None:
        STARTED.append(self.alias)
        await asyncio.sleep(0.05)
        await super().start()


@pytest.fixture(autouse=True)
def slow_kind(engine_kind: Callable[[EngineKind], EngineKind]) -> Iterator[None]:
    STARTED.clear()
    engine_kind(EngineKind("slow", SimConfig, SlowStartSim))
    yield


def spec(name: str, kind: str = "slow", config: dict[str, Any] | None = None, ident: int = 1) -> DeploymentSpec:
    return DeploymentSpec(ident, name, "m", kind, config or {"decode_ms_base": 0.1}, "q", "g", 256)


def test_specs_compare_without_their_row_id() -> None:
    assert spec("a", ident=0) == spec("a", ident=7)
    assert spec("a") != spec("a", config={"decode_ms_base": 0.2})


async def test_two_overlapping_syncs_start_one_set_of_engines() -> None:
    registry = EngineRegistry()
    try:
        changed = await asyncio.gather(registry.sync([spec("m-a")]), registry.sync([spec("m-a", ident=2)]))
        assert sorted(changed) == [[], ["m"]]  # the second saw the first's engines
        assert STARTED == ["m"] and [d.spec.name for d in registry.deployments()] == ["m-a"]
        # A sync overlapping an admin install of the same rows starts nothing either.
        started = await registry.start([spec("m-b", ident=0)])
        assert STARTED == ["m", "m"]

        async def commit() -> bool:
            await asyncio.sleep(0.02)  # the rows are being written while a poll arrives
            return True

        results = await asyncio.gather(registry.install("m", started, commit), registry.sync([spec("m-b", ident=9)]))
        assert results[1] == [] and STARTED == ["m", "m"]
        assert registry.resolve("m") is started[0]
    finally:
        await registry.close()


async def test_an_edit_that_cannot_start_changes_nothing_and_leaves_readiness_alone() -> None:
    registry = EngineRegistry()
    await registry.load([spec("m-a", kind="sim")])
    await registry.warm_up()
    serving = registry.resolve("m")
    try:
        with pytest.raises(EngineStartError) as info:
            await registry.start([spec("m-ok"), spec("m-bad", kind="llamacpp", config={"model_path": "/nope.gguf"})])
        assert info.value.name == "m-bad" and "not found" in info.value.reason
        with pytest.raises(EngineStartError) as info:
            await registry.start([spec("m-bad", kind="vllm", config={})])
        assert info.value.reason == "vllm needs config key 'base_url'"
        assert registry.resolve("m") is serving and registry.ready and not registry.failed and not registry.rejected
    finally:
        await registry.close()


async def test_a_failed_commit_installs_nothing() -> None:
    registry = EngineRegistry()
    await registry.load([spec("m-a", kind="sim")])
    serving = registry.resolve("m")
    started = await registry.start([spec("m-b")])
    try:

        async def commit() -> bool:
            raise RuntimeError("database down")

        with pytest.raises(RuntimeError):
            await registry.install("m", started, commit)
        assert registry.resolve("m") is serving
    finally:
        await registry.close()


async def test_a_poll_that_read_the_rows_before_an_edit_does_not_undo_it() -> None:
    """The poller reads the database under the registry's lock: rows read before an admin's
    install cannot be applied after it and switch the alias back."""
    registry = EngineRegistry()
    rows = [spec("m-a")]
    try:
        await registry.sync(lambda: asyncio.sleep(0, result=list(rows)))
        started = await registry.start([spec("m-b", ident=0)])

        async def commit() -> bool:
            rows[:] = [spec("m-b", ident=5)]  # the edit's rows, committed under the lock
            return True

        async def poll() -> list[str]:
            await asyncio.sleep(0)  # arrives while the install holds the lock
            return await registry.sync(lambda: asyncio.sleep(0, result=list(rows)))

        await asyncio.gather(registry.install("m", started, commit), poll())
        assert registry.resolve("m").spec.name == "m-b"
    finally:
        await registry.close()
