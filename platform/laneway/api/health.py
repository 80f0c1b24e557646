"""Liveness (the process answers), readiness (every enabled deployment is warm), metrics.

/metrics and the OpenAPI pages (/schema) need "Authorization: Bearer <metrics_token>" when
the setting metrics_token (LANEWAY_METRICS_TOKEN) is set; unset, they are open.

/health/ready answers every caller with its status (200, or 503 + Retry-After): what a load
balancer or Kubernetes needs. The details (aliases, deployments, warm, failed, ejected, with
reasons) name what runs and why it fails, so only a caller the runtime's `details_allowed`
admits gets them: the metrics token, or an admin session (runtime/health_access.py; this
layer does not know admin sessions)."""

from __future__ import annotations

import secrets

from litestar import MediaType, Response, get
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi import ResponseSpec
from litestar.types import Guard

from laneway.api.openapi import METRICS, METRICS_TOKEN
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import Gateway
from laneway.engines.readiness import readiness_details
from laneway.metrics import GatewayMetrics
from laneway.settings import Settings


def bearer_matches(connection: ASGIConnection, expected: str | None) -> bool:  # type: ignore[type-arg]
    """Whether the request carries "Authorization: Bearer <expected>" (never, with no token set)."""
    if not expected:
        return False
    scheme, _sep, given = connection.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(given.strip().encode(), expected.encode())


def metrics_token_guard(settings: Settings) -> Guard:
    """A guard: 401 (OpenAI's shape) without the bearer token, when one is configured."""

    # async: Litestar would run a sync guard in a worker thread.
    async def require_metrics_token(connection: ASGIConnection, _: BaseRouteHandler) -> None:  # type: ignore[type-arg]
        if settings.metrics_token and not bearer_matches(connection, settings.metrics_token):
            raise GatewayError(
                ErrorCode.INVALID_METRICS_TOKEN, "This endpoint needs 'Authorization: Bearer <metrics token>'."
            )

    return require_metrics_token


@get("/health/live", media_type=MediaType.JSON, sync_to_thread=False)
def live() -> dict[str, str]:
    return {"status": "live"}


@get(
    "/health/ready",
    media_type=MediaType.JSON,
    responses={
        503: ResponseSpec(
            dict[str, object],
            description="Not ready: warming up, a model failed, or draining.",
            generate_examples=False,
        )
    },
)
async def ready(
    gateway: NamedDependency[Gateway], details_allowed: NamedDependency[bool]
) -> Response[dict[str, object]]:
    """The status for every caller (a load balancer's probe); the details (aliases, deployments,
    warm, failed, ejected, with reasons) only with the metrics token or an admin session."""
    # details_allowed: the runtime's answer for this request (runtime/health_access.py).
    registry = gateway.registry
    ready = registry.ready and not gateway.draining
    body: dict[str, object] = {"status": "draining" if gateway.draining else "ready" if ready else "not_ready"}
    if details_allowed:
        body.update(readiness_details(registry))
    return Response(
        body,
        status_code=200 if ready else 503,
        media_type=MediaType.JSON,
        headers=None if ready else {"Retry-After": "1"},
    )


@get(
    "/metrics",
    media_type="text/plain; version=0.0.4; charset=utf-8",
    security=METRICS_TOKEN,
    operation_class=METRICS,
)
async def metrics(metrics: NamedDependency[GatewayMetrics]) -> Response[bytes]:
    """Behind metrics_token_guard (the app adds it: the token is a setting)."""
    return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")
