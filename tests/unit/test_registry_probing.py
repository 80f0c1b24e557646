"""Passive health: an ejected replica that passes its health check comes back on probation,
one request at a time until one succeeds; a failed probe ejects it again at once."""

from __future__ import annotations

from laneway.engines.registry import EJECT_AFTER_FAILURES, EngineRegistry
from laneway.types import DeploymentSpec
from support.specs import sim_replica


def spec(i: int) -> DeploymentSpec:
    return sim_replica(i, max_model_len=4096, decode_ms_base=0.1, prefill_ms_per_token=0.0)


async def test_a_readmitted_replica_takes_one_request_at_a_time_until_one_succeeds() -> None:
    registry = EngineRegistry()
    await registry.load([spec(0), spec(1)])
    try:
        first, second = registry.deployments()
        for _ in range(EJECT_AFTER_FAILURES):
            registry.record(first, ok=False)
        assert not first.healthy and registry.resolve("m") is second
        await registry.check_health()  # the sim answers its health check: back, on probation
        assert first.healthy and first.probing
        second.outstanding = 5
        assert registry.resolve("m") is first  # the probe
        first.outstanding = 1
        assert registry.resolve("m") is second  # not a second one while the probe runs
        registry.record(first, ok=True)
        assert not first.probing and registry.resolve("m") is first  # proven: fewest outstanding wins again
    finally:
        await registry.close()


async def test_a_failed_probe_ejects_the_replica_again_at_once() -> None:
    registry = EngineRegistry()
    await registry.load([spec(0), spec(1)])
    try:
        first, _ = registry.deployments()
        for _ in range(EJECT_AFTER_FAILURES):
            registry.record(first, ok=False)
        await registry.check_health()
        assert first.probing
        registry.record(first, ok=False)
        assert not first.healthy and not first.probing
    finally:
        await registry.close()
