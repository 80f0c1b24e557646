"""Which replica a request goes to, once dispatch has taken it from the alias's fair queue.

In seconds, where it can: while every candidate replica's latency model is warm
(core/latency/), the profile's timed scorers decide alone (scorers/ttft.py: the predicted
time to this request's first token there, its queue's wait plus the prefill of what it does
not hold). A cache hit is seconds saved and a queue seconds spent, on one scale: no guard.

While any candidate is cold (a new replica, a quiet one: three observations are needed), the
other scorers decide as before the model: prefix affinity, the share of the prompt it most
likely holds, plus session affinity, it served the request's prompt_cache_key last, minus its
load, with the imbalance guard: a replica whose load exceeds the least loaded candidate's by
more than `imbalance` (in slots' worth) loses its affinity scorers' bonus, so a hot prefix
spreads once its replica is busier than the rest, instead of queueing everything there.

Ties (nothing cached anywhere, equal load; predictions within 5 % of each other) go by a
rendezvous hash of the request's anchor (its session key or first block): every gateway
replica, whatever its own index holds, sends a new conversation, or a new system prompt, to
the same engine replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from laneway.core.dispatch.prefix_index import PrefixIndex, Route
from laneway.core.dispatch.scorers import (
    DEFAULT_PROFILE,
    Candidate,
    LoadScorer,
    Profile,
    ProfiledScorer,
    build_scorers,
    parse_profile,
)
from laneway.core.dispatch.scorers.ttft import TIE_SHARE
from laneway.core.latency import LatencyModels
from laneway.core.latency.outlook import ReplicaState
from laneway.engines.base import load_reporter, prefix_tracker
from laneway.engines.registry import LiveDeployment

HASH_WEIGHT = 1e-3  # below any real score difference: it only breaks ties


@dataclass(frozen=True, slots=True)
class RoutingParams:
    profile: Profile = DEFAULT_PROFILE  # the scorers and their weights
    imbalance: float = 1.0
    block_bytes: int = 256
    index_blocks: int = 0  # per replica; 0: from the engine's KV capacity

    @classmethod
    def from_settings(cls, settings: object) -> RoutingParams:
        """From the routing_* settings; a profile naming an unknown scorer or a bad weight is a
        ValueError naming it (at start, not at the first request)."""
        values = {f: getattr(settings, f"routing_{f}") for f in cls.__dataclass_fields__}
        values["profile"] = parse_profile(values["profile"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Placement:
    replica: LiveDeployment
    reason: str  # the name of the scorer that explains it ("session", "prefix", "load") or "hash" (a metric label)
    cached_tokens: int  # prompt tokens the replica most likely holds (estimated)


@dataclass(slots=True)
class ReplicaFigures:
    """What dispatch placed on one replica since start (the admin's models page)."""

    placed: int = 0
    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0  # estimated by the index

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


def _prompt_tokens(route: Route) -> float:
    return len(route.token_ids) if route.token_ids else len(route.blocks) * route.block_tokens


def _rendezvous(anchor: bytes, name: str) -> float:
    digest = hashlib.blake2b(anchor + name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _timed(p: ProfiledScorer) -> bool:
    return bool(getattr(p.scorer, "timed", False))


class Picker:
    def __init__(
        self, params: RoutingParams, index: PrefixIndex | None = None, latency: LatencyModels | None = None
    ) -> None:
        self.params = params
        self.index = index or PrefixIndex()
        self.latency = latency  # the replicas' latency models: the timed scorers' predictions
        self.scorers = build_scorers(params.profile)
        # Split and ordered once, not per request: the timed scorers decide while the models
        # are warm, the others (the guard dropping the affinity scorers' share) while one is
        # cold, and the reason is asked of the scorers in precedence order.
        untimed = [p for p in self.scorers if not _timed(p)]
        self._timed_scorers = tuple(p.scorer for p in self.scorers if _timed(p))
        self._affinity = tuple(p.scorer for p in untimed if p.scorer.affinity)
        self._plain = tuple(p.scorer for p in untimed if not p.scorer.affinity)
        self._explainers = tuple(sorted(self.scorers, key=lambda p: p.scorer.precedence))
        self.figures: dict[str, ReplicaFigures] = {}

    def index_capacity(self, replica: LiveDeployment) -> int:
        """Blocks remembered for a replica: as many as its KV cache holds (4 bytes a token)."""
        if self.params.index_blocks > 0:
            return self.params.index_blocks
        info = replica.engine.info
        return max(1, info.max_model_len * max(info.max_concurrency, 1) * 4 // self.params.block_bytes)

    def candidate(self, replica: LiveDeployment, route: Route, capacity: Callable[[LiveDeployment], int]) -> Candidate:
        engine = replica.engine
        reporter = load_reporter(engine)  # kept per engine: a Protocol's isinstance was most of a pick
        reported = reporter.reported_load() if reporter is not None else None
        name = replica.spec.name
        precise = None
        if route.token_ids and (tracker := prefix_tracker(engine)) is not None:
            precise = tracker.cached_prefix_tokens(route.token_ids, route.salt)
        if precise is not None:  # the engine's own account of its cache
            share = precise / len(route.token_ids) if route.token_ids else 0.0
        else:
            share = self.index.cached(name, route.blocks) / len(route.blocks) if route.blocks else 0.0
        slots = capacity(replica)
        predicted = None
        if self.latency is not None and self._timed_scorers:
            state = ReplicaState(self.latency.of(name), replica.outstanding, slots)
            predicted = state.ttft(_prompt_tokens(route) * (1.0 - share))
        return Candidate(
            name=name,
            load=LoadScorer.load_of(replica.outstanding, slots, reported),
            cached_share=share,
            session=route.session_key is not None and self.index.session(route.session_key) == name,
            predicted_ttft_s=predicted,
            replica=replica,
        )

    def pick(
        self,
        route: Route,
        replicas: Sequence[LiveDeployment],
        capacity: Callable[[LiveDeployment], int],
        *,
        dry_run: bool = False,
    ) -> Placement:
        """The replica to place `route` on. `dry_run` (the admin's route tester): the same choice,
        recording nothing (no prefix index, session or figures update)."""
        candidates = [self.candidate(r, route, capacity) for r in replicas]
        timed = bool(self._timed_scorers) and all(c.predicted_ttft_s is not None for c in candidates)
        least = min(c.load for c in candidates)
        imbalance = self.params.imbalance
        best_i, best_score = 0, float("-inf")
        for i, c in enumerate(candidates):
            score = 0.0
            hashed = _rendezvous(route.anchor, c.name)
            if timed:  # seconds decide; predictions within TIE_SHARE of each other, the hash
                for scorer in self._timed_scorers:
                    score += scorer.score(c, route)
                score -= TIE_SHARE * abs(score) * (1.0 - hashed)
            else:
                if c.load - least <= imbalance:  # else the imbalance guard: no affinity bonus
                    for scorer in self._affinity:
                        score += scorer.score(c, route)
                for scorer in self._plain:
                    score += scorer.score(c, route)
            score += HASH_WEIGHT * hashed
            if score > best_score:
                best_i, best_score = i, score
        chosen, c = replicas[best_i], candidates[best_i]
        guarded = not timed and c.load - least > imbalance
        best_reason = "hash"
        for p in self._explainers:
            # Timed: the evidence that cut its seconds (a session, a prefix) or the seconds
            # themselves; load counted only as part of those.
            if timed and not (p.scorer.affinity or _timed(p)):
                continue
            if not timed and _timed(p):
                continue
            if not (guarded and p.scorer.affinity) and p.scorer.explains(c, candidates):
                best_reason = p.name
                break
        name = chosen.spec.name
        prompt_tokens = _prompt_tokens(route)
        cached_tokens = round(c.cached_share * prompt_tokens)
        if dry_run:
            return Placement(chosen, best_reason, cached_tokens)
        if route.blocks:
            self.index.record(name, route.blocks, self.index_capacity(chosen))
        if route.session_key is not None:
            self.index.remember_session(route.session_key, name)
        figures = self.figures.get(name) or self.figures.setdefault(name, ReplicaFigures())
        figures.placed += 1
        figures.prompt_tokens += max(prompt_tokens, route.block_tokens)
        figures.cached_tokens += cached_tokens
        return Placement(chosen, best_reason, cached_tokens)
