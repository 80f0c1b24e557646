"""A prepared request run whole through a Gateway in the test's own process (no HTTP):
admitted, generated to its end, its lease released, as the API's handlers do."""

from __future__ import annotations

from laneway.core.pipeline import Call, Gateway, GenerationIntent
from laneway.types import Delta, TenantSnapshot

from support.waiting import until


async def run_admitted(gw: Gateway, call: Call) -> None:
    """Admit a prepared call and generate it to its end; the lease is released either way."""
    lease = await gw.admit(call)
    try:
        async for _ in gw.run(lease):
            pass
    finally:
        lease.release()


async def run_collected(gw: Gateway, tenant: TenantSnapshot, intent: GenerationIntent) -> tuple[Call, list[Delta]]:
    """Prepare, admit and run a request to its end: its Call and every delta it produced; the
    lease is released either way, and every lease of the gateway is by the time it returns."""
    call = await gw.prepare(tenant, intent)
    lease = await gw.admit(call)
    try:
        deltas = [d async for d in gw.run(lease)]
    finally:
        lease.release()
    await until(lambda: gw.in_flight == 0, what="every lease released")
    return call, deltas
