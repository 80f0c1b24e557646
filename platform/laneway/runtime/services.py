"""The serving process's long-lived services, built once and owned by one typed object.

`Runtime.start()` runs the start steps (steps.py: one named step per service, in
dependency order: database, engines, policies, rate limits, usage recorder, the API key
sweeps, shared slots, the gateway, the config listener, the config poll, ...) and
`Runtime.stop()` takes them down in reverse: the requests still running first, the database
pool and the tracer last. A start that fails stops what had already started.

Handlers reach the services through Litestar's dependency injection (`RuntimePlugin` adds
the providers and the lifespan to the app), never picked off the app's state.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from litestar import Litestar
from litestar.di import Provide

from laneway.admin.api import Logins
from laneway.admin.dependencies import LatencyFigures, QueueStats, RoutePlanner, RoutingFigures, SwapFigures
from laneway.admin.guards import AdminGuards
from laneway.admin.live import LiveFigures
from laneway.admin.service import AdminService
from laneway.admin.throttle import LoginGuard
from laneway.api.batches.services import BatchServices
from laneway.api.services import ApiServices
from laneway.core.dependencies import DependencyHealth
from laneway.core.load_shedding import LoadShedder
from laneway.core.pipeline import Gateway
from laneway.core.ratelimit import RateLimiter
from laneway.engines.registry import EngineRegistry
from laneway.metrics import GatewayMetrics
from laneway.runtime.health_access import HealthDetailsAccess
from laneway.runtime.lifecycle import Lifecycle
from laneway.runtime.route_preview import RoutePlanner as Planner
from laneway.runtime.steps import StartSteps
from laneway.settings import Settings

if TYPE_CHECKING:
    from laneway.tracing.otel import Tracing

GC_YOUNG_OBJECTS = 10_000  # the collector's first threshold, once started (see settle_memory)
log = logging.getLogger("laneway")


def settle_memory() -> None:
    """What start-up allocated lives as long as the process: keep it out of the collector's
    scans, so a full collection under load pauses the loop for less (load shedding reads those
    pauses as saturation). A young generation of 10,000 objects, not 700: a request's objects
    then mostly die before any collection sees them, instead of being scanned, promoted and
    scanned again (and counted toward full collections, frequent once freeze() left the old
    generation nearly empty). The price is longer young pauses; docs/decisions/0007-gc-threshold.md."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_OBJECTS, 10, 10)


class Runtime(StartSteps):
    """Every long-lived service of one serving process. The attributes StartSteps declares
    exist once `start()` has returned; handlers only run after that (the lifespan awaits it)."""

    def __init__(self, settings: Settings, *, tracing: Tracing | None = None) -> None:
        self.settings = settings
        self.tracing = tracing  # None when no OTLP endpoint is set
        self.shedder = LoadShedder(
            max_delay_s=settings.shed_loop_delay_s,
            max_preparing=settings.shed_max_preparing,
            standing_preparing=settings.shed_standing_preparing,
            standing_s=settings.shed_standing_s,
            cpu_target=settings.shed_cpu_target,
        )
        # Before start: refusals are counted from the first request, and the error handlers
        # hold this object, not the gateway.
        self.metrics = GatewayMetrics(tenant_label=settings.metrics_tenant_label)
        # Admin logins: a throttle and a bounded argon2 pool.
        self.login_guard = LoginGuard()
        self.health = DependencyHealth()
        self.lifecycle = Lifecycle()
        self.running = False
        # Where no step sets them (no Redis, no batch runner on this replica):
        self.redis_hub, self.shared_slots, self.batch_runner = None, None, None
        # Who sees /health/ready's details; the sessions are looked up per request (they exist
        # once start() has run).
        self.health_access = HealthDetailsAccess(settings.metrics_token, AdminGuards(lambda: self.sessions))

    async def start(self) -> None:
        """The start steps (steps.py) in order; one that fails stops those that had started."""
        await self.lifecycle.start(self.start_steps())
        settle_memory()
        self.running = True

    async def stop(self) -> None:
        self.running = False
        await self.lifecycle.stop()

    async def drain(self) -> None:
        """Finish or cut what runs, within drain_timeout_s (the server's first SIGTERM); batch
        lines stop being claimed first, so those running drain with the rest."""
        if self.batch_runner is not None:
            self.batch_runner.stop_claiming()
        await self.gateway.drain(self.settings.drain_timeout_s)

    @asynccontextmanager
    async def lifespan(self, _: Litestar) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    # ---- providers: sync, returning what start() built (no thread, no await) ----
    def provide_api(self) -> ApiServices:
        return self.api

    def provide_batch_api(self) -> BatchServices:
        return self.batches

    def provide_gateway(self) -> Gateway:
        return self.gateway

    def provide_metrics(self) -> GatewayMetrics:
        return self.metrics

    def provide_admin_service(self) -> AdminService:
        return self.admin

    def provide_live_figures(self) -> LiveFigures:
        return self.live_figures

    def provide_logins(self) -> Logins:
        return self.logins

    def provide_limiter(self) -> RateLimiter:
        return self.limiter

    def provide_registry(self) -> EngineRegistry:
        return self.registry

    def provide_queue_stats(self) -> QueueStats:
        return self.gateway.queue_stats

    def provide_routing_figures(self) -> RoutingFigures:
        return self.gateway.replica_figures

    def provide_latency_figures(self) -> LatencyFigures:
        return self.gateway.latency_readings

    def provide_swap_figures(self) -> SwapFigures:
        return self.gateway.swaps.compare

    def provide_route_planner(self) -> RoutePlanner:
        return Planner(self.gateway)

    def dependencies(self) -> dict[str, Provide]:
        """The app-level providers; a handler gets the ones it names as parameters."""
        return {
            "api": Provide(self.provide_api, sync_to_thread=False),
            "batch_api": Provide(self.provide_batch_api, sync_to_thread=False),
            "gateway": Provide(self.provide_gateway, sync_to_thread=False),
            "metrics": Provide(self.provide_metrics, sync_to_thread=False),
            "admin_service": Provide(self.provide_admin_service, sync_to_thread=False),
            "live": Provide(self.provide_live_figures, sync_to_thread=False),
            "logins": Provide(self.provide_logins, sync_to_thread=False),
            "limiter": Provide(self.provide_limiter, sync_to_thread=False),
            "registry": Provide(self.provide_registry, sync_to_thread=False),
            "queue_stats": Provide(self.provide_queue_stats, sync_to_thread=False),
            "routing_figures": Provide(self.provide_routing_figures, sync_to_thread=False),
            "latency_figures": Provide(self.provide_latency_figures, sync_to_thread=False),
            "route_planner": Provide(self.provide_route_planner, sync_to_thread=False),
            "swap_figures": Provide(self.provide_swap_figures, sync_to_thread=False),
            "details_allowed": Provide(self.health_access.details_allowed),
        }
