"""One replica's latency model, learned online from the requests laneway sends it.

Two fits (fit.py: time-decayed, robust least squares), each updated once per request:

- **Time to first token**, from the moment the request holds the replica's slot:
      ttft = overhead + prefill_s_per_token x its uncached tokens
             + per_queued x uncached tokens queued ahead of it + per_running x batch
  Its uncached tokens are its prompt less what the replica was estimated to hold (the engine's
  own account where laneway follows its cache, else the prefix index); those queued ahead are
  the uncached tokens of the requests sent there before it that have no first token yet (an
  engine prefills them first, or in the same step: their own coefficient, since laneway sees
  their first tokens a little late and so counts some already done); the batch is the
  sequences running there when it started, itself included.
- **Decode step time** against the batch it ran in:
      step = base + per_seq x running (+ per_kv x KV-cache use, where the engine reports it)
  from each request's mean inter-token gap over its decoding, the batch taken as the time
  average of the replica's running count over that span (a running integral: O(1)), less the
  prefill of the prompts whose first token came meanwhile (a step that prefills a prompt is
  longer by that prefill: learned above, subtracted here; as a regressor of its own it took
  the batch's share, the two rising together).

The running count is this gateway's own attempts on the replica, or the engine's reported
count where that is more (vLLM, fed by other gateways too). An attempt counts whole from its
first token and half before it: a request dispatched mid-step waits for that step, then joins
the batch for its prefill, so it is in the batch for about the second half of its time to
first token (counted whole, the batch came out 10-20 % high under load, and the step slope as
much too low). Everything is O(1) per request; nothing is done per token.

The model predicts each request's TTFT when it is dispatched, and keeps how far off that was:
a decayed mean absolute relative error (the MAPE) here, each request's error on its Outcome
for the metrics' histogram.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from laneway.core.latency.fit import LN2, DecayedFit
from laneway.core.latency.limit import ConcurrencyLimit
from laneway.engines.base import EngineLoad

HALF_LIFE_S = 15.0  # of every fit: the last minute or so of traffic counts
MIN_OBSERVATIONS = 3  # before which nothing is predicted
# Before a refusal may rest on the model (admission, core/admission.py): the decayed weight of
# recent observations behind its fits (three observations fit four coefficients only through
# the ridge, and a cold fit's extrapolation was seen 20x off), and its recent TTFT predictions'
# mean relative error (MAPE) at most this, out of at least TRUSTED_ERRORS predictions.
TRUSTED_WEIGHT = 5.0
TRUSTED_ERRORS = 4.0
TRUSTED_ERROR = 0.5

Reported = Callable[[], EngineLoad | None]


@dataclass(frozen=True, slots=True)
class LatencyReadings:
    """What a replica's model has learned, in seconds (None: not learned yet)."""

    prefill_s_per_token: float | None
    ttft_overhead_s: float | None
    ttft_s_per_queued_token: float | None
    ttft_s_per_running: float | None
    step_base_s: float | None
    step_s_per_seq: float | None
    step_s_per_kv: float | None  # None unless the engine reports its KV-cache use
    service_s: float | None  # mean time a request holds its slot (dispatch to its end)
    ttft_error: float | None  # decayed mean |predicted - actual| / actual of TTFT
    ttft_weight: float  # observations behind the fits, decayed (about the last 20 s's count)
    step_weight: float
    concurrency_limit: int | None = None  # the running limit learned against the TPOT targets (limit.py)

    def step_at(self, running: float, kv_usage: float = 0.0) -> float | None:
        if self.step_base_s is None or self.step_s_per_seq is None:
            return None
        return self.step_base_s + self.step_s_per_seq * running + (self.step_s_per_kv or 0.0) * kv_usage


def curve_points(max_concurrency: int) -> list[int]:
    """The batch sizes a step curve is shown at: 1, a quarter, half and all of the slots."""
    m = max(max_concurrency, 1)
    return sorted({1, max(1, m // 4), max(1, m // 2), m})


class ReplicaLatencyModel:
    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        # x: (its uncached prompt tokens, those queued ahead of it, batch size); y: seconds from
        # the slot to the first token.
        self.ttft = DecayedFit(4, half_life_s, floor=1e-3)
        # x: (mean batch size, mean KV use); y: seconds per decode step.
        self.step = DecayedFit(3, half_life_s, floor=1e-4)
        self.service = DecayedFit(1, half_life_s, floor=1e-3)  # y: seconds holding the slot
        self.kv_reported = False
        self._error_sum = 0.0  # decayed sum and weight of the TTFT predictions' relative errors
        self._error_w = 0.0
        self._error_at: float | None = None
        # The replica now: attempts running, uncached tokens waiting for their first token, and
        # the time integrals of the batch size and the KV use, and the uncached tokens prefilled
        # (first token reached) ever: an attempt's marks of these give its means.
        self.running = 0
        self.prefilling = 0  # of which have no first token yet
        self.pending_prefill = 0.0
        self._level = 0.0
        self._reported_running = 0.0  # the engine's own count, as last read
        self._kv = 0.0
        self._changed = 0.0
        self._area = 0.0
        self._kv_area = 0.0
        self.prefilled = 0.0
        self.limit: ConcurrencyLimit | None = None  # set once the engine's own limit is known
        self.active: dict[Attempt, None] = {}  # attempts running here, oldest first (their slots' ages)

    # ---- what it predicts ----
    def predict_step(self, running: float, kv_usage: float = 0.0) -> float | None:
        """Seconds per decode step with `running` sequences in the batch."""
        if self.step.count < MIN_OBSERVATIONS:
            return None
        return self.step.predict((running, kv_usage))

    def predict_ttft(self, uncached_tokens: float, queue_ahead: float = 0.0, running: float = 0.0) -> float | None:
        """Seconds from a slot here to the first token of a request with `uncached_tokens` to
        prefill, behind `queue_ahead` uncached prompt tokens not yet prefilled, joining a batch
        of `running` others."""
        if self.ttft.count < MIN_OBSERVATIONS:
            return None
        ttft = self.ttft.predict((uncached_tokens, queue_ahead, running + 1.0))
        return None if ttft is None else max(ttft, 0.0)

    def predict_wait(self, slots_ahead: float, running: float) -> float | None:
        """Seconds until `slots_ahead` slots free up, `running` sequences finishing one mean
        service time apart (a full replica's queue)."""
        if self.service.count < MIN_OBSERVATIONS:
            return None
        service = self.service.predict(())
        return None if service is None else slots_ahead * max(service, 0.0) / max(running, 1.0)

    def ttft_error(self, now: float) -> tuple[float, float] | None:
        """(the recent TTFT predictions' mean relative error, their decayed count); None before one."""
        if self._error_w <= 1e-9 or self._error_at is None:
            return None
        decay = math.exp(-LN2 * max(now - self._error_at, 0.0) / self.half_life_s)
        return self._error_sum / self._error_w, self._error_w * decay

    def trusted(self, now: float) -> bool:
        """Whether a refusal may rest on this model: warm (recent observations behind its TTFT
        and hold fits) and recently right (its TTFT predictions' MAPE small). Else admission
        lets the request wait, as it did before the model."""
        if self.ttft.weight(now) < TRUSTED_WEIGHT or self.service.weight(now) < TRUSTED_WEIGHT / 2:
            return False
        error = self.ttft_error(now)
        return error is not None and error[1] >= TRUSTED_ERRORS and error[0] <= TRUSTED_ERROR

    def slots_free_in(self, now: float, service: float) -> list[float]:
        """Seconds until each running attempt's slot frees: the mean hold less its age so far (0
        for one past the mean). Not memoryless: a slot held nearly a mean hold already frees
        soon, and counting a whole hold for it (one freeing every hold / slots) overshot a
        request queued behind one long stream on a one-slot engine by that stream's length."""
        return sorted(max(service - (now - a.dispatched), 0.0) for a in self.active)

    @property
    def predicts(self) -> bool:
        """Whether it predicts a TTFT and a slot's wait yet (both fits past MIN_OBSERVATIONS)."""
        return self.ttft.count >= MIN_OBSERVATIONS and self.service.count >= MIN_OBSERVATIONS

    @property
    def prefill_s_per_token(self) -> float | None:
        c = self.ttft.coefficients if self.ttft.count >= MIN_OBSERVATIONS else None
        return None if c is None else c[1]

    def readings(self, now: float | None = None) -> LatencyReadings:
        now = time.perf_counter() if now is None else now
        t = self.ttft.coefficients if self.ttft.count >= MIN_OBSERVATIONS else None
        s = self.step.coefficients if self.step.count >= MIN_OBSERVATIONS else None
        service = self.service.predict(()) if self.service.count >= MIN_OBSERVATIONS else None
        return LatencyReadings(
            prefill_s_per_token=None if t is None else t[1],
            ttft_overhead_s=None if t is None else t[0],
            ttft_s_per_queued_token=None if t is None else t[2],
            ttft_s_per_running=None if t is None else t[3],
            step_base_s=None if s is None else s[0],
            step_s_per_seq=None if s is None else s[1],
            step_s_per_kv=None if s is None or not self.kv_reported else s[2],
            service_s=service,
            ttft_error=self._error_sum / self._error_w if self._error_w > 1e-9 else None,
            ttft_weight=self.ttft.weight(now),
            step_weight=self.step.weight(now),
            concurrency_limit=None if self.limit is None else self.limit.value,
        )

    # ---- what it learns from ----
    def observe_ttft(self, now: float, uncached_tokens: float, ahead: float, batch: float, ttft_s: float) -> None:
        """A first token `ttft_s` after the slot, for `uncached_tokens` of its own behind `ahead`
        queued, with `batch` sequences running (itself included)."""
        self.ttft.add(now, (uncached_tokens, ahead, batch), ttft_s)

    def observe_decode(
        self, now: float, gaps: int, mean_gap_s: float, batch: float, kv_usage: float = 0.0, joined_tokens: float = 0.0
    ) -> None:
        """A decoding of `gaps` inter-token gaps averaging `mean_gap_s`, in a batch of `batch`
        sequences on average, while `joined_tokens` uncached prompt tokens were prefilled in
        the same steps. A request of a few tokens says less than a long one."""
        rate = max(self.prefill_s_per_token or 0.0, 0.0)
        self.step.add(now, (batch, kv_usage), mean_gap_s - rate * joined_tokens / gaps, weight=min(1.0, gaps / 4))

    def observe_service(self, now: float, held_s: float) -> None:
        self.service.add(now, (), held_s)

    def observe_error(self, now: float, relative_error: float) -> None:
        if self._error_at is not None and now > self._error_at:
            f = math.exp(-LN2 * (now - self._error_at) / self.half_life_s)
            self._error_sum *= f
            self._error_w *= f
        self._error_at = now if self._error_at is None else max(now, self._error_at)
        self._error_sum += min(relative_error, 10.0)  # one wild miss is not the mean
        self._error_w += 1.0

    # ---- the replica's running count, kept by its attempts ----
    def _advance(self, now: float, load: EngineLoad | None) -> None:
        """Close the integrals up to `now` and take the level after a change of count."""
        if now > self._changed:
            dt = now - self._changed
            self._area += self._level * dt
            self._kv_area += self._kv * dt
            self._changed = now
        if load is not None:
            self._reported_running = load.running
            self.kv_reported = True
            self._kv = load.kv_usage
        self._level = max(self.running - 0.5 * self.prefilling, self._reported_running)

    def marks(self, now: float) -> tuple[float, float, float]:
        """(running integral, KV-use integral, uncached tokens prefilled) as of `now`."""
        dt = max(now - self._changed, 0.0)
        return self._area + self._level * dt, self._kv_area + self._kv * dt, self.prefilled

    def begin(
        self,
        now: float,
        prompt_tokens: int,
        cached_tokens: int = 0,
        reported: Reported | None = None,
        tpot_target_s: float | None = None,
    ) -> Attempt:
        """A request took a slot here (dispatched): counted running until its attempt ends."""
        uncached = max(prompt_tokens - cached_tokens, 0)
        ahead = self.pending_prefill
        load = reported() if reported is not None else None
        batch = float(self.running + 1) if load is None else max(self.running + 1.0, load.running + 1.0)
        predicted = self.predict_ttft(uncached, ahead, batch - 1.0)
        self.running += 1
        self.prefilling += 1
        self.pending_prefill += uncached
        self._advance(now, load)
        attempt = Attempt(self, now, cached_tokens, uncached, ahead, batch, predicted, reported, tpot_target_s)
        self.active[attempt] = None
        return attempt

    def prefilled_now(self, now: float, uncached: int) -> None:
        """An attempt's first token: its prompt is prefilled, it decodes from here."""
        self.prefilling -= 1
        self.pending_prefill = max(self.pending_prefill - uncached, 0.0)
        self.prefilled += uncached
        self._advance(now, None)

    def leave(self, now: float, load: EngineLoad | None, unprefilled: int | None) -> None:
        """An attempt ended (`unprefilled`: its tokens, when it never reached a first token)."""
        self.running -= 1
        if unprefilled is not None:
            self.prefilling -= 1
            self.pending_prefill = max(self.pending_prefill - unprefilled, 0.0)
        self._advance(now, load)


class Attempt:
    """One request's attempt on one replica, from its slot to the end of its generation: what
    its replica's model learns from when it ends (end() is idempotent)."""

    __slots__ = (
        "_ended",
        "_mark",
        "_reported",
        "ahead",
        "batch",
        "cached",
        "dispatched",
        "error",
        "first_at",
        "model",
        "predicted",
        "tpot_target_s",
        "uncached",
    )

    def __init__(
        self,
        model: ReplicaLatencyModel,
        dispatched: float,
        cached: int,
        uncached: int,
        ahead: float,
        batch: float,
        predicted: float | None,
        reported: Reported | None,
        tpot_target_s: float | None = None,
    ) -> None:
        self.model = model
        self.dispatched = dispatched
        self.cached = cached  # prompt tokens the replica was estimated to hold
        self.uncached = uncached  # the rest, as measured at dispatch
        self.ahead = ahead  # uncached tokens sent there before it, not yet prefilled
        self.batch = batch  # sequences running when it started, itself included
        self.predicted = predicted  # its TTFT from the slot, as the model saw it then
        self.error: float | None = None  # |predicted - actual| / actual, once it has a first token
        self.first_at: float | None = None
        self.tpot_target_s = tpot_target_s  # its lane's, which its replica's limit is judged by
        self._reported = reported
        self._mark: tuple[float, float, float] | None = None
        self._ended = False

    def first_token(self, now: float) -> None:
        if self.first_at is not None or self._ended:
            return
        self.first_at = now
        self.model.prefilled_now(now, self.uncached)
        self._mark = self.model.marks(now)
        if self.predicted is not None:
            actual = max(now - self.dispatched, 1e-6)
            self.error = abs(self.predicted - actual) / actual
            self.model.observe_error(now, self.error)

    def end(self, prompt_tokens: int, tokens_per_choice: int, finished: bool, now: float | None = None) -> None:
        """The attempt's generation is over: `finished` when it ended well (a finish reason, not
        an error or a cancellation), having decoded `tokens_per_choice` tokens per choice;
        `prompt_tokens`: the engine's count where it reported one."""
        if self._ended:
            return
        self._ended = True
        model = self.model
        now = time.perf_counter() if now is None else now
        if self.first_at is not None and self._mark is not None:
            uncached = max(prompt_tokens - self.cached, 0)
            model.observe_ttft(now, uncached, self.ahead, self.batch, self.first_at - self.dispatched)
            span, gaps = now - self.first_at, tokens_per_choice - 1
            if finished and gaps >= 1 and span > 0:
                area, kv_area, prefilled = model.marks(now)
                batch = (area - self._mark[0]) / span
                kv = (kv_area - self._mark[1]) / span
                model.observe_decode(now, gaps, span / gaps, batch, kv, prefilled - self._mark[2])
                if model.limit is not None:
                    kv_now = model._kv
                    model.limit.observe(
                        self.dispatched,
                        now,
                        span / gaps,
                        self.tpot_target_s,
                        self.batch,
                        lambda n: model.predict_step(n, kv_now),
                        batch,
                    )
        if finished:
            model.observe_service(now, now - self.dispatched)
        load = self._reported() if self._reported is not None else None
        model.active.pop(self, None)
        model.leave(now, load, None if self.first_at is not None else self.uncached)
