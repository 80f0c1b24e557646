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
  replicas drain the queue together; once its turn comes it takes the replica whose slot freed.
  When its slot frees is played out from the slots as they are: each running attempt's slot
  frees one mean hold after its dispatch (at once, for one past the mean), and the request that
  takes it holds it a mean hold; a replica's own queue takes its first slots. (Counted as one
  slot every hold / slots seconds, a request queued behind a long stream on a one-slot engine
  was predicted a whole stream's wait however near its end that stream was: 40 s predicted on
  real llama.cpp in CI, and refused, where waiting served it.) Retry-After figures keep the
  steady rate (`seconds_for`).
- **Refusing on it** (`refuses`): only while every replica's model is trusted (warm, and its
  recent TTFT predictions within half of what came: ReplicaLatencyModel.trusted), and on the
  low end of the prediction (`ttft(ahead, low=True)`: the TTFT from a slot less its recent
  error): a refusal that waiting would have cured is worse than a wait the timeout ends.

Lane caps below a replica's slots are not modelled (the replica's slots are): a lane capped
tighter waits longer than predicted, and its queue timeout still bounds it.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from laneway.core.latency.replica import ReplicaLatencyModel

MAX_PLAYED = 4096  # slot frees played out at most; a queue longer than that counts at the steady rate


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
        now: float | None = None,
    ) -> None:
        self.replicas = replicas
        self.uncached = uncached
        self.now = time.perf_counter() if now is None else now
        # Admission refuses at once on it only while every replica's model is trusted (else it
        # only prices Retry-After, and the request waits as it did before the model).
        self.refuses = all(r.model.trusted(self.now) for r in replicas)
        self._cache = cache
        self._given_periods = periods
        self._rate: float | None = None if periods is None else self._rate_of(periods)
        self.free = sum(r.capacity - r.outstanding for r in replicas)  # below 0: queued on replicas

    @staticmethod
    def _rate_of(periods: Sequence[float | None]) -> float:
        return sum(1.0 / max(p, 1e-6) for p in periods if p is not None) or 1e-6

    @property
    def _periods(self) -> Sequence[float]:
        """Each replica's slot period (a deferred outlook's, once asked; an unknown one as the
        slowest known, so the play-out never counts on a replica it knows nothing of)."""
        if self._given_periods is None:
            known = [r.slot_period() for r in self.replicas]
            slowest = max((p for p in known if p is not None), default=1.0)
            self._given_periods = [slowest if p is None else p for p in known]
        return self._given_periods

    @property
    def rate(self) -> float:
        """Slots freed per second across the replicas, all full (a deferred one's, once asked)."""
        if self._rate is None:
            self._rate = self._rate_of(self._periods)
        return self._rate

    @classmethod
    def of(
        cls,
        replicas: Sequence[ReplicaState],
        uncached: float,
        cache: Callable[[], Sequence[float]] | None = None,
        now: float | None = None,
    ) -> Outlook | None:
        """None while any replica is cold (or there is none): no basis to predict. `cache`:
        what each replica most likely holds of the prompt, in tokens, asked only by with_cache."""
        periods = [r.slot_period() for r in replicas]
        if not replicas or any(p is None for p in periods):
            return None
        if any(r.from_slot(uncached, full=True) is None for r in replicas):
            return None
        return cls(replicas, uncached, [p for p in periods if p is not None], cache, now)

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
        return Outlook.of(states, self.uncached, now=self.now)

    def seconds_for(self, slots: float) -> float:
        """Seconds until `slots` more slots have freed across the replicas, at the steady rate."""
        return max(slots, 0.0) / self.rate

    def ttft(self, ahead: int, *, low: bool = False) -> float:
        """Predicted seconds to the first token with `ahead` requests before it in the fair order;
        `low`: the TTFT from its slot less its replica's recent mean error (what a refusal uses)."""
        if ahead < self.free:  # a slot is free for it: the best replica that has one
            now = [self._from_slot(r, full=False, low=low) for r in self.replicas if r.outstanding < r.capacity]
            return min((t for t in now if t is not None), default=0.0)
        played = self._slot_frees(ahead + 1)
        if played is None:  # a very long queue: the steady rate
            after = [self._from_slot(r, full=True, low=low) for r in self.replicas]
            return self.seconds_for(ahead - self.free + 1) + min(t for t in after if t is not None)
        wait, replica = played
        return wait + (self._from_slot(replica, full=True, low=low) or 0.0)

    def _from_slot(self, r: ReplicaState, *, full: bool, low: bool) -> float | None:
        t = r.from_slot(self.uncached, full=full)
        if t is None or not low:
            return t
        error = r.model.ttft_error(self.now)
        return t * (1.0 - min(error[0], 1.0)) if error is not None else t

    def _slot_frees(self, slots: int) -> tuple[float, ReplicaState] | None:
        """When the `slots`-th slot frees for the alias's queue (a free slot frees at 0), and
        where: each replica's slots free as its running attempts' holds end, each taken again
        for a mean hold, its own queue served first. None past MAX_PLAYED frees."""
        heap: list[tuple[float, int]] = []
        queued: list[int] = []
        holds: list[float] = []
        for i, (r, period) in enumerate(zip(self.replicas, self._periods, strict=True)):
            hold = period * max(r.capacity, 1)
            holds.append(hold)
            running = min(r.outstanding, r.capacity)
            frees = r.model.slots_free_in(self.now, hold)
            excess = max(len(frees) - max(r.capacity, 1), 0)  # its limit fell: these free no slot
            frees = frees[excess : running + excess] + [hold] * max(running - len(frees) + excess, 0)
            frees += [0.0] * max(r.capacity - running, 0)  # free now (taken by the ones ahead)
            heap.extend((t, i) for t in frees)
            queued.append(max(r.outstanding - r.capacity, 0))
        if not heap or slots + sum(queued) > MAX_PLAYED:
            return None
        heapq.heapify(heap)
        left = slots
        while True:
            t, i = heapq.heappop(heap)
            heapq.heappush(heap, (t + holds[i], i))
            if queued[i]:
                queued[i] -= 1
                continue
            left -= 1
            if left == 0:
                return t, self.replicas[i]
