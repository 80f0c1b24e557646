"""create_app(settings) -> Litestar. The lifespan wires storage, engines, auth and accounting."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.logging.config import LoggingConfig
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.admin.api import SESSION_COOKIE, AdminAPI
from laneway.admin.headers import admin_security_headers
from laneway.admin.live import LiveFigures
from laneway.admin.throttle import LoginGuard
from laneway.admin.ui import AdminPages, AdminUI
from laneway.admin.usage_ui import UsagePages
from laneway.api.embeddings import EmbeddingsController
from laneway.api.errors import gateway_error_handler, http_exception_handler, internal_error_handler
from laneway.api.health import live, metrics, ready, require_metrics_token
from laneway.api.openapi import add_wire_schemas, openapi_config
from laneway.api.request_ids import stamp_request_id
from laneway.api.responses_api import ResponsesController
from laneway.api.routes import OpenAIController
from laneway.bootstrap import bootstrap_admin, bootstrap_demo, bootstrap_first_admin
from laneway.core.accounting import UsageRecorder
from laneway.core.auth import KeyAuthenticator
from laneway.core.config_watch import ConfigChanges
from laneway.core.dependencies import DependencyHealth, database_unreachable
from laneway.core.errors import GatewayError
from laneway.core.load_shedding import LoadShedder
from laneway.core.loop_lag import LoopLagMonitor
from laneway.core.pipeline import Gateway
from laneway.core.policy import PolicyStore
from laneway.core.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter
from laneway.core.shared_slots import SharedSlots
from laneway.db import migrate
from laneway.db.repositories import DeploymentSpec, ModelRepository
from laneway.db.session import make_engine, make_sessionmaker
from laneway.engines.llamacpp import LlamaCppEngine
from laneway.engines.registry import EngineRegistry
from laneway.metrics import GatewayMetrics, Reading
from laneway.resources import ADMIN_STATIC, ADMIN_TEMPLATES, package_dir
from laneway.settings import Settings
from laneway.tracing import build as build_tracing

log = logging.getLogger("laneway")


def create_app(settings: Settings | None = None) -> Litestar:
    settings = settings or Settings.from_env()
    shedder = LoadShedder(max_delay_s=settings.shed_loop_delay_s, max_preparing=settings.shed_max_preparing)
    # None when no OTLP endpoint is set: then no middleware, no SDK import, no span anywhere.
    tracing = build_tracing(settings)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        health = DependencyHealth()
        db = make_engine(
            settings.resolved_database_url,
            connect_timeout_s=settings.database_connect_timeout_s,
            command_timeout_s=settings.database_command_timeout_s,
        )
        sessions = make_sessionmaker(db)
        if settings.auto_migrate:
            await migrate.upgrade(db)
        if settings.bootstrap_demo:
            await bootstrap_demo(settings, sessions)
        if settings.admin_password:
            await bootstrap_admin(sessions, "admin", settings.admin_password)
        elif settings.bootstrap_demo:
            await bootstrap_first_admin(settings, sessions)
        async with sessions() as session:
            specs = await ModelRepository(session).enabled_deployments()
        registry = EngineRegistry()
        await registry.load(specs)
        # Warm up in the background: the server answers /health/live at once and
        # /health/ready turns 200 when every deployment is warm.
        warmup = asyncio.create_task(registry.warm_up(), name="warm-up")
        policies = PolicyStore(sessions)
        await policies.reload()
        await policies.start_polling(settings.policy_poll_interval_s, health)
        limiter: RateLimiter = (
            RedisRateLimiter(
                settings.redis_url,
                settings.redis_prefix,
                max_connections=settings.redis_max_connections,
                timeout_s=settings.redis_timeout_s,
                failure_mode=settings.redis_failure_mode,
                health=health,
            )
            if settings.redis_url
            else MemoryRateLimiter()
        )
        await limiter.load_used(sessions)  # quotas count from the usage rows (Redis: a lost counter's)
        recorder = UsageRecorder(
            sessions,
            interval_s=settings.usage_flush_interval_s,
            batch_size=settings.usage_batch_size,
            max_pending=settings.usage_max_pending,
            health=health,
            spool_dir=settings.data_dir / "usage-spool",
        )
        await recorder.start()
        authenticator = KeyAuthenticator(
            sessions,
            ttl_s=settings.auth_cache_ttl_s,
            stale_s=settings.auth_stale_s,
            lookup_timeout_s=settings.auth_lookup_timeout_s,
            health=health,
        )
        shared_slots = (
            SharedSlots(
                settings.redis_url,
                settings.redis_prefix,
                lease_ttl_s=settings.slot_lease_ttl_s,
                timeout_s=settings.redis_timeout_s,
                max_connections=settings.redis_max_connections,
                health=health,
            )
            if settings.redis_url
            else None
        )
        if shared_slots is not None:
            await shared_slots.start()
        gateway = Gateway(
            registry,
            recorder,
            policies,
            limiter,
            default_max_tokens=settings.default_max_tokens,
            quantum=settings.scheduler_quantum,
            starvation_share=settings.lane_starvation_share,
            headroom=settings.scheduler_headroom_slots,
            metrics=GatewayMetrics(tenant_label=settings.metrics_tenant_label),
            shared_slots=shared_slots,
        )
        loop_lag = LoopLagMonitor(on_sample=shedder.observe)
        await loop_lag.start()
        gateway.metrics.watch(lambda: runtime_readings(gateway, health, recorder, loop_lag, shedder))
        app.state.sessions = sessions
        app.state.recorder = recorder
        app.state.authenticator = authenticator
        app.state.policies = policies
        app.state.gateway = gateway
        app.state.live_figures = LiveFigures(gateway.metrics)  # the dashboard's window over the metrics
        app.state.health = health
        app.state.loop_lag = loop_lag
        app.state.started_at = time.time()

        async def drain() -> None:
            await gateway.drain(settings.drain_timeout_s)

        app.state.drain = drain

        async def apply_config() -> None:
            authenticator.invalidate()
            await policies.reload()
            await registry.sync(lambda: enabled_deployments(sessions))

        app.state.config_changes = ConfigChanges(db, apply_config)
        await app.state.config_changes.start()
        # What start-up allocated lives as long as the process: keep it out of the collector's
        # scans, so a full collection under load pauses the loop for less (load shedding reads
        # those pauses as saturation).
        gc.collect()
        gc.freeze()
        watcher = asyncio.create_task(
            _watch_engines(registry, sessions, settings.policy_poll_interval_s, health), name="engine-watch"
        )
        try:
            yield
        finally:
            watcher.cancel()
            await gateway.drain(0)  # whatever the server left running (a drain already ran on SIGTERM)
            await app.state.config_changes.stop()
            warmup.cancel()
            await policies.stop()
            await recorder.stop()
            await limiter.close()
            if shared_slots is not None:
                await shared_slots.close()
            await registry.close()
            await loop_lag.stop()
            await db.dispose()
            if tracing is not None:
                await tracing.stop()  # last: the drained requests' spans are flushed too

    app = Litestar(
        route_handlers=[
            OpenAIController,
            EmbeddingsController,
            ResponsesController,
            AdminAPI,
            AdminUI,
            AdminPages,
            UsagePages,
            create_static_files_router(path="/admin/static", directories=[package_dir(ADMIN_STATIC)]),
            live,
            ready,
            metrics,
        ],
        template_config=TemplateConfig(directory=package_dir(ADMIN_TEMPLATES), engine=JinjaTemplateEngine),
        lifespan=[lifespan],
        # Admin logins: a throttle and a bounded argon2 pool (closed at shutdown).
        state=State(
            {"settings": settings, "shedder": shedder, "login_guard": (login_guard := LoginGuard()), "tracing": tracing}
        ),
        middleware=[tracing.middleware()] if tracing is not None else [],
        on_shutdown=[login_guard.close],
        # X-Request-Id on every response; security headers on every /admin response; /metrics
        # and /schema behind metrics_token.
        before_send=[stamp_request_id, admin_security_headers],
        openapi_config=openapi_config(session_cookie=SESSION_COOKIE, guards=[require_metrics_token]),
        # Litestar configures the root logger: at the gateway's level, not always INFO.
        logging_config=LoggingConfig(root={"level": settings.log_level.upper(), "handlers": ["queue_listener"]}),
        exception_handlers={
            GatewayError: gateway_error_handler,
            HTTPException: http_exception_handler,
            Exception: internal_error_handler,
        },
        debug=False,
    )
    add_wire_schemas(app)
    return app


async def enabled_deployments(sessions: async_sessionmaker[AsyncSession]) -> list[DeploymentSpec]:
    async with sessions() as session:
        return await ModelRepository(session).enabled_deployments()


async def _watch_engines(
    registry: EngineRegistry, sessions: async_sessionmaker[AsyncSession], every_s: float, health: DependencyHealth
) -> None:
    """Live engine changes and health: apply deployment edits from the database (a model
    alias swapped to another engine, with no restart) and re-check ejected deployments."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await registry.sync(lambda: enabled_deployments(sessions))
        except Exception as exc:
            if database_unreachable(exc):  # an outage: the running engines stay; a line a minute
                health.failed("database", exc, "keeping the running engines")
            else:
                log.exception("engine sync failed; will retry")
        try:
            await registry.check_health()  # needs no database: runs through an outage too
        except Exception:
            log.exception("engine health check failed; will retry")


def runtime_readings(
    gateway: Gateway,
    health: DependencyHealth,
    recorder: UsageRecorder,
    loop_lag: LoopLagMonitor,
    shedder: LoadShedder,
) -> list[Reading]:
    """Leases and engine slots held (a leak shows here), dependency faults, the usage backlog
    and the event loop's lag, read at scrape time."""
    limiter = gateway.limiter
    out: list[Reading] = [
        ("laneway_leases_in_flight", "Requests holding a lease (queued or running).", "gauge", {},
         gateway.in_flight),
        ("laneway_leases_opened_total", "Leases opened; each leaves one usage row when released.", "counter", {},
         gateway.leases_opened),
        ("laneway_event_loop_lag_seconds", "How late the event loop ran its last 50 ms timer.", "gauge", {},
         loop_lag.last_s),
        ("laneway_event_loop_lag_max_seconds", "The worst event-loop lag over the last minute.", "gauge", {},
         max(loop_lag.samples, default=0.0)),
        ("laneway_api_requests_preparing", "API requests between their headers and an engine's queue.", "gauge",
         {}, shedder.preparing),
    ]  # fmt: skip
    for reason, n in shedder.shed_by.items():
        out.append(("laneway_shed_total", "Requests refused with 503 overloaded before any work: too many "
                    "being prepared (backlog) or the loop ran behind (loop_lag).", "counter", {"reason": reason},
                    n))  # fmt: skip
    for dep in sorted(set(health.errors) | set(health.degraded)):
        labels = {"dependency": dep}
        out.append(("laneway_dependency_errors_total", "Faults of a dependency (Redis, the database).",
                    "counter", labels, health.errors[dep]))  # fmt: skip
        out.append(("laneway_dependency_degraded", "1 while the gateway works around a dependency's fault.",
                    "gauge", labels, float(health.degraded.get(dep, False))))  # fmt: skip
    out.append(("laneway_usage_rows_pending", "Usage rows waiting to be written.", "gauge", {}, recorder.pending))
    out.append(("laneway_usage_rows_written_total", "Usage rows written.", "counter", {}, recorder.written))
    for reason, n in (("overflow", recorder.dropped), ("rejected", recorder.rejected)):
        out.append(("laneway_usage_rows_lost_total", "Usage rows dropped (backlog overflow) or refused by the "
                    "database.", "counter", {"reason": reason}, n))  # fmt: skip
    for d in gateway.registry.deployments():
        out.append(("laneway_engine_active_slots", "Sequences holding a slot inside the engine adapter.", "gauge",
                    {"deployment": d.spec.name}, d.engine.active_slots))  # fmt: skip
        if isinstance(d.engine, LlamaCppEngine) and d.engine.system_prompts:
            out.append(("laneway_engine_prefix_hits_total", "Requests that started from a warmed system prompt's "
                        "KV cells.", "counter", {"deployment": d.spec.name}, d.engine.prefix_hits))  # fmt: skip
            out.append(("laneway_engine_prefix_tokens_reused_total", "Prompt tokens copied from warmed system "
                        "prompts' KV cells instead of computed.", "counter", {"deployment": d.spec.name},
                        d.engine.prefix_tokens_reused))  # fmt: skip
    local = getattr(limiter, "fallback", limiter)
    if isinstance(local, MemoryRateLimiter):
        out.append(("laneway_ratelimit_local_holders", "Concurrency holders kept in this process's memory.", "gauge",
                    {}, local.holders))  # fmt: skip
    pending_settles = getattr(limiter, "pending_settles", None)
    if pending_settles is not None:
        out.append(("laneway_ratelimit_settles_pending", "Rate-limit settles not yet sent to Redis.", "gauge", {},
                    pending_settles))  # fmt: skip
    return out
