"""Which replica a request goes to, once dispatch has taken it from the alias's fair queue.

Each candidate gets the scorers' sum: prefix affinity (the share of the prompt it most likely
holds) plus session affinity (it served the request's prompt_cache_key last) minus its load.
The imbalance guard: a replica whose load exceeds the least loaded candidate's by more than
`imbalance` (in slots' worth) loses its affinity bonus, so a hot prefix spreads once its
replica is busier than the rest, instead of queueing everything there.

Ties (nothing cached anywhere, equal load) go by a rendezvous hash of the request's anchor
(its session key or first block): every gateway replica, whatever its own index holds,
sends a new conversation, or a new system prompt, to the same engine replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from laneway.core.dispatch.prefix_index import PrefixIndex, Route
from laneway.core.dispatch.scorers import Candidate, LoadScorer, PrefixScorer, SessionScorer
from laneway.engines.base import LoadReportingEngine, PrefixTrackingEngine
from laneway.engines.registry import LiveDeployment

HASH_WEIGHT = 1e-3  # below any real score difference: it only breaks ties


@dataclass(frozen=True, slots=True)
class RoutingParams:
    prefix_weight: float = 1.0
    session_weight: float = 0.5
    load_weight: float = 0.5
    imbalance: float = 1.0
    block_bytes: int = 256
    index_blocks: int = 0  # per replica; 0: from the engine's KV capacity

    @classmethod
    def from_settings(cls, settings: object) -> RoutingParams:
        return cls(**{f: getattr(settings, f"routing_{f}") for f in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class Placement:
    replica: LiveDeployment
    reason: str  # "prefix", "session", "load" or "hash": what decided it (a metric label)
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


def _rendezvous(anchor: bytes, name: str) -> float:
    digest = hashlib.blake2b(anchor + name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class Picker:
    def __init__(self, params: RoutingParams, index: PrefixIndex | None = None) -> None:
        self.params = params
        self.index = index or PrefixIndex()
        self.prefix = PrefixScorer(params.prefix_weight)
        self.session = SessionScorer(params.session_weight)
        self.load = LoadScorer(params.load_weight)
        self.figures: dict[str, ReplicaFigures] = {}

    def index_capacity(self, replica: LiveDeployment) -> int:
        """Blocks remembered for a replica: as many as its KV cache holds (4 bytes a token)."""
        if self.params.index_blocks > 0:
            return self.params.index_blocks
        info = replica.engine.info
        return max(1, info.max_model_len * max(info.max_concurrency, 1) * 4 // self.params.block_bytes)

    def candidate(self, replica: LiveDeployment, route: Route, capacity: Callable[[LiveDeployment], int]) -> Candidate:
        engine = replica.engine
        reported = engine.reported_load() if isinstance(engine, LoadReportingEngine) else None
        name = replica.spec.name
        precise = None
        if route.token_ids and isinstance(engine, PrefixTrackingEngine):
            precise = engine.cached_prefix_tokens(route.token_ids, route.salt)
        if precise is not None:  # the engine's own account of its cache
            share = precise / len(route.token_ids) if route.token_ids else 0.0
        else:
            share = self.index.cached(name, route.blocks) / len(route.blocks) if route.blocks else 0.0
        return Candidate(
            name=name,
            load=LoadScorer.load_of(replica.outstanding, capacity(replica), reported),
            cached_share=share,
            session=route.session_key is not None and self.index.session(route.session_key) == name,
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
        least = min(c.load for c in candidates)
        best_i, best_score, best_reason = 0, float("-inf"), "hash"
        for i, c in enumerate(candidates):
            affinity = self.prefix.score(c) + self.session.score(c)
            if c.load - least > self.params.imbalance:
                affinity = 0.0  # the imbalance guard
            score = affinity + self.load.score(c) + HASH_WEIGHT * _rendezvous(route.anchor, c.name)
            if score > best_score:
                best_i, best_score = i, score
        chosen, c = replicas[best_i], candidates[best_i]
        guarded = c.load - least > self.params.imbalance
        if c.session and not guarded:
            best_reason = "session"
        elif c.cached_share > 0 and not guarded:
            best_reason = "prefix"
        elif any(abs(o.load - c.load) > 1e-9 for o in candidates):
            best_reason = "load"
        name = chosen.spec.name
        prompt_tokens = len(route.token_ids) if route.token_ids else len(route.blocks) * route.block_tokens
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
