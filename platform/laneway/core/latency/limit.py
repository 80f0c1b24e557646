"""A replica's running limit, learned from its inter-token gaps against the lanes' TPOT targets
(docs/decisions/0010-adaptive-concurrency.md).

AIMD, as Netflix's concurrency-limits and TCP do it, judged in time instead of on drops:
- a request that decoded slower than its lane's TPOT target (its mean inter-token gap, what its
  client saw) backs the limit off by a factor (to 80 %, at least one less), if the replica's
  learned step curve at the batch it decoded in agrees (the curve's fit is clipped, so a
  stream stretched by a client that reads slowly, or one stall, does not back off the limit
  for everyone; no curve yet: the gap alone decides);
- a request that met its target while the replica ran at its limit (the batch it joined was
  as large as the limit) grows it by one, if the replica's learned step curve says one more
  sequence still holds the target (no curve yet: the measured gap alone decides);
- one change per round trip: only a request dispatched after the last change may change it
  again, so the requests that ran under the old limit (and all breach together) count once.

Each request is judged against its own lane's target: requests of the lane with the tightest
target share the engine's steps with the others, so its breaches back the limit off for all
(the tightest active lane's target rules). A request without a target never backs it off.

Bounds: at least 1, at most `hard`: the engine's own limit (the deployment's max_concurrency,
vLLM's --max-num-seqs where it is set to it). It starts at `hard`, what laneway ran before:
with nothing learned, nothing is held back, and an engine whose step curve holds the targets
keeps every sequence it takes; one that slows with load is backed off to where it holds."""

from __future__ import annotations

import math
from collections.abc import Callable

BACKOFF = 0.8


class ConcurrencyLimit:
    __slots__ = ("_changed_at", "changed", "hard", "value")

    def __init__(self, hard: int, initial: int | None = None) -> None:
        self.hard = max(1, hard)
        self.value = self.hard if initial is None else min(max(1, initial), self.hard)
        self._changed_at = -math.inf  # dispatch time before which a request cannot change it
        self.changed: Callable[[int], None] | None = None  # told each new value

    def bound(self, hard: int) -> None:
        """The engine's own limit, as the deployment now says it (a config edit may change it). A
        limit at the old one follows it up (nothing learned held it lower); one below it stays."""
        at_old, self.hard = self.value >= self.hard, max(1, hard)
        if self.value > self.hard or at_old:
            self._set(self.hard, self._changed_at)

    def observe(
        self,
        dispatched: float,
        now: float,
        gap_s: float,
        target_s: float | None,
        batch: float,
        predict_step: Callable[[float], float | None],
        decoded_in: float | None = None,
    ) -> None:
        """A request dispatched at `dispatched`, in a batch of `batch` (itself included) when it
        started, decoded in a batch of `decoded_in` on average with a mean inter-token gap of
        `gap_s`, against its lane's `target_s`."""
        if dispatched < self._changed_at:
            return  # it ran under an older limit: that one was judged already
        if target_s is not None and gap_s > target_s and _agrees(predict_step(decoded_in or batch), target_s):
            self._set(max(1, min(self.value - 1, math.floor(self.value * BACKOFF))), now)
            return
        if self.value >= self.hard or batch < self.value:
            return  # at the engine's limit, or the limit was not what held the replica back
        if target_s is not None:
            step = predict_step(self.value + 1.0)
            if step is not None and step > target_s:
                return  # one more sequence would break the target, by the learned curve
        self._set(self.value + 1, now)

    def _set(self, value: int, now: float) -> None:
        if value == self.value:
            return
        self.value = value
        self._changed_at = now
        if self.changed is not None:
            self.changed(value)


def _agrees(step_s: float | None, target_s: float) -> bool:
    """Whether the learned step time (None: none learned yet) also breaks the target."""
    return step_s is None or step_s > target_s
