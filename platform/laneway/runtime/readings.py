"""What the runtime's services publish at scrape time, as Prometheus readings."""

from __future__ import annotations

from laneway.core.dependencies import DependencyHealth
from laneway.core.latency import LatencyReadings, curve_points
from laneway.core.load_shedding import LoadShedder
from laneway.core.loop_lag import LoopLagMonitor
from laneway.core.pipeline import Gateway
from laneway.engines.base import PrefixReusingEngine
from laneway.metrics import Reading
from laneway.usage import UsageRecorder


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
        ("laneway_leases_in_flight", "Requests holding a lease (queued or running).", "gauge", {}, gateway.in_flight),
        (
            "laneway_leases_opened_total",
            "Leases opened; each leaves one usage row when released.",
            "counter",
            {},
            gateway.leases_opened,
        ),
        (
            "laneway_event_loop_lag_seconds",
            "How late the event loop ran its last 50 ms timer.",
            "gauge",
            {},
            loop_lag.last_s,
        ),
        (
            "laneway_event_loop_lag_max_seconds",
            "The worst event-loop lag over the last minute.",
            "gauge",
            {},
            max(loop_lag.samples, default=0.0),
        ),
        (
            "laneway_api_requests_preparing",
            "API requests between their headers and an engine's queue.",
            "gauge",
            {},
            shedder.preparing,
        ),
        (
            "laneway_event_loop_busy_ratio",
            "Share of the last ticks the event loop's thread spent on the CPU.",
            "gauge",
            {},
            shedder.busy,
        ),
        (
            "laneway_api_admit_ratio",
            "Share of new API requests let in by the CPU load shedder (1: all).",
            "gauge",
            {},
            shedder.admit,
        ),
    ]
    for reason, n in shedder.shed_by.items():
        out.append(
            (
                "laneway_shed_total",
                "Requests refused with 503 overloaded before any work: the loop "
                "over its CPU target (cpu), too many being prepared (backlog) or the loop behind "
                "(loop_lag).",
                "counter",
                {"reason": reason},
                n,
            )
        )
    for dep in sorted(set(health.errors) | set(health.degraded)):
        labels = {"dependency": dep}
        out.append(
            (
                "laneway_dependency_errors_total",
                "Faults of a dependency (Redis, the database).",
                "counter",
                labels,
                health.errors[dep],
            )
        )
        out.append(
            (
                "laneway_dependency_degraded",
                "1 while the gateway works around a dependency's fault.",
                "gauge",
                labels,
                float(health.degraded.get(dep, False)),
            )
        )
    out.append(("laneway_usage_rows_pending", "Usage rows waiting to be written.", "gauge", {}, recorder.pending))
    out.append(("laneway_usage_rows_written_total", "Usage rows written.", "counter", {}, recorder.written))
    for reason, n in (("overflow", recorder.dropped), ("rejected", recorder.rejected)):
        out.append(
            (
                "laneway_usage_rows_lost_total",
                "Usage rows dropped (backlog overflow) or refused by the database.",
                "counter",
                {"reason": reason},
                n,
            )
        )
    for d in gateway.registry.deployments():
        out.append(
            (
                "laneway_engine_active_slots",
                "Sequences holding a slot inside the engine adapter.",
                "gauge",
                {"deployment": d.spec.name},
                d.engine.active_slots,
            )
        )
        if isinstance(d.engine, PrefixReusingEngine) and d.engine.reuses_prefixes:
            out.append(
                (
                    "laneway_engine_prefix_hits_total",
                    "Requests that started from cached KV cells (a "
                    "warm-up system prompt's, or an earlier request's of the same cache partition).",
                    "counter",
                    {"deployment": d.spec.name},
                    d.engine.prefix_hits,
                )
            )
            out.append(
                (
                    "laneway_engine_prefix_tokens_reused_total",
                    "Prompt tokens started from cached KV cells instead of computed.",
                    "counter",
                    {"deployment": d.spec.name},
                    d.engine.prefix_tokens_reused,
                )
            )
            out.append(
                (
                    "laneway_engine_prompt_tokens_computed_total",
                    "Prompt tokens started without cached KV cells (the prefix cache's misses).",
                    "counter",
                    {"deployment": d.spec.name},
                    d.engine.prompt_tokens_computed,
                )
            )
    learned = gateway.latency_readings()
    for d in gateway.registry.deployments():
        readings = learned.get(d.spec.name)
        if readings is not None:
            out += latency_readings(d.spec.name, readings, d.engine.info.max_concurrency)
    limits = limiter.readings()
    out.append(
        (
            "laneway_ratelimit_local_holders",
            "Concurrency holders kept in this process's memory.",
            "gauge",
            {},
            limits.local_holders,
        )
    )
    if limits.shared is not None:
        out.append(
            (
                "laneway_ratelimit_settles_pending",
                "Rate-limit settles not yet sent to Redis.",
                "gauge",
                {},
                limits.shared.settles_pending,
            )
        )
        for by, n in (("replica", limits.shared.admitted_at_once), ("redis", limits.shared.decided_by_redis)):
            out.append(
                (
                    "laneway_ratelimit_decisions_total",
                    "Rate-limit decisions taken with Redis limits: by "
                    "this replica on Redis's last answer (far from every limit), or by Redis itself.",
                    "counter",
                    {"by": by},
                    n,
                )
            )
    return out


def latency_readings(deployment: str, learned: LatencyReadings, slots: int) -> list[Reading]:
    """What a replica's latency model has learned (core/latency/): the figures it has so far."""
    labels = {"deployment": deployment}
    gauges = (
        (
            "prefill_seconds_per_token",
            "Learned prefill seconds per uncached prompt token.",
            learned.prefill_s_per_token,
        ),
        (
            "ttft_overhead_seconds",
            "Learned fixed part of the time from a slot to the first token.",
            learned.ttft_overhead_s,
        ),
        ("step_base_seconds", "Learned decode step time's fixed part.", learned.step_base_s),
        (
            "step_seconds_per_sequence",
            "Learned decode step time added by each running sequence.",
            learned.step_s_per_seq,
        ),
        ("step_seconds_per_kv_usage", "Learned decode step time added by a full KV cache.", learned.step_s_per_kv),
        ("service_seconds", "Learned mean time a request holds its slot.", learned.service_s),
        ("ttft_prediction_mape", "Decayed mean |predicted - actual| / actual of TTFT.", learned.ttft_error),
        (
            "concurrency_limit",
            "Sequences the replica may run at once: learned against the lanes' TPOT targets, at most its engine's.",
            learned.concurrency_limit,
        ),
    )
    out: list[Reading] = [
        (f"laneway_replica_{name}", doc, "gauge", labels, value) for name, doc, value in gauges if value is not None
    ]
    out.append(
        (
            "laneway_replica_latency_observations",
            "Requests behind the replica's latency model, decayed (about the last 20 s's).",
            "gauge",
            labels,
            learned.ttft_weight,
        )
    )
    for running in curve_points(slots):
        step = learned.step_at(running)
        if step is not None:
            out.append(
                (
                    "laneway_replica_step_seconds",
                    "Learned decode step time at a batch of `running` sequences.",
                    "gauge",
                    {**labels, "running": str(running)},
                    step,
                )
            )
    return out
