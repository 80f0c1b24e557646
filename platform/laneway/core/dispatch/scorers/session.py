"""Session affinity: a request with a prompt_cache_key goes back where its key went last (its
conversation's cells are there even where the prompt's blocks were not hashed alike)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from laneway.core.dispatch.prefix_index import Route
from laneway.core.dispatch.scorers.candidate import Candidate
from laneway.core.dispatch.scorers.registry import register_scorer


@dataclass(frozen=True, slots=True)
class SessionScorer:
    weight: float = 0.5
    timed: ClassVar[bool] = False
    affinity: ClassVar[bool] = True
    precedence: ClassVar[int] = 10

    def score(self, c: Candidate, route: Route) -> float:
        return self.weight if c.session else 0.0

    def explains(self, chosen: Candidate, candidates: Sequence[Candidate]) -> bool:
        return chosen.session


register_scorer("session", SessionScorer)
