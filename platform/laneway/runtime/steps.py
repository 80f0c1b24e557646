"""How a Runtime starts: one named step per service, in dependency order (`start_steps`).

Each step starts one service and returns how to stop it (None: nothing to stop), or raises
having left nothing of its own running; Lifecycle.start runs them in order and, when one
raises, stops what had started, in reverse. Steps hand each other what they built through
the Runtime's attributes (services.py declares which exist once start() has returned).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from laneway.admin import deployment_roles
from laneway.admin.api import Logins
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
from laneway.core.lane_caps import LaneCapLog, seats
from laneway.core.load_shedding import LoadShedder
from laneway.core.loop_lag import LoopLagMonitor
from laneway.core.pipeline import Gateway, GatewayConfig
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
from laneway.runtime.lifecycle import Lifecycle, Start, Stop, cancelled
from laneway.runtime.readings import runtime_readings
from laneway.settings import Settings
from laneway.usage import UsageRecorder
from laneway.usage.budget_alerts import BudgetAlerts
from laneway.usage.maintenance import UsageMaintenance

if TYPE_CHECKING:
    from laneway.tracing.otel import Tracing


class StartSteps:
    """The Runtime's start steps (Runtime, services.py, is this plus its providers)."""

    # Set by __init__ (services.py):
    settings: Settings
    tracing: Tracing | None
    metrics: GatewayMetrics
    shedder: LoadShedder
    login_guard: LoginGuard
    lifecycle: Lifecycle
    health: DependencyHealth
    # Set by the steps:
    sessions: async_sessionmaker[AsyncSession]
    registry: EngineRegistry
    policies: PolicyStore
    lane_cap_log: LaneCapLog
    redis_hub: RedisHub | None
    limiter: RateLimiter
    recorder: UsageRecorder
    alerts: BudgetAlerts  # the budget webhook's channel (canary rollbacks use it too)
    authenticator: KeyAuthenticator
    shared_slots: SharedSlots | None
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
    _db: AsyncEngine
    _loaded_version: int

    def start_steps(self) -> list[tuple[str, Start]]:
        """The services in dependency order, each with its name (logs and tests read them)."""
        settings = self.settings
        steps: list[tuple[str, Start, bool]] = [
            # First to start, last to stop: the drained requests' spans too.
            ("tracing", self._start_tracing, self.tracing is not None),
            ("login guard", self._start_login_guard, True),
            ("database", self._start_database, True),
            ("engines", self._start_engines, True),
            ("warm-up", self._start_warm_up, True),
            ("policies", self._start_policies, True),
            # One Redis hub for the limiter, the quota counters and the shared slots: one
            # pipelined connection, closed after all of them (docs/decisions/0002-redis-pipe.md).
            ("redis", self._start_redis, bool(settings.redis_url)),
            ("rate limiter", self._start_rate_limiter, True),
            ("budget alerts", self._start_budget_alerts, True),
            ("usage recorder", self._start_usage_recorder, True),
            ("auth sweeps", self._start_auth_sweeps, True),
            ("shared slots", self._start_shared_slots, bool(settings.redis_url)),
            ("gateway", self._start_gateway, True),
            ("loop lag", self._start_loop_lag, True),
            ("config changes", self._start_config_changes, True),
            ("config poll", self._start_config_poll, True),
            ("admin and api", self._start_admin_and_api, True),
            # Stopped after the requests drained: it writes their lines.
            ("batch runner", self._start_batch_runner, settings.batch_runner),
            # First to stop: whatever the server left running (a drain already ran on SIGTERM).
            ("requests", self._start_requests, True),
        ]
        return [(name, start) for name, start, wanted in steps if wanted]

    async def _start_tracing(self) -> Stop:
        assert self.tracing is not None
        return self.tracing.stop

    async def _start_login_guard(self) -> Stop:
        return self.login_guard.close

    async def _start_database(self) -> Stop:
        """The pool, then migrations, the demo and the first admin (its password written once
        to the data dir)."""
        settings = self.settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        self._db = db = make_engine(
            settings.resolved_database_url,
            connect_timeout_s=settings.database_connect_timeout_s,
            command_timeout_s=settings.database_command_timeout_s,
        )
        self.sessions = sessions = make_sessionmaker(db)
        try:
            if settings.auto_migrate:
                await migrate.upgrade(db)
            if settings.bootstrap_demo:
                await bootstrap_demo(settings, sessions)
            if settings.admin_password:
                await bootstrap_admin(sessions, "admin", settings.admin_password)
            elif settings.bootstrap_demo:
                await bootstrap_first_admin(settings, sessions)
        except BaseException:
            await db.dispose()
            raise
        return db.dispose

    async def _start_engines(self) -> Stop:
        # Read before what it versions: a change committed meanwhile is reloaded at the first poll.
        self._loaded_version = await config_version(self._db)
        async with self.sessions() as session:
            specs = await ModelRepository(session).enabled_deployments()
        self.registry = registry = EngineRegistry()
        try:
            await registry.load(specs)
        except BaseException:
            await registry.close()  # the engines that did start
            raise
        return registry.close

    async def _start_warm_up(self) -> Stop:
        # In the background: the server answers /health/live at once and /health/ready turns
        # 200 when every deployment is warm.
        warmup = asyncio.create_task(self.registry.warm_up(), name="warm-up")
        return lambda: cancelled(warmup)

    async def _start_policies(self) -> None:
        self.policies = policies = PolicyStore(self.sessions)
        await policies.reload()
        self.lane_cap_log = LaneCapLog()
        self._check_lane_caps()  # once at start, with the setting to change

    def _check_lane_caps(self) -> None:
        self.lane_cap_log.check(self.policies.current.lanes, seats(self.registry))

    async def _start_redis(self) -> Stop:
        settings = self.settings
        assert settings.redis_url
        self.redis_hub = hub = RedisHub(
            settings.redis_url, timeout_s=settings.redis_timeout_s, max_connections=settings.redis_max_connections
        )
        return hub.close

    async def _start_rate_limiter(self) -> Stop:
        settings, hub = self.settings, self.redis_hub
        limiter: RateLimiter = MemoryRateLimiter()
        if hub is not None:
            limiter = RedisRateLimiter(
                hub,
                settings.redis_prefix,
                failure_mode=settings.redis_failure_mode,
                share=settings.redis_admit_share,
                health=self.health,
            )
        self.limiter = limiter
        try:
            await limiter.load_used(self.sessions)  # quotas count from the usage rows (Redis: a lost counter's)
        except BaseException:
            await limiter.close()
            raise
        return limiter.close

    async def _start_budget_alerts(self) -> Stop:
        settings, limiter = self.settings, self.limiter
        alerts = BudgetAlerts(
            self.metrics.budget_alerts,
            share=settings.budget_alert_share,
            currency=settings.currency,
            webhook_url=settings.budget_alert_webhook_url,
            timeout_s=settings.budget_alert_timeout_s,
        )
        for each in (limiter, getattr(limiter, "fallback", limiter)):  # Redis's fallback alerts too
            each.alert, each.alert_share = alerts, settings.budget_alert_share
        self.alerts = alerts
        return alerts.close

    async def _start_usage_recorder(self) -> Stop:
        settings = self.settings
        self.recorder = recorder = UsageRecorder(
            self.sessions,
            interval_s=settings.usage_flush_interval_s,
            batch_size=settings.usage_batch_size,
            max_pending=settings.usage_max_pending,
            health=self.health,
            spool_dir=settings.data_dir / "usage-spool",
        )
        await recorder.start()
        upkeep = UsageMaintenance(
            self.sessions,
            raw_days=settings.usage_retention_days,
            rollup_days=settings.usage_rollup_retention_days,
        )
        await upkeep.start()

        async def stop() -> None:
            await upkeep.stop()
            await recorder.stop()  # flushes what it holds

        return stop

    async def _start_auth_sweeps(self) -> Stop:
        settings = self.settings
        self.authenticator = authenticator = KeyAuthenticator(
            self.sessions,
            ttl_s=settings.auth_cache_ttl_s,
            stale_s=settings.auth_stale_s,
            lookup_timeout_s=settings.auth_lookup_timeout_s,
            keep_warm_s=settings.auth_keep_warm_s,
            health=self.health,
        )
        return authenticator.close

    async def _start_shared_slots(self) -> Stop:
        assert self.redis_hub is not None
        settings = self.settings
        self.shared_slots = slots = SharedSlots(
            self.redis_hub, settings.redis_prefix, lease_ttl_s=settings.slot_lease_ttl_s, health=self.health
        )
        try:
            await slots.start()
        except BaseException:
            await slots.close()
            raise
        return slots.close

    async def _start_gateway(self) -> None:
        self.gateway = gateway = Gateway(
            self.registry,
            self.policies,
            self.limiter,
            config=GatewayConfig.from_settings(self.settings),
            sinks=(self.recorder, self.metrics),
            shared_slots=self.shared_slots,
        )
        self.metrics.watch_queues(gateway.queue_stats)
        self.metrics.watch(gateway.swaps.readings)  # per deployment and role (core/canary/)

    async def _start_loop_lag(self) -> Stop:
        gateway, shedder = self.gateway, self.shedder
        # Long ticks while no API request arrives and none is in flight; the shedder wakes it.
        self.loop_lag = loop_lag = LoopLagMonitor(
            on_sample=shedder.tick, busy=lambda: not shedder.quiet() or gateway.in_flight > 0
        )
        shedder.on_wake = loop_lag.wake
        await loop_lag.start()
        self.metrics.watch(lambda: runtime_readings(gateway, self.health, self.recorder, loop_lag, shedder))
        self.live_figures = LiveFigures(self.metrics)
        return loop_lag.stop

    async def _start_config_changes(self) -> Stop:
        db, registry = self._db, self.registry
        # A deployment that could not start is retried by every poll, whether or not the
        # configuration moved (an engine that was down comes up with no edit).
        self.config_poll = ConfigPoll(
            lambda: config_version(db),
            self._reload_config,
            seen=self._loaded_version,
            unsettled=lambda: bool(registry.failed or registry.rejected),
        )
        self.config_changes = changes = ConfigChanges(db, self._apply_notified, self.health)
        await changes.start()
        return changes.stop

    async def _reload_config(self) -> None:
        await self.policies.reload()
        await self.registry.sync(lambda: enabled_deployments(self.sessions))
        self._check_lane_caps()
        self.gateway.replicas_changed()

    async def _apply_notified(self) -> None:  # NOTIFY covers tenants and keys too: not in the counter
        self.authenticator.invalidate()
        await self.config_poll.refresh(force=True)

    def _canary_rolled_back(self, alias: str, name: str, reason: str) -> None:
        """The canary watch set `name`'s weight to 0 here: the row too (every replica then hears
        it), audited as laneway's, and an alert on the budget webhook's channel."""
        self.gateway.spawn(deployment_roles.record_rollback(self.admin, alias, name, reason))
        self.alerts.send({"event": "canary_rollback", "model": alias, "deployment": name, "reason": reason})

    async def _start_config_poll(self) -> Stop:
        every_s = self.settings.policy_poll_interval_s
        poll = self.config_poll.run(self.registry, every_s, self.health, after_tick=self._after_poll)
        watcher = asyncio.create_task(poll, name="config-poll")
        return lambda: cancelled(watcher)

    def _after_poll(self) -> None:
        self._check_lane_caps()  # an engine's sequence limit may be learnt after its start
        self.gateway.replicas_changed()  # an ejected replica may be back

    async def _start_admin_and_api(self) -> None:
        settings, sessions = self.settings, self.sessions
        self.started_at = time.time()
        self.admin = AdminService(
            sessions,
            self.config_changes,
            authenticator=self.authenticator,
            policies=self.policies,
            registry=self.registry,
            currency=settings.currency,
        )
        self.gateway.swaps.watch.on_rollback = self._canary_rolled_back
        self.logins = Logins(self.login_guard, sessions, settings.admin_cookie_secure, admin_password_file(settings))
        self.api = ApiServices(self.gateway, self.authenticator, settings.stream_send_timeout_s, self.started_at)
        self.batches, self.batch_runner = batch_services(settings, sessions, self.api, self.registry, self.health)

    async def _start_batch_runner(self) -> Stop:
        runner = self.batch_runner
        assert runner is not None  # settings.batch_runner: batch_services built it
        await runner.start()
        self.metrics.watch(runner.readings)
        return runner.stop

    async def _start_requests(self) -> Stop:
        gateway = self.gateway
        return lambda: gateway.drain(0)
