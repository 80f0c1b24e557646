"""Failover's own wait: a request moved to another replica waits there for a slot. A client
that leaves during that wait releases everything: no slot, outstanding count or lease is left
on either replica, and its one usage row says 499."""

from __future__ import annotations

import asyncio
import contextlib

from laneway.core.pipeline import CLIENT_CLOSED, Gateway, GatewayConfig, GenerationIntent
from laneway.core.policy import PolicyStore
from laneway.engines.registry import EngineRegistry
from laneway.types import DeploymentSpec, TenantSnapshot
from laneway.usage import UsageRecorder
from support import until, usage_rows
from support.specs import sim_replica

TENANT = TenantSnapshot(id=1, name="acme", api_key_id=11)
FAULT = "<<laneway-sim-fault>>"


def spec(i: int, **config: object) -> DeploymentSpec:
    return sim_replica(
        i, max_model_len=4096, **{"decode_ms_base": 5.0, "prefill_ms_per_token": 0.0, "max_concurrency": 1, **config}
    )


async def test_a_client_leaving_while_its_request_waits_on_the_second_replica_leaks_nothing() -> None:
    registry = EngineRegistry()
    # m-0 fails before its first token; m-1 has one slot, held by a long request.
    await registry.load([spec(0, fault_after_tokens=0), spec(1)])
    # Bound at arrival (least_outstanding), so the test can pin the holder to m-1.
    gw = Gateway(
        registry,
        PolicyStore(None),
        sinks=[UsageRecorder(None, interval_s=60)],  # type: ignore[arg-type]
        config=GatewayConfig(routing="least_outstanding"),
    )
    first, second = registry.deployments()
    try:
        holder_call = await gw.prepare(
            TENANT, GenerationIntent(endpoint="completions", alias="m", stream=False, prompt="hold", max_tokens=400)
        )
        assert holder_call.deployment is first  # fewest outstanding, first listed: move it where it must go
        holder_call.deployment = second
        holder = await gw.admit(holder_call)
        call = await gw.prepare(
            TENANT, GenerationIntent(endpoint="completions", alias="m", stream=False, prompt=FAULT, max_tokens=20)
        )
        assert call.deployment is first
        lease = await gw.admit(call)

        async def collect() -> list[object]:
            return [d async for d in gw.run(lease)]

        run = asyncio.ensure_future(collect())
        await until(lambda: call.deployment is second, what="the request moved to m-1")
        await until(lambda: gw.scheduler(second).waiting_total == 1, what="waiting there for the held slot")
        assert not run.done()
        run.cancel()  # the client left
        with contextlib.suppress(asyncio.CancelledError):
            await run
        lease.release()
        holder.release()
        await until(lambda: gw.in_flight == 0, what="every lease released")
        assert (first.outstanding, second.outstanding) == (0, 0)
        assert [gw.scheduler(d).running_total for d in (first, second)] == [0, 0]
        assert [gw.scheduler(d).waiting_total for d in (first, second)] == [0, 0]
        row = next(r for r in usage_rows(gw) if r["request_id"] == call.request_id)
        assert (row["status"], row["tries"], row["failed_deployments"]) == (CLIENT_CLOSED, 2, "m-0")
    finally:
        await registry.close()
