"""An alias's replicas as the alias page shows them: each deployment row joined with what the
running gateway knows of it (warm or warming, healthy, ejected or probing and why, draining,
in flight and waiting, the load its engine reports, dispatch's estimated prefix hit rate, the
answers it failed mid-answer that another replica continued).
Read from the registry, the schedulers and the picker's figures (no engine is asked)."""

from __future__ import annotations

from typing import Any

from laneway.admin.dependencies import QueueStats, RoutingFigures
from laneway.admin.deployments import DeploymentIn
from laneway.admin.presentation import replica_state
from laneway.engines.kinds import find_engine_kind
from laneway.engines.registry import EJECT_AFTER_FAILURES, EngineRegistry, LiveDeployment


def where_it_runs(engine_kind: str) -> str | None:
    """The config key that says where an engine of the kind runs: a start failure is shown beside it."""
    kind = find_engine_kind(engine_kind)
    return kind.location_key if kind is not None else None


def _state(d: DeploymentIn, live: LiveDeployment | None, registry: EngineRegistry) -> tuple[str, str]:
    """(state, why): disabled, failed, warming, warm, or not started here."""
    if not d.enabled:
        return "disabled", "kept, not served: enable it to start its engine"
    if d.name in registry.failed:
        return "failed", registry.failed[d.name]
    if live is None:
        return "not started", registry.rejected.get(d.name, "not served by this gateway replica yet")
    return ("warm", "") if d.name in registry.warm else ("warming", "running its warm-up prompts")


def _health(live: LiveDeployment | None, shown: str) -> str:
    if live is None or shown != "ejected":
        return ""
    if live.failures >= EJECT_AFTER_FAILURES:
        return f"after {live.failures} consecutive engine errors; back after a passing health check"
    return "its health check failed; back after one passes"


def replica_rows(
    rows: list[DeploymentIn], registry: EngineRegistry, figures: RoutingFigures, queues: QueueStats
) -> list[dict[str, Any]]:
    live = {d.spec.name: d for d in registry.deployments()}
    placed = figures()
    waiting: dict[str, int] = {}
    for labels, w, _ in queues():
        waiting[labels["deployment"]] = waiting.get(labels["deployment"], 0) + w
    out = []
    for d in rows:
        found = live.get(d.name)
        state, why = _state(d, found, registry)
        shown = replica_state(found, placed.get(d.name))
        where = where_it_runs(d.engine_kind)
        drain = ""
        if d.draining:
            running = found.outstanding if found is not None else 0
            drain = f"draining: {running} still running" if running else "drained: nothing running"
        out.append(
            {
                "name": d.name,
                "engine": d.engine_kind,
                "where": str(d.config.get(where, "")) if where else "",
                "context": d.max_model_len,
                "enabled": d.enabled,
                "draining": d.draining,
                "drain": drain,
                "state": state,
                "why": why,
                "health_why": _health(found, shown["health"]),
                "continued": found.continued if found is not None else 0,
                "waiting": waiting.get(d.name, 0) if found is not None else "-",
                "lanes": ", ".join(d.config.get("lanes") or []) or "all",
                **shown,
            }
        )
    return out


def alias_waiting(alias: str, queues: QueueStats) -> int:
    """Requests waiting for any replica of the alias (late binding: not bound to one yet)."""
    return sum(w for labels, w, _ in queues() if labels["deployment"] == "" and labels.get("model") == alias)
