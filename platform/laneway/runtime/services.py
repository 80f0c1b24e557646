"""The serving process's long-lived services, built once and owned by one typed object.

`Runtime.start()` brings them up in dependency order (database, engines, policies, rate
limits, usage recorder, the API key sweeps, shared slots, the gateway, the config listener,
the config poll) and `Runtime.stop()` takes them down in reverse: the requests still
running first, the database pool and the tracer last. A start that fails stops what had already started.

Handlers reach the services through Litestar's dependency injection (`RuntimePlugin` adds
the providers and the lifespan to the app), never picked off the app's state.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from litestar import Litestar
from litestar.di import Provide
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from laneway.admin.api import Logins
from laneway.admin.dependencies import QueueStats, RoutePlanner, RoutingFigures
from laneway.admin.guards import AdminGuards
from laneway.admin.live import LiveFigures
from laneway.admin.service import AdminService
from laneway.admin.throttle import LoginGuard
from laneway.api.batches.runner import BatchRunner
from laneway.api.batches.services import BatchServices
from laneway.api.services import ApiServices
from laneway.bootstrap import admin_password_file, bootstrap_admin, bootstrap_demo, bootstrap_first_admin
from laneway.core.auth import KeyAuthenticator
from laneway.core.config_watch import ConfigChanges
from laneway.core.dependencies import DependencyHealth
from laneway.core.dispatch import RoutingParams
from laneway.core.lane_caps import LaneCapLog, seats
from laneway.core.load_shedding import LoadShedder
from laneway.core.loop_lag import LoopLagMonitor
from laneway.core.pipeline import Gateway, RetryBudget
from laneway.core.policy import PolicyStore
from laneway.core.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter
from laneway.core.redis_hub import RedisHub
from laneway.core.shared_slots import SharedSlots
from laneway.db import migrate
from laneway.db.config_version import config_version
from laneway.db.repositories import ModelRepository
from laneway.db.session import make_engine, make_sessionmaker
from laneway.engines.registry import EngineRegistry
from laneway.metrics import GatewayMetrics
from laneway.runtime.batch_jobs import batch_services
from laneway.runtime.config_poll import ConfigPoll, enabled_deployments
from laneway.runtime.health_access import HealthDetailsAccess
from laneway.runtime.lifecycle import Lifecycle, cancelled
from laneway.runtime.readings import runtime_readings
from laneway.runtime.route_preview import RoutePlanner as Planner
from laneway.settings import Settings
from laneway.usage import UsageRecorder
from laneway.usage.budget_alerts import BudgetAlerts

if TYPE_CHECKING:
    from laneway.tracing.otel import Tracing

GC_YOUNG_OBJECTS = 10_000  # the collector's first threshold, once started (see Runtime.start)
log = logging.getLogger("laneway")


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
    config_poll: ConfigPoll
    admin: AdminService
    logins: Logins
    api: ApiServices
    batches: BatchServices
    batch_runner: BatchRunner | None  # None: this replica takes batches, others run them
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
        # Who sees /health/ready's details; the sessions are looked up per request (they exist
        # once start() has run).
        self.health_access = HealthDetailsAccess(settings.metrics_token, AdminGuards(lambda: self.sessions))

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
        # Read before what it versions: a change committed meanwhile is reloaded at the first poll.
        loaded_version = await config_version(db)
        async with sessions() as session:
            specs = await ModelRepository(session).enabled_deployments()
        self.registry = registry = EngineRegistry()
        steps.started_step("engines", registry.close)
        await registry.load(specs)
        # Warm up in the background: the server answers /health/live at once and
        # /health/ready turns 200 when every deployment is warm.
        warmup = asyncio.create_task(registry.warm_up(), name="warm-up")
        steps.started_step("warm-up", lambda: cancelled(warmup))
        self.policies = policies = PolicyStore(sessions)
        await policies.reload()
        self.lane_cap_log = lane_cap_log = LaneCapLog()
        lane_cap_log.check(policies.current.lanes, seats(registry))  # once at start, with the setting to change

        def check_lane_caps() -> None:
            lane_cap_log.check(policies.current.lanes, seats(registry))

        # One Redis hub for the limiter, the quota counters and the shared slots: one pipelined
        # connection, closed after all of them (docs/decisions/0002-redis-pipe.md).
        hub = None
        if settings.redis_url:
            hub = RedisHub(
                settings.redis_url, timeout_s=settings.redis_timeout_s, max_connections=settings.redis_max_connections
            )
        self.redis_hub = hub
        if hub is not None:
            steps.started_step("redis", hub.close)
        self.limiter = limiter = self._rate_limiter(hub)
        steps.started_step("rate limiter", limiter.close)
        await limiter.load_used(sessions)  # quotas count from the usage rows (Redis: a lost counter's)
        alerts = BudgetAlerts(
            self.metrics.budget_alerts,
            share=settings.budget_alert_share,
            currency=settings.currency,
            webhook_url=settings.budget_alert_webhook_url,
            timeout_s=settings.budget_alert_timeout_s,
        )
        steps.started_step("budget alerts", alerts.close)
        for each in (limiter, getattr(limiter, "fallback", limiter)):  # Redis's fallback alerts too
            each.alert, each.alert_share = alerts, settings.budget_alert_share
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
        shared_slots = self._shared_slots(hub)
        if shared_slots is not None:
            steps.started_step("shared slots", shared_slots.close)
            await shared_slots.start()
        self.gateway = gateway = Gateway(
            registry,
            policies,
            limiter,
            sinks=(recorder, self.metrics),
            default_max_tokens=settings.default_max_tokens,
            quantum=settings.scheduler_quantum,
            starvation_share=settings.lane_starvation_share,
            headroom=settings.scheduler_headroom_slots,
            background_reserve=settings.background_reserve_slots,
            shared_slots=shared_slots,
            max_tries=settings.failover_max_tries,
            retry_budget=RetryBudget(
                settings.retry_budget_ratio, settings.retry_budget_min, settings.retry_budget_window_s
            ),
            routing=settings.routing,
            routing_params=RoutingParams.from_settings(settings),
        )
        self.metrics.watch_queues(gateway.queue_stats)
        # Long ticks while no API request arrives and none is in flight; the shedder wakes it.
        self.loop_lag = loop_lag = LoopLagMonitor(
            on_sample=self.shedder.tick, busy=lambda: not self.shedder.quiet() or gateway.in_flight > 0
        )
        self.shedder.on_wake = loop_lag.wake
        await loop_lag.start()
        steps.started_step("loop lag", loop_lag.stop)
        self.metrics.watch(lambda: runtime_readings(gateway, health, recorder, loop_lag, self.shedder))
        self.live_figures = LiveFigures(self.metrics)

        async def reload_config() -> None:
            await policies.reload()
            await registry.sync(lambda: enabled_deployments(sessions))
            check_lane_caps()
            gateway.waiting.dispatch.kick()

        # A deployment that could not start is retried by every poll, whether or not the
        # configuration moved (an engine that was down comes up with no edit).
        self.config_poll = poll = ConfigPoll(
            lambda: config_version(db),
            reload_config,
            seen=loaded_version,
            unsettled=lambda: bool(registry.failed or registry.rejected),
        )

        async def apply_notified() -> None:  # NOTIFY covers tenants and keys too: not in the counter
            authenticator.invalidate()
            await poll.refresh(force=True)

        self.config_changes = changes = ConfigChanges(db, apply_notified)
        await changes.start()
        steps.started_step("config changes", changes.stop)

        def after_poll() -> None:
            check_lane_caps()  # an engine's sequence limit may be learnt after its start
            gateway.waiting.dispatch.kick()  # an ejected replica may be back

        every_s = settings.policy_poll_interval_s
        watcher = asyncio.create_task(poll.run(registry, every_s, health, after_tick=after_poll), name="config-poll")
        steps.started_step("config poll", lambda: cancelled(watcher))
        self.started_at = time.time()
        self.admin = AdminService(
            sessions,
            changes,
            authenticator=authenticator,
            policies=policies,
            registry=registry,
            currency=settings.currency,
        )
        self.logins = Logins(self.login_guard, sessions, settings.admin_cookie_secure, admin_password_file(settings))
        self.api = ApiServices(gateway, authenticator, settings.stream_send_timeout_s, self.started_at)
        self.batches, runner = batch_services(settings, sessions, self.api, registry)
        self.batch_runner = runner
        if runner is not None:
            await runner.start()
            steps.started_step("batch runner", runner.stop)  # after the requests drained: it writes their lines
            self.metrics.watch(runner.readings)
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
        # nearly empty). The price is longer young pauses; docs/decisions/0007-gc-threshold.md.
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

    def _rate_limiter(self, hub: RedisHub | None) -> RateLimiter:
        settings = self.settings
        if hub is None:
            return MemoryRateLimiter()
        return RedisRateLimiter(
            hub,
            settings.redis_prefix,
            failure_mode=settings.redis_failure_mode,
            share=settings.redis_admit_share,
            health=self.health,
        )

    def _shared_slots(self, hub: RedisHub | None) -> SharedSlots | None:
        if hub is None:
            return None
        settings = self.settings
        return SharedSlots(
            hub,
            settings.redis_prefix,
            lease_ttl_s=settings.slot_lease_ttl_s,
            health=self.health,
        )

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
        return self.gateway.waiting.dispatch.replica_figures

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
            "latency_figures": Provide(lambda: self.gateway.waiting.latency.readings, sync_to_thread=False),
            "route_planner": Provide(self.provide_route_planner, sync_to_thread=False),
            "details_allowed": Provide(self.health_access.details_allowed),
        }
