"""Liveness (the process answers), readiness (every enabled deployment is warm), metrics."""

from __future__ import annotations

from litestar import MediaType, Request, Response, get


@get("/health/live", media_type=MediaType.JSON, sync_to_thread=False)
def live() -> dict[str, str]:
    return {"status": "live"}


@get("/health/ready", media_type=MediaType.JSON)
async def ready(request: Request) -> Response[dict[str, object]]:  # type: ignore[type-arg]
    gateway = request.app.state.gateway
    registry = gateway.registry
    ready = registry.ready and not gateway.draining
    body: dict[str, object] = {
        "status": "draining" if gateway.draining else "ready" if ready else "not_ready",
        "models": registry.aliases(),
        "warm": sorted(registry.warm),
        "failed": registry.failed,
        "rejected_changes": registry.rejected,
    }
    return Response(
        body,
        status_code=200 if ready else 503,
        media_type=MediaType.JSON,
        headers=None if ready else {"Retry-After": "1"},
    )


@get("/metrics", media_type="text/plain; version=0.0.4; charset=utf-8")
async def metrics(request: Request) -> Response[bytes]:  # type: ignore[type-arg]
    return Response(request.app.state.gateway.metrics.exposition(), media_type="text/plain; version=0.0.4")
