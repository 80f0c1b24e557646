"""Predicted time to first token: the replica that would give this request its first token
soonest, in seconds (core/latency/outlook.py: its queue's wait at its learned rate, then its
learned TTFT from a slot for the tokens it does not hold). A cache hit is prefill seconds
saved, a queue is seconds spent, on one scale, so no imbalance guard is needed: a session
stays on its replica while that replica's predicted TTFT beats a miss elsewhere.

A timed scorer: while every candidate's model is warm the picker adds up the timed scorers
alone; while any is cold it has no opinion and the others (prefix, session, load, with the
imbalance guard) decide, as before the model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from laneway.core.dispatch.prefix_index import Route
from laneway.core.dispatch.scorers.candidate import Candidate
from laneway.core.dispatch.scorers.registry import register_scorer

# Predictions within this share of each other are the models' noise, not a difference: the
# picker's rendezvous hash decides between them (core/dispatch/picker.py).
TIE_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class TtftScorer:
    weight: float = 1.0  # score points per second
    affinity: ClassVar[bool] = False
    timed: ClassVar[bool] = True
    precedence: ClassVar[int] = 25

    def score(self, c: Candidate, route: Route) -> float:
        return -self.weight * (c.predicted_ttft_s or 0.0)

    def explains(self, chosen: Candidate, candidates: Sequence[Candidate]) -> bool:
        """Another candidate was predicted clearly slower."""
        mine = chosen.predicted_ttft_s
        return mine is not None and any(
            o.predicted_ttft_s is not None and o.predicted_ttft_s > mine * (1 + TIE_SHARE) + 1e-6 for o in candidates
        )


register_scorer("ttft", TtftScorer)
