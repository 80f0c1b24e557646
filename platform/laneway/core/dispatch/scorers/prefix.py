"""Prefix affinity: a replica that holds more of the prompt's prefix prefills less of it."""

from __future__ import annotations

from dataclasses import dataclass

from laneway.core.dispatch.scorers.candidate import Candidate


@dataclass(frozen=True, slots=True)
class PrefixScorer:
    weight: float = 1.0

    def score(self, c: Candidate) -> float:
        return self.weight * c.cached_share
