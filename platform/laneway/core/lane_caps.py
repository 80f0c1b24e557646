"""Lanes that cap a deployment below its own sequence limit.

A lane's max_concurrency is optional (none by default: each replica's learned running limit is
the lane's room). Where an operator sets one, it bounds how many of the lane's requests one
deployment runs at once; an engine started for more sequences (vLLM's --max-num-seqs, the
deployment's max_concurrency) then queues the lane's requests while it has room. That may be the
policy wanted, but it is a silent throughput limit: `laneway serve` logs each such pair once, and
the admin pages show it."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from laneway.core.policy import DEFAULT_LANE, LanePolicy
from laneway.engines.registry import EngineRegistry

log = logging.getLogger("laneway.policy")


@dataclass(frozen=True, slots=True)
class DeploymentSeats:
    """What the check reads of a deployment: its name, alias and engine's sequence limit."""

    name: str
    alias: str
    sequences: int


@dataclass(frozen=True, slots=True)
class LaneCap:
    lane: str
    cap: int  # the lane's max_concurrency
    deployment: str
    alias: str
    sequences: int  # what the deployment's engine runs at once

    def line(self) -> str:
        return (
            f"lane '{self.lane}' runs at most {self.cap} of the {self.sequences} sequences deployment "
            f"'{self.deployment}' ({self.alias}) takes; raise the lane's max_concurrency, or clear it (admin UI, "
            f"Lanes; `laneway lane set {self.lane} --max-concurrency none`) to use them all"
        )


def seats(registry: EngineRegistry) -> list[DeploymentSeats]:
    """The sequence limits of the deployments the registry serves (embedding ones too: a lane
    caps them alike)."""
    return [DeploymentSeats(d.spec.name, d.spec.alias, d.engine.info.max_concurrency) for d in registry.deployments()]


def lane_caps(lanes: Sequence[LanePolicy], deployments: Iterable[DeploymentSeats]) -> list[LaneCap]:
    """Each (lane, deployment) pair where the lane allows fewer sequences than the engine runs;
    no lanes configured: the default lane, as the router uses it."""
    effective = lanes or (DEFAULT_LANE,)
    return [
        LaneCap(lane.name, lane.max_concurrency, d.name, d.alias, d.sequences)
        for d in deployments
        for lane in effective
        if lane.max_concurrency is not None and lane.max_concurrency < d.sequences
    ]


class LaneCapLog:
    """Logs each lane cap once: at start, then the new ones when policies or deployments change
    (one that goes away and comes back is logged again)."""

    def __init__(self) -> None:
        self._logged: set[LaneCap] = set()

    def check(self, lanes: Sequence[LanePolicy], deployments: Iterable[DeploymentSeats]) -> list[LaneCap]:
        found = lane_caps(lanes, deployments)
        for cap in found:
            if cap not in self._logged:
                log.warning("%s", cap.line())
        self._logged = set(found)
        return found
