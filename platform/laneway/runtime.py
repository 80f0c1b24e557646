"""The serving process's long-lived services, built once and owned by one typed object.

`Runtime.start()` brings them up in dependency order (database, engines, policies, rate
limits, usage recorder, the API key sweeps, shared slots, the gateway, the config listener,
the engine watcher) and `Runtime.stop()` takes them down in reverse: the requests still
running first, the database pool and the tracer last. A start that fails stops what had already started.

Handlers reach the services through Litestar's dependency injection (`RuntimePlugin` adds
the providers and the lifespan to the app), never picked off the app's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from litestar import Litestar
from litestar.config.app import AppConfig
from litestar.di import Provide
from litestar.plugins import InitPluginProtocol
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from laneway.admin.api import Logins
from laneway.admin.live import LiveFigures
from laneway.admin.service import AdminService
from laneway.admin.throttle import LoginGuard
from laneway.api.services import ApiServices
from laneway.bootstrap import admin_password_file, bootstrap_admin, bootstrap_demo, bootstrap_first_admin
from laneway.core.accounting import UsageRecorder
from laneway.core.auth import KeyAuthenticator
from laneway.core.config_watch import ConfigChanges
from laneway.core.dependencies import DependencyHealth, database_unreachable
from laneway.core.load_shedding import LoadShedder
from laneway.core.loop_lag import LoopLagMonitor
from laneway.core.pipeline import Gateway
from laneway.core.policy import PolicyStore
from laneway.core.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter
from laneway.core.shared_slots import SharedSlots
from laneway.db import migrate
from laneway.db.repositories import DeploymentSpec, ModelRepository
from laneway.db.session import make_engine, make_sessionmaker
from laneway.engines.base import PrefixReusingEngine
from laneway.engines.registry import EngineRegistry
from laneway.metrics import GatewayMetrics, Reading
from laneway.settings import Settings

if TYPE_CHECKING:
    from laneway.tracing.otel import Tracing

GC_YOUNG_OBJECTS = 10_000  # the collector's first threshold, once started (see Runtime.start)
log = logging.getLogger("laneway")

Stop = Callable[[], Awaitable[object]]


class Lifecycle:
    """Named steps, stopped in the reverse of the order they started. One stop that fails is
    logged and the others still run: a flaky Redis at shutdown must not leave the usage
    rows unflushed or the database pool open."""

    def __init__(self) -> None:
        self._stops: list[tuple[str, Stop]] = []
        self.started: list[str] = []  # in order, for logs and tests
        self.stopped: list[str] = []

    def started_step(self, name: str, stop: Stop | None = None) -> None:
        self.started.append(name)
        if stop is not None:
            self._stops.append((name, stop))

    async def stop(self) -> None:
        while self._stops:
            name, stop = self._stops.pop()
            try:
                await stop()
            except Exception:
                log.exception("stopping %s failed; stopping the rest", name)
            self.stopped.append(name)


async def _cancelled(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class Runtime:
    """Every long-lived service of one serving process. The attributes below `start()` sets
    exist once it has returned; handlers only run after that (the lifespan awaits it)."""

    sessions: async_sessionmaker[AsyncSession]
    health: DependencyHealth
    registry: EngineRegistry
    policies: PolicyStore
    limiter: RateLimiter
    recorder: UsageRecorder
    authenticator: KeyAuthenticator
    gateway: Gateway
    loop_lag: LoopLagMonitor
    live_figures: LiveFigures  # the dashboard's window over the metrics
    config_changes: ConfigChanges
    admin: AdminService
    logins: Logins
    api: ApiServices
    started_at: float

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
        self.lifecycle = Lifecycle()
        self.running = False

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.lifecycle.stop()
            raise
        self.running = True

    async def stop(self) -> None:
        self.running = False
        await self.lifecycle.stop()

    async def drain(self) -> None:
        """Finish or cut what runs, within drain_timeout_s (the server's first SIGTERM)."""
        await self.gateway.drain(self.settings.drain_timeout_s)

    @asynccontextmanager
    async def lifespan(self, _: Litestar) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    async def _start(self) -> None:
        settings, steps = self.settings, self.lifecycle
        if self.tracing is not None:
            steps.started_step("tracing", self.tracing.stop)  # last to stop: the drained requests' spans too
        steps.started_step("login guard", self.login_guard.close)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.health = health = DependencyHealth()
        db = make_engine(
            settings.resolved_database_url,
            connect_timeout_s=settings.database_connect_timeout_s,
            command_timeout_s=settings.database_command_timeout_s,
        )
        steps.started_step("database", db.dispose)
        self.sessions = sessions = make_sessionmaker(db)
        await self._prepare_database(db)
        async with sessions() as session:
            specs = await ModelRepository(session).enabled_deployments()
        self.registry = registry = EngineRegistry()
        steps.started_step("engines", registry.close)
        await registry.load(specs)
        # Warm up in the background: the server answers /health/live at once and
        # /health/ready turns 200 when every deployment is warm.
        warmup = asyncio.create_task(registry.warm_up(), name="warm-up")
        steps.started_step("warm-up", lambda: _cancelled(warmup))
        self.policies = policies = PolicyStore(sessions)
        steps.started_step("policies", policies.stop)
        await policies.reload()
        await policies.start_polling(settings.policy_poll_interval_s, health)
        self.limiter = limiter = self._rate_limiter()
        steps.started_step("rate limiter", limiter.close)
        await limiter.load_used(sessions)  # quotas count from the usage rows (Redis: a lost counter's)
        self.recorder = recorder = UsageRecorder(
            sessions,
            interval_s=settings.usage_flush_interval_s,
            batch_size=settings.usage_batch_size,
            max_pending=settings.usage_max_pending,
            health=health,
            spool_dir=settings.data_dir / "usage-spool",
        )
        await recorder.start()
        steps.started_step("usage recorder", recorder.stop)  # flushes what it holds
        self.authenticator = authenticator = KeyAuthenticator(
            sessions,
            ttl_s=settings.auth_cache_ttl_s,
            stale_s=settings.auth_stale_s,
            lookup_timeout_s=settings.auth_lookup_timeout_s,
            keep_warm_s=settings.auth_keep_warm_s,
            health=health,
        )
        steps.started_step("auth sweeps", authenticator.close)
        shared_slots = self._shared_slots()
        if shared_slots is not None:
            steps.started_step("shared slots", shared_slots.close)
            await shared_slots.start()
        self.gateway = gateway = Gateway(
            registry,
            recorder,
            policies,
            limiter,
            default_max_tokens=settings.default_max_tokens,
            quantum=settings.scheduler_quantum,
            starvation_share=settings.lane_starvation_share,
            headroom=settings.scheduler_headroom_slots,
            metrics=self.metrics,
            shared_slots=shared_slots,
        )
        # Long ticks while no API request arrives and none is in flight; the shedder wakes it.
        self.loop_lag = loop_lag = LoopLagMonitor(
            on_sample=self.shedder.tick, busy=lambda: not self.shedder.quiet() or gateway.in_flight > 0
        )
        self.shedder.on_wake = loop_lag.wake
        await loop_lag.start()
        steps.started_step("loop lag", loop_lag.stop)
        self.metrics.watch(lambda: runtime_readings(gateway, health, recorder, loop_lag, self.shedder))
        self.live_figures = LiveFigures(self.metrics)

        async def apply_config() -> None:
            authenticator.invalidate()
            await policies.reload()
            await registry.sync(lambda: enabled_deployments(sessions))

        self.config_changes = changes = ConfigChanges(db, apply_config)
        await changes.start()
        steps.started_step("config changes", changes.stop)
        watcher = asyncio.create_task(
            _watch_engines(registry, sessions, settings.policy_poll_interval_s, health), name="engine-watch"
        )
        steps.started_step("engine watch", lambda: _cancelled(watcher))
        self.started_at = time.time()
        self.admin = AdminService(sessions, changes, authenticator=authenticator, policies=policies, registry=registry)
        self.logins = Logins(self.login_guard, sessions, settings.admin_cookie_secure, admin_password_file(settings))
        self.api = ApiServices(gateway, authenticator, settings.stream_send_timeout_s, self.started_at)
        # First to stop: whatever the server left running (a drain already ran on SIGTERM).
        steps.started_step("requests", lambda: gateway.drain(0))
        # What start-up allocated lives as long as the process: keep it out of the collector's
        # scans, so a full collection under load pauses the loop for less (load shedding reads
        # those pauses as saturation).
        gc.collect()
        gc.freeze()
        # A young generation of 10,000 objects, not 700: a request's objects then mostly die
        # before any collection sees them, instead of being scanned, promoted and scanned again
        # (and counted toward full collections, frequent once freeze() left the old generation
        # nearly empty). Measured (bench/overhead.py rows with gc callbacks, 700 / 2,000 /
        # 5,000 / 10,000): 12 / 0 / 0 / 0 full collections of ~13 ms under load, 0.50 / 0.11 /
        # 0.08 / 0.08 s of collecting in all, 5x goodput 0.80-0.84 / 0.90-0.91 / 0.90-0.97 /
        # 0.96 of capacity; the price is longer pauses, young 1.8 / 3.1 / 4.1 / 5.4 ms and
        # middle 1.2 / 3.1 / 5.5 / 12.6 ms at most (at 5x), with 100/s streams' p99 unchanged.
        gc.set_threshold(GC_YOUNG_OBJECTS, 10, 10)

    async def _prepare_database(self, db: AsyncEngine) -> None:
        """Migrations, the demo, the first admin (its password written once to the data dir)."""
        settings, sessions = self.settings, self.sessions
        if settings.auto_migrate:
            await migrate.upgrade(db)
        if settings.bootstrap_demo:
            await bootstrap_demo(settings, sessions)
        if settings.admin_password:
            await bootstrap_admin(sessions, "admin", settings.admin_password)
        elif settings.bootstrap_demo:
            await bootstrap_first_admin(settings, sessions)

    def _rate_limiter(self) -> RateLimiter:
        settings = self.settings
        if not settings.redis_url:
            return MemoryRateLimiter()
        return RedisRateLimiter(
            settings.redis_url,
            settings.redis_prefix,
            max_connections=settings.redis_max_connections,
            timeout_s=settings.redis_timeout_s,
            failure_mode=settings.redis_failure_mode,
            share=settings.redis_admit_share,
            health=self.health,
        )

    def _shared_slots(self) -> SharedSlots | None:
        settings = self.settings
        if not settings.redis_url:
            return None
        return SharedSlots(
            settings.redis_url,
            settings.redis_prefix,
            lease_ttl_s=settings.slot_lease_ttl_s,
            timeout_s=settings.redis_timeout_s,
            max_connections=settings.redis_max_connections,
            health=self.health,
        )

    # ---- providers: sync, returning what start() built (no thread, no await) ----
    def provide_api(self) -> ApiServices:
        return self.api

    def provide_gateway(self) -> Gateway:
        return self.gateway

    def provide_admin_service(self) -> AdminService:
        return self.admin

    def provide_live_figures(self) -> LiveFigures:
        return self.live_figures

    def provide_logins(self) -> Logins:
        return self.logins

    def dependencies(self) -> dict[str, Provide]:
        """The app-level providers; a handler gets the ones it names as parameters."""
        return {
            "api": Provide(self.provide_api, sync_to_thread=False),
            "gateway": Provide(self.provide_gateway, sync_to_thread=False),
            "admin_service": Provide(self.provide_admin_service, sync_to_thread=False),
            "live": Provide(self.provide_live_figures, sync_to_thread=False),
            "logins": Provide(self.provide_logins, sync_to_thread=False),
        }


class RuntimePlugin(InitPluginProtocol):
    """Wires a Runtime into the app: its start and stop as the lifespan, its services as
    dependencies. `runtime_of(app)` finds it again (the server's drain, tests, benchmarks)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        app_config.lifespan = [self.runtime.lifespan, *app_config.lifespan]
        app_config.dependencies = {**self.runtime.dependencies(), **app_config.dependencies}
        return app_config


def runtime_of(app: Any) -> Runtime | None:
    """The Runtime of a laneway app; None for any other ASGI app (a test's stand-in engine)."""
    plugins = getattr(app, "plugins", None)
    if plugins is None:
        return None
    for plugin in plugins.init:
        if isinstance(plugin, RuntimePlugin):
            return plugin.runtime
    return None


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
        ("laneway_event_loop_busy_ratio", "Share of the last ticks the event loop's thread spent on the CPU.",
         "gauge", {}, shedder.busy),
        ("laneway_api_admit_ratio", "Share of new API requests let in by the CPU load shedder (1: all).", "gauge",
         {}, shedder.admit),
    ]  # fmt: skip
    for reason, n in shedder.shed_by.items():
        out.append(("laneway_shed_total", "Requests refused with 503 overloaded before any work: the loop "
                    "over its CPU target (cpu), too many being prepared (backlog) or the loop behind "
                    "(loop_lag).", "counter", {"reason": reason},
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
        if isinstance(d.engine, PrefixReusingEngine) and d.engine.system_prompts:
            out.append(("laneway_engine_prefix_hits_total", "Requests that started from a warmed system prompt's "
                        "KV cells.", "counter", {"deployment": d.spec.name}, d.engine.prefix_hits))  # fmt: skip
            out.append(("laneway_engine_prefix_tokens_reused_total", "Prompt tokens copied from warmed system "
                        "prompts' KV cells instead of computed.", "counter", {"deployment": d.spec.name},
                        d.engine.prefix_tokens_reused))  # fmt: skip
    local = getattr(limiter, "fallback", limiter)
    if isinstance(local, MemoryRateLimiter):
        out.append(("laneway_ratelimit_local_holders", "Concurrency holders kept in this process's memory.", "gauge",
                    {}, local.holders))  # fmt: skip
    if isinstance(limiter, RedisRateLimiter):
        out.append(("laneway_ratelimit_settles_pending", "Rate-limit settles not yet sent to Redis.", "gauge", {},
                    limiter.pending_settles))  # fmt: skip
        for by, n in (("replica", limiter.admitted_at_once), ("redis", limiter.decided_by_redis)):
            out.append(("laneway_ratelimit_decisions_total", "Rate-limit decisions taken with Redis limits: by "
                        "this replica on Redis's last answer (far from every limit), or by Redis itself.",
                        "counter", {"by": by}, n))  # fmt: skip
    return out
