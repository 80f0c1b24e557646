"""What a replica scorer is: a weighted opinion of one candidate replica for one request, and
whether that opinion explains the placement (the routing metric's `reason` label)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, Protocol

from laneway.core.dispatch.prefix_index import Route
from laneway.core.dispatch.scorers.candidate import Candidate


class Scorer(Protocol):
    # An affinity bonus (a cache, a session): the imbalance guard takes it away from a replica
    # loaded past the least loaded candidate by more than `routing_imbalance`, and a guarded
    # placement is not explained by it.
    affinity: ClassVar[bool]
    # A score in seconds of predicted TTFT (scorers/ttft.py): while every candidate's latency
    # model is warm the timed scorers decide alone and no guard applies; while any is cold the
    # others do. A scorer without the attribute is not timed.
    timed: ClassVar[bool]
    # When several scorers explain a placement, the lowest precedence names it (the most
    # specific evidence: a session before a shared prefix before load).
    precedence: ClassVar[int]

    def score(self, c: Candidate, route: Route) -> float:
        """This scorer's weighted share of the candidate's score (higher: placed there sooner)."""
        ...

    def explains(self, chosen: Candidate, candidates: Sequence[Candidate]) -> bool:
        """Whether this scorer's evidence is why `chosen` won over `candidates`."""
        ...


# What builds a scorer from its weight in the routing profile (a scorer class is one).
ScorerFactory = Callable[[float], Scorer]
