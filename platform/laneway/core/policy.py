"""Policies as data: an immutable snapshot of lanes, task policies, fallback aliases and
prices, swapped atomically.

The hot path reads `PolicyStore.current` (no database round trip); `reload()` builds a new
snapshot from the database and replaces the reference in one assignment, so a request sees
either the old policies or the new ones, never a mix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.core.prices import Price
from laneway.db.repositories import ModelRepository, PolicyRepository

log = logging.getLogger("laneway.policy")


UNCAPPED = 1 << 30  # a lane without a cap of its own: more than any engine runs


@dataclass(frozen=True, slots=True)
class LanePolicy:
    name: str
    priority: int = 0  # lower is served first
    match_max_prompt_tokens: int | None = None
    match_stream: bool | None = None
    match_tasks: frozenset[str] | None = None
    max_queue_depth: int = 64
    queue_timeout_s: float = 10.0
    # A policy ceiling on the lane's running sequences per deployment; None (the default): no
    # cap, each replica's learned running limit is the lane's room (core/latency/limit.py).
    max_concurrency: int | None = None
    max_unacked_tokens: int = 256
    retry_after_s: int = 1
    # Background (batch work): runs only in the slots no foreground lane's request can use now,
    # and hands them back as its requests end (core/scheduler.py).
    background: bool = False
    # Latency objectives in ms (core/slo.py); None: none. queue_timeout_s stays the hard bound.
    ttft_target_ms: int | None = None
    tpot_target_ms: int | None = None

    @property
    def cap(self) -> int:
        """The lane's running sequences per deployment at most: its max_concurrency, or no
        bound of its own (the deployment's room bounds it) where none is set."""
        return UNCAPPED if self.max_concurrency is None else self.max_concurrency

    def matches(self, *, prompt_tokens: int, stream: bool, task: str | None) -> bool:
        if self.match_max_prompt_tokens is not None and prompt_tokens > self.match_max_prompt_tokens:
            return False
        if self.match_stream is not None and stream != self.match_stream:
            return False
        return not (self.match_tasks is not None and task not in self.match_tasks)


@dataclass(frozen=True, slots=True)
class TaskPolicy:
    task: str
    max_tokens: int
    long_prompt_tokens: int | None = None
    long_prompt_max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    # Early stops (core/early_stops.py): the repetition rule's n-gram (in words and punctuation
    # marks; None: off) and how many times it must appear; the JSON modes' stop at the end
    # of the value.
    repetition_ngram: int | None = None
    repetition_count: int = 3
    json_stop: bool = True

    def cap(self, prompt_tokens: int) -> int:
        """The task's max_tokens, tightened for long prompts."""
        if self.long_prompt_tokens is not None and prompt_tokens > self.long_prompt_tokens:
            return min(self.max_tokens, self.long_prompt_max_tokens or self.max_tokens)
        return self.max_tokens


# Used when the lanes table is empty: one lane that takes everything.
DEFAULT_LANE = LanePolicy(name="default", max_queue_depth=256, queue_timeout_s=30.0)
# Batch lines' lane where the admins configured no background lane (and none named "batch").
BACKGROUND_LANE = LanePolicy(
    name="batch",
    priority=1_000,
    background=True,
    max_queue_depth=4096,
    queue_timeout_s=600.0,
    max_unacked_tokens=4096,
    retry_after_s=30,
)


@dataclass(frozen=True)
class PolicySnapshot:
    lanes: tuple[LanePolicy, ...] = ()
    tasks: dict[str, TaskPolicy] = field(default_factory=dict)
    version: int = 0
    # alias -> the aliases that serve its requests when it cannot, in order (models.fallbacks).
    fallback_lists: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # alias -> its price (models.price_*); an alias without one is not priced (no cost).
    prices: dict[str, Price] = field(default_factory=dict)

    def price(self, alias: str) -> Price | None:
        """The price in force now for `alias`, None when it has none."""
        return self.prices.get(alias)

    def fallbacks(self, alias: str) -> tuple[str, ...]:
        """The fallback aliases of `alias`, in the order to try them; () when it has none.
        Saved loop-free (admin/fallbacks.py); whether one is served now is the registry's."""
        return self.fallback_lists.get(alias, ())

    def lane(self, name: str) -> LanePolicy | None:
        return next((lane for lane in self.lanes if lane.name == name), None)

    def max_tokens(
        self, *, task: str | None, prompt_tokens: int, requested: int | None, room: int, default: int
    ) -> int:
        """Task cap (tightened for long prompts); the client's own when lower; never beyond the context."""
        policy = self.tasks.get(task) if task else None
        cap = policy.cap(prompt_tokens) if policy else default
        return max(0, min(cap, requested or cap, room))

    def stops(self, *, task: str | None, model_stops: Iterable[str], requested: Sequence[str]) -> tuple[str, ...]:
        """The request's stops merged with the task's and the model's defaults (deduplicated, in order)."""
        policy = self.tasks.get(task) if task else None
        merged = [*requested, *(policy.stop if policy else ()), *model_stops]
        return tuple(s for s in dict.fromkeys(merged) if s)


class PolicyStore:
    def __init__(self, sessions: async_sessionmaker[AsyncSession] | None, snapshot: PolicySnapshot | None = None):
        self._sessions = sessions
        self.current = snapshot or PolicySnapshot()

    async def reload(self) -> PolicySnapshot:
        assert self._sessions is not None
        async with self._sessions() as session:
            repo = PolicyRepository(session)
            lanes = tuple(
                LanePolicy(
                    name=r.name,
                    priority=r.priority,
                    match_max_prompt_tokens=r.match_max_prompt_tokens,
                    match_stream=r.match_stream,
                    match_tasks=frozenset(r.match_tasks) if r.match_tasks is not None else None,
                    max_queue_depth=r.max_queue_depth,
                    queue_timeout_s=r.queue_timeout_s,
                    max_concurrency=r.max_concurrency,
                    max_unacked_tokens=r.max_unacked_tokens,
                    retry_after_s=r.retry_after_s,
                    background=r.background,
                    ttft_target_ms=r.ttft_target_ms,
                    tpot_target_ms=r.tpot_target_ms,
                )
                for r in await repo.lanes()
            )
            tasks = {
                t.task: TaskPolicy(
                    task=t.task,
                    max_tokens=t.max_tokens,
                    long_prompt_tokens=t.long_prompt_tokens,
                    long_prompt_max_tokens=t.long_prompt_max_tokens,
                    stop=tuple(t.stop or ()),
                    repetition_ngram=t.repetition_ngram,
                    repetition_count=t.repetition_count,
                    json_stop=t.json_stop,
                )
                for t in await repo.task_policies()
            }
            models = ModelRepository(session)
            graph = await models.fallback_graph()
            priced = await models.prices()
        fallbacks = {alias: tuple(listed) for alias, listed in graph.items() if listed}
        prices = {alias: Price(*figures) for alias, figures in priced.items()}
        snapshot = PolicySnapshot(
            lanes=lanes, tasks=tasks, version=self.current.version + 1, fallback_lists=fallbacks, prices=prices
        )
        now = self.current
        if (snapshot.lanes, snapshot.tasks, snapshot.fallback_lists, snapshot.prices) != (
            now.lanes,
            now.tasks,
            now.fallback_lists,
            now.prices,
        ):
            self.current = snapshot  # one reference swap: atomic for every reader
            log.info(
                "policies reloaded: lanes=%s tasks=%s fallbacks=%s prices=%s",
                [x.name for x in lanes],
                sorted(tasks),
                fallbacks,
                sorted(prices),
            )
        return self.current
