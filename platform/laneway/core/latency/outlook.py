"""A request's predicted time to first token before it is placed, in seconds: the wait for a
slot plus the replica's TTFT from its slot, from the replicas' latency models (replica.py).

Admission refuses by it (core/admission.py), Retry-After is computed from it, and the `ttft`
scorer routes by it (core/dispatch/scorers/ttft.py). It predicts nothing while any replica it
weighs is cold (fewer than three observations): the callers fall back to what they did before
the model (queue places, slot counts).

- **On one replica**: free slots, no wait; else the requests bound there beyond its slots wait
  first, one slot freeing every `service / slots` seconds (`predict_wait`), and it then joins a
  full batch. Its TTFT from the slot is `predict_ttft` for its uncached tokens behind the
  prefill still pending there.
- **Across an alias's replicas** (a request in the alias's fair queue, `ahead` requests before
  it in the fair order): the next slot to free anywhere goes to the head of that order, so the
  replicas drain the queue together, at the sum of their rates; once its turn comes it takes the
  replica with the best TTFT from a slot.

Lane caps below a replica's slots are not modelled (the replica's slots are): a lane capped
tighter waits longer than predicted, and its queue timeout still bounds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from laneway.core.latency.replica import ReplicaLatencyModel


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """A replica as a prediction sees it now."""

    model: ReplicaLatencyModel
    outstanding: int  # requests bound there: running, or waiting in its own queue
    capacity: int  # requests it runs at once
    cached: float = 0.0  # of the request's prompt tokens, those it most likely holds

    def slot_period(self) -> float | None:
        """Seconds between two slots freeing while it is full (its mean hold / its slots)."""
        return self.model.predict_wait(1.0, float(max(self.capacity, 1)))

    def from_slot(self, uncached: float, *, full: bool) -> float | None:
        """TTFT from a slot here: now (`full` False: a slot is free), or once one frees (a
        full batch, the prefill pending now done by then)."""
        m = self.model
        uncached = max(uncached - self.cached, 0.0)
        if full:
            return m.predict_ttft(uncached, 0.0, float(max(self.capacity - 1, 0)))
        return m.predict_ttft(uncached, m.pending_prefill, float(min(self.outstanding, self.capacity)))

    def ttft(self, uncached: float) -> float | None:
        """Predicted seconds to the first token of a request placed here now."""
        queued = self.outstanding - self.capacity + 1  # slots that must free before its own
        if queued <= 0:
            return self.from_slot(uncached, full=False)
        period = self.slot_period()
        after = self.from_slot(uncached, full=True)
        return None if period is None or after is None else queued * period + after


class Outlook:
    """The predicted TTFT of one request waiting for any of `replicas` (every one warm).

    `uncached`: its prompt tokens, less what each replica state says it holds. Admission has no
    route yet: it predicts with the whole prompt uncached, and only where that is past the
    bound asks `with_cache` (the prefix index's estimate per replica, which costs the prompt's
    hashing) before it refuses, so a session whose long prompt a replica holds is not refused
    for a prefill it will not pay."""

    def __init__(
        self,
        replicas: Sequence[ReplicaState],
        uncached: float,
        periods: Sequence[float] | None,
        cache: Callable[[], Sequence[float]] | None = None,
    ) -> None:
        self.replicas = replicas
        self.uncached = uncached
        self.refuses = True  # admission refuses at once on it (else it only prices Retry-After)
        self._cache = cache
        self._rate: float | None = None if periods is None else self._rate_of(periods)
        self.free = sum(r.capacity - r.outstanding for r in replicas)  # below 0: queued on replicas

    @staticmethod
    def _rate_of(periods: Sequence[float | None]) -> float:
        return sum(1.0 / max(p, 1e-6) for p in periods if p is not None) or 1e-6

    @property
    def rate(self) -> float:
        """Slots freed per second across the replicas, all full (a deferred one's, once asked)."""
        if self._rate is None:
            self._rate = self._rate_of([r.slot_period() for r in self.replicas])
        return self._rate

    @classmethod
    def of(
        cls, replicas: Sequence[ReplicaState], uncached: float, cache: Callable[[], Sequence[float]] | None = None
    ) -> Outlook | None:
        """None while any replica is cold (or there is none): no basis to predict. `cache`:
        what each replica most likely holds of the prompt, in tokens, asked only by with_cache."""
        periods = [r.slot_period() for r in replicas]
        if not replicas or any(p is None for p in periods):
            return None
        if any(r.from_slot(uncached, full=True) is None for r in replicas):
            return None
        return cls(replicas, uncached, [p for p in periods if p is not None], cache)

    @classmethod
    def deferred(
        cls, replicas: Sequence[ReplicaState], uncached: float, cache: Callable[[], Sequence[float]] | None = None
    ) -> Outlook | None:
        """As `of`, nothing predicted until asked: admission builds an outlook for every request
        and, while it does not refuse by it, asks it only to price a refusal's Retry-After. Warm
        is read from the models' observation counts (a warm fit always predicts: its ridge)."""
        if not replicas or not all(r.model.predicts for r in replicas):
            return None
        return cls(replicas, uncached, None, cache)

    def with_cache(self) -> Outlook | None:
        """The same prediction, each replica crediting what it most likely holds of the prompt;
        None when nothing is known of that."""
        if self._cache is None:
            return None
        held = self._cache()
        states = [dataclasses.replace(r, cached=c) for r, c in zip(self.replicas, held, strict=True)]
        return Outlook.of(states, self.uncached)

    def seconds_for(self, slots: float) -> float:
        """Seconds until `slots` more slots have freed across the replicas."""
        return max(slots, 0.0) / self.rate

    def ttft(self, ahead: int) -> float:
        """Predicted seconds to the first token with `ahead` requests before it in the fair order."""
        if ahead < self.free:  # a slot is free for it: the best replica that has one
            now = [r.from_slot(self.uncached, full=False) for r in self.replicas if r.outstanding < r.capacity]
            return min((t for t in now if t is not None), default=0.0)
        after = [r.from_slot(self.uncached, full=True) for r in self.replicas]
        return self.seconds_for(ahead - self.free + 1) + min(t for t in after if t is not None)
