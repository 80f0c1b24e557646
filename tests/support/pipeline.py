"""A prepared request run whole through a Gateway in the test's own process (no HTTP):
admitted, generated to its end, its lease released, as the API's handlers do."""

from __future__ import annotations

from laneway.core.pipeline import Call, Gateway


async def run_admitted(gw: Gateway, call: Call) -> None:
    """Admit a prepared call and generate it to its end; the lease is released either way."""
    lease = await gw.admit(call)
    try:
        async for _ in gw.run(lease):
            pass
    finally:
        lease.release()
