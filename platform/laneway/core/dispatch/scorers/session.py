"""Session affinity: a request with a prompt_cache_key goes back where its key went last (its
conversation's cells are there even where the prompt's blocks were not hashed alike)."""

from __future__ import annotations

from dataclasses import dataclass

from laneway.core.dispatch.scorers.candidate import Candidate


@dataclass(frozen=True, slots=True)
class SessionScorer:
    weight: float = 0.5

    def score(self, c: Candidate) -> float:
        return self.weight if c.session else 0.0
