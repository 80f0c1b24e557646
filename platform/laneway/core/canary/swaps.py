"""The Gateway's engine-swap services in one value: the canary watch (a sink of every
outcome), the shadow runner, what the admin's Compare view reads and the metrics per
deployment and role."""

from __future__ import annotations

from typing import Any

from laneway.core.canary.shadow import Shadows
from laneway.core.canary.watch import CanaryWatch, Margins
from laneway.engines.registry import EngineRegistry

# (name, help, "gauge" | "counter", labels, value): the metrics' runtime reading (metrics.py).
Reading = tuple[str, str, str, dict[str, str], float]


class Swaps:
    def __init__(self, registry: EngineRegistry, margins: Margins | None = None, shadow_concurrency: int = 4) -> None:
        self.registry = registry
        self.watch = CanaryWatch(registry, margins)
        self.shadows = Shadows(registry, concurrency=shadow_concurrency)

    def compare(self, alias: str) -> dict[str, Any]:
        """The alias's roles, each pool's figures over the watch's window, and the shadow's
        comparison with the served answers (None without a shadow)."""
        replicas = self.registry.replicas(alias)
        return {
            "alias": alias,
            "window_s": self.watch.margins.window_s,
            "deployments": [
                {"name": d.spec.name, "role": d.role, "weight": d.weight, "sample": d.sample} for d in replicas
            ],
            "pools": self.watch.figures(replicas),
            "shadow": self.shadows.report(alias),
        }

    def readings(self) -> list[Reading]:
        out: list[Reading] = []
        for d in self.registry.deployments():
            labels = {"model": d.spec.alias, "deployment": d.spec.name, "role": d.role}
            share = d.weight if d.role == "canary" else d.sample if d.role == "shadow" else 100.0
            out.append(("laneway_deployment_share_percent", "A deployment's share by role.", "gauge", labels, share))
            window = self.watch.windows.get(d.spec.name)
            for outcome, n in window.total.items() if window is not None else ():
                out.append(
                    (
                        "laneway_pool_requests_total",
                        "Requests of aliases with a candidate, per deployment, role and outcome.",
                        "counter",
                        {**labels, "outcome": outcome},
                        float(n),
                    )
                )
        for (alias, name, reason), n in self.watch.rollbacks.items():
            labels = {"model": alias, "deployment": name, "reason": reason}
            out.append(("laneway_canary_rollbacks_total", "Canaries rolled back by laneway.", "counter", labels, n))
        for name, f in self.shadows.figures.items():
            for outcome, n in (("compared", f.compared), ("failed", f.failed), ("dropped", f.dropped)):
                labels = {"deployment": name, "outcome": outcome}
                out.append(("laneway_shadow_requests_total", "Shadow copies by outcome.", "counter", labels, n))
        return out

    async def close(self) -> None:
        await self.shadows.close()
