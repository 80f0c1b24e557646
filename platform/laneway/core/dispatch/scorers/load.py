"""Load: a busier replica serves later. Counted in slots' worth, so replicas of different sizes
compare: this gateway's requests bound there, or what the engine itself reports when that is
more (other gateways' traffic, its own queue), plus half its KV-cache use where it reports it
(a full cache preempts and recomputes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from laneway.core.dispatch.prefix_index import Route
from laneway.core.dispatch.scorers.candidate import Candidate
from laneway.core.dispatch.scorers.registry import register_scorer
from laneway.engines.base import EngineLoad

KV_USAGE_WEIGHT = 0.5


@dataclass(frozen=True, slots=True)
class LoadScorer:
    weight: float = 0.5
    timed: ClassVar[bool] = False
    affinity: ClassVar[bool] = False
    precedence: ClassVar[int] = 30

    def score(self, c: Candidate, route: Route) -> float:
        return -self.weight * c.load

    def explains(self, chosen: Candidate, candidates: Sequence[Candidate]) -> bool:
        """The candidates' loads differ, so load had a say (else only the hash did)."""
        return any(abs(o.load - chosen.load) > 1e-9 for o in candidates)

    @staticmethod
    def load_of(outstanding: int, capacity: int, reported: EngineLoad | None) -> float:
        busy = float(outstanding)
        kv = 0.0
        if reported is not None:
            busy = max(busy, reported.running + reported.waiting)
            kv = KV_USAGE_WEIGHT * reported.kv_usage
        return busy / max(capacity, 1) + kv


register_scorer("load", LoadScorer)
