"""What a replica's readiness is made of, for the people allowed to see it: the aliases it
serves, each deployment's state, and why any is not serving (failed to start, ejected, an
edit refused). /health/ready shows it to holders of the metrics token or an admin session
(anonymous probes get the status only); the admin dashboard shows it too."""

from __future__ import annotations

from laneway.engines.registry import EJECT_AFTER_FAILURES, EngineRegistry, LiveDeployment


def ejection_reason(d: LiveDeployment) -> str:
    if d.failures >= EJECT_AFTER_FAILURES:
        return f"ejected after {d.failures} consecutive engine errors; back when a health check passes"
    return "ejected: its engine failed a health check; back when one passes"


def readiness_details(registry: EngineRegistry) -> dict[str, object]:
    """The names and reasons behind `registry.ready` (JSON-ready)."""
    live = sorted(registry.deployments(), key=lambda d: d.spec.name)
    return {
        "models": registry.aliases(),
        "deployments": [
            {
                "name": d.spec.name,
                "alias": d.spec.alias,
                "engine": d.spec.engine_kind,
                "warm": d.spec.name in registry.warm,
                "healthy": d.healthy,
            }
            for d in live
        ],
        "warm": sorted(registry.warm),
        "failed": dict(registry.failed),
        "ejected": {d.spec.name: ejection_reason(d) for d in live if not d.healthy},
        "rejected_changes": dict(registry.rejected),
    }
