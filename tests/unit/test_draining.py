"""A drained replica takes no new request, whichever way requests are placed (Registry.resolve
at arrival, the alias's late-binding dispatch), while the ones it runs finish; draining is
applied to the running engine in place, never by restarting it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from laneway.core.pipeline import Gateway, GatewayConfig, GenerationIntent
from laneway.core.policy import PolicyStore
from laneway.engines.registry import EngineRegistry
from laneway.types import DeploymentSpec, TenantSnapshot
from support.pipeline import run_admitted
from support.specs import sim_replica

ACME = TenantSnapshot(id=1, name="acme", api_key_id=11)


def spec(i: int, *, draining: bool = False) -> DeploymentSpec:
    return sim_replica(i, draining=draining, decode_ms_base=1.0, max_concurrency=2)


@pytest.fixture
async def registry() -> AsyncIterator[EngineRegistry]:
    registry = EngineRegistry()
    await registry.load([spec(0), spec(1)])
    yield registry
    await registry.close()


def chat(prompt: str) -> GenerationIntent:
    return GenerationIntent(endpoint="completions", alias="m", stream=False, prompt=prompt, max_tokens=2)


async def test_resolve_passes_over_a_draining_replica_unless_nothing_else_serves(registry: EngineRegistry) -> None:
    registry.set_draining("m-0", True)
    assert {registry.resolve("m").spec.name for _ in range(4)} == {"m-1"}
    registry.replicas("m")[1].outstanding = 50  # busy beyond its slots: still not the drained one
    assert registry.resolve("m").spec.name == "m-1"
    registry.set_draining("m-1", True)  # all draining: serve rather than fail
    assert registry.resolve("m").spec.name == "m-0"


async def test_a_sync_drains_the_running_engine_in_place(registry: EngineRegistry) -> None:
    before = {d.spec.name: (d, d.engine) for d in registry.deployments()}
    changed = await registry.sync([spec(0, draining=True), spec(1)])
    assert changed == []  # no engine started or stopped
    after = {d.spec.name: (d, d.engine) for d in registry.deployments()}
    assert after == before and [d.draining for d in registry.replicas("m")] == [True, False]
    await registry.sync([spec(0), spec(1)])
    assert not any(d.draining for d in registry.deployments())


@pytest.mark.parametrize("routing", ["cache_aware", "least_outstanding", "round_robin"])
async def test_new_requests_avoid_a_drained_replica(registry: EngineRegistry, routing: str) -> None:
    gw = Gateway(registry, PolicyStore(None), config=GatewayConfig(routing=routing))
    registry.set_draining("m-0", True)  # the first in line: on a tie, least_outstanding's choice
    served = set()
    for i in range(6):
        call = await gw.prepare(ACME, chat(f"question {i}"))
        await run_admitted(gw, call)
        served.add(call.deployment.spec.name)
    assert served == {"m-1"}


async def test_a_request_running_on_a_replica_that_is_drained_finishes_there(registry: EngineRegistry) -> None:
    gw = Gateway(registry, PolicyStore(None))
    running = await gw.admit(await gw.prepare(ACME, chat("held")))
    drained = running.call.deployment
    registry.set_draining(drained.spec.name, True)
    deltas = [d async for d in gw.run(running)]
    running.release()
    assert deltas and running.call.deployment is drained and drained.outstanding == 0
