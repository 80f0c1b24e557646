"""What the deployments' queues hold, per lane: the queue gauges' reading at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from laneway.core.policy import LanePolicy
from laneway.engines.registry import LiveDeployment


class LaneStats(Protocol):
    def lane_stats(self) -> list[tuple[str, int, int]]: ...


def queue_stats(
    deployments: Sequence[LiveDeployment], lanes: Sequence[LanePolicy], scheduler: Callable[[LiveDeployment], LaneStats]
) -> list[tuple[dict[str, str], int, int]]:
    """Waiting and running requests per deployment and lane (every configured lane listed)."""
    out = []
    names = [lane.name for lane in lanes]
    for d in deployments:
        info = d.engine.info
        base = {
            "deployment": d.spec.name,
            "model": d.spec.alias,
            "quantization": info.quantization,
            "gpu_type": info.gpu_type,
            "engine": info.engine,
        }
        seen = {name: (w, r) for name, w, r in scheduler(d).lane_stats()}
        for name in sorted(set(names) | set(seen)):
            waiting, running = seen.get(name, (0, 0))
            out.append(({**base, "lane": name}, waiting, running))
    return out
