"""Prefix affinity: a replica that holds more of the prompt's prefix prefills less of it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from laneway.core.dispatch.prefix_index import Route
from laneway.core.dispatch.scorers.candidate import Candidate
from laneway.core.dispatch.scorers.registry import register_scorer


@dataclass(frozen=True, slots=True)
class PrefixScorer:
    weight: float = 1.0
    timed: ClassVar[bool] = False
    affinity: ClassVar[bool] = True
    precedence: ClassVar[int] = 20

    def score(self, c: Candidate, route: Route) -> float:
        return self.weight * c.cached_share

    def explains(self, chosen: Candidate, candidates: Sequence[Candidate]) -> bool:
        return chosen.cached_share > 0


register_scorer("prefix", PrefixScorer)
