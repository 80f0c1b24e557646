"""Load shedding by the gateway's own saturation, before any work is spent on a request.

When the event loop runs behind, a new request would only wait for the loop, time out at the
client, and take CPU from the requests that can still make it: goodput collapses while every
client waits (measured: 110 -> 23 requests a second at 5x capacity). So the HTTP protocol asks
this object, as soon as a request's headers are parsed and before the app sees it, whether
to let it in, and if not answers a prepared 503 `overloaded` + Retry-After itself (tens of
microseconds: no routing, auth or JSON). Three signals, each with its reason in
`laneway_shed_total{reason}`:

- `cpu` (off unless `cpu_target` is set): the event loop's thread is busy more than
  `cpu_target` of the time (its CPU time
  over wall time, read every 50 ms tick of the loop-lag monitor) while API requests arrive at
  `min_rate` a second or more. Then only a fraction of new API requests is let in, adjusted
  each tick so the loop stays at the target: `admit *= target / busy` (a proportional step,
  so at 5x the demand it closes in a few ticks; halved again while the loop also runs behind),
  and it opens the same way once the loop has room. Admitting is deterministic (a credit of
  `admit` per arrival), never random. This is the signal that keeps refusals fast: it acts
  while the loop still has spare time to refuse in, where a loop delay is only seen once every
  request already waits for it. Its price, measured at 5x (bench/overhead.py): a loop kept
  below saturation does less work per request in each turn, so goodput falls (-37 % at 0.9,
  -21 % at 0.97) while refusals (1.4 vs 8 ms p50) and successes (7 vs 44 ms p50) get faster.
  Hence off by default: a choice of latency over throughput for the operator to make.

- `backlog`: more than `max_preparing` API requests are between their headers and their
  place in an engine's queue (reading the body, auth, measuring, the rate-limit reserve), or
  more than `standing_preparing` once that many have stood there for `standing_s`.
  That phase is CPU work and a few awaits, so this count is the backlog of work the loop owes
  right now; a request waiting for an engine slot or streaming tokens is not in it, so long
  generations never count against it. It sees a burst in the very loop turn that reads it,
  where a delay is only seen once the loop has fallen behind. Counted by a `Preparing`
  token per request (the protocol makes it, the pipeline ends it when the request queues,
  the protocol again when its response ends or its connection goes: it cannot leak).
  Two caps, because a burst and a flood look alike for an instant and differ in how long
  they last (CoDel's good queue and bad queue): a client sending 40 requests at once fills
  the backlog in one read and the loop empties it in tens of milliseconds, while a sustained
  excess keeps it full. A backlog of 64 lets the burst in, but under a flood it means every
  admitted request waits behind 63 others and the loop runs ~20 ms behind (goodput 0.52 of
  capacity at 5x, measured); 16 holds the flood's latency down (1.12 of capacity) but would
  refuse the burst's tail. So: the hard cap `max_preparing` at any moment, and the low cap
  `standing_preparing` once arrivals have kept finding that many ahead of them, with no gap
  of `standing_s`, for `standing_s`.
- `loop_lag`: how late a request starts after its headers arrived (measured on every
  request) or the loop-lag monitor's timer fires. A delay over `max_delay_s` while API
  requests arrive at `min_rate` a second or more sheds new API requests for `hold_s`.

Requests already in progress and streams are never cut.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

REASONS = ("cpu", "backlog", "loop_lag")
MIN_ADMIT = 0.02  # never shut the door completely: the fraction let in keeps measuring


class Preparing:
    """One admitted API request until it reaches an engine's queue (or ends). It counts in
    `shedder.preparing` only while the loop owes it work: from its whole body's arrival (a
    client still sending is no work), minus its waits on Redis or the database (see
    `waiting_elsewhere`)."""

    __slots__ = ("_counted", "_shedder")

    def __init__(self, shedder: LoadShedder, *, counting: bool = True) -> None:
        self._shedder: LoadShedder | None = shedder
        self._counted = False
        if counting:
            self.start()

    def start(self) -> None:
        """Count it (again); nothing once done."""
        if self._shedder is not None and not self._counted:
            self._shedder.preparing += 1
            self._counted = True

    def pause(self) -> bool:
        """Uncount it; -> whether it was counted."""
        if self._shedder is not None and self._counted:
            self._shedder.preparing -= 1
            self._counted = False
            return True
        return False

    def done(self) -> None:
        """Idempotent: the first caller ends it."""
        self.pause()
        self._shedder = None


# The running request's token, set by the server's ASGI wrapper for the request's task (and
# so seen by the tasks it starts).
current: ContextVar[Preparing | None] = ContextVar("laneway_preparing", default=None)


def queued() -> None:
    """The running request is prepared: it waits for an engine slot now, not for the loop."""
    token = current.get()
    if token is not None:
        token.done()


@contextmanager
def waiting_elsewhere() -> Iterator[None]:
    """The running request waits on another service (the rate limiter's Redis, the database
    for an API key): not work this loop owes, so it leaves the backlog count meanwhile. Else a
    slow Redis would have requests refused `overloaded` by a loop with nothing to do."""
    token = current.get()
    if token is None or not token.pause():  # none, or not counted (its body still coming)
        yield
        return
    try:
        yield
    finally:
        token.start()


class LoadShedder:
    def __init__(
        self,
        max_delay_s: float = 0.02,
        hold_s: float = 0.05,
        min_rate: float = 200.0,
        max_preparing: int = 64,
        standing_preparing: int = 16,
        standing_s: float = 0.1,
        cpu_target: float = 0.0,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.max_delay_s = max_delay_s
        self.hold_s = hold_s
        # A delay only means saturation under load: a garbage-collection pause while a few
        # requests a second arrive is not a reason to refuse any of them.
        self.min_arrivals = max(1, int(min_rate * _WINDOW_S))
        self.max_preparing = max_preparing
        self.standing_preparing = standing_preparing
        self.standing_s = standing_s
        self._pressure_since = self._pressed_at = -1e9  # arrivals that found a standing backlog
        self.clock = clock
        # cpu: the loop's busy target (0: off), the loop thread's CPU clock, the fraction of new
        # API requests let in, and its credit (admit per arrival; a request passes at 1).
        self.cpu_target = cpu_target
        self.cpu_clock = cpu_clock
        self.admit = 1.0
        self.busy = 0.0  # the loop thread's busy share over the last tick (smoothed)
        self._credit = 0.0
        self._ticked: tuple[float, float] | None = None  # (wall, cpu) at the last tick
        self._until = 0.0
        self._window_start = 0.0
        self._arrivals = 0  # API requests whose headers arrived in the current window
        self._previous = 0  # ... and in the one before it
        self.preparing = 0  # API requests between their headers and an engine's queue
        self.on_wake: Callable[[], None] | None = None  # called on the first arrival after a quiet spell
        self.shed_by = dict.fromkeys(REASONS, 0)  # requests refused, ever, by reason

    @property
    def enabled(self) -> bool:
        return self.max_delay_s > 0

    @property
    def shed(self) -> int:
        return sum(self.shed_by.values())

    def arrived(self) -> None:
        now = self.clock()
        if now - self._window_start >= _WINDOW_S:
            self._previous = self._arrivals if now - self._window_start < 2 * _WINDOW_S else 0
            if not self._previous and self.on_wake is not None:
                self.on_wake()  # the first arrival in two windows: the loop-lag ticks speed up
            self._arrivals, self._window_start = 0, now
        self._arrivals += 1

    def quiet(self) -> bool:
        """No API request arrived in this window or the one before (the loop-lag monitor's
        long ticks)."""
        if self.clock() - self._window_start >= 2 * _WINDOW_S:
            return True
        return self._arrivals + self._previous == 0

    def observe(self, delay_s: float) -> None:
        """A delay the loop just imposed (a request's start, a timer's firing)."""
        if self.enabled and delay_s > self.max_delay_s and self._arrivals + self._previous >= self.min_arrivals:
            self._until = self.clock() + self.hold_s

    def tick(self, lag_s: float = 0.0) -> None:
        """The loop-lag monitor's tick (on the loop's thread, every ~50 ms): read how busy the
        loop was since the last one and set the fraction of new API requests let in."""
        self.observe(lag_s)
        if not self.enabled or self.cpu_target <= 0:
            return  # the cpu signal is off (the default): no clock to read
        now, cpu = self.clock(), self.cpu_clock()
        last, self._ticked = self._ticked, (now, cpu)
        if last is None or now <= last[0]:
            return
        busy = min(1.0, max(0.0, (cpu - last[1]) / (now - last[0])))
        self.busy = busy = (self.busy + busy) / 2  # two ticks: one slow callback is not a trend
        if self._arrivals + self._previous < self.min_arrivals:
            self.admit = 1.0  # a busy loop at a low rate (a long prompt, a collection): not load
            return
        # Proportional: at busy b with a fraction p let in, p * target / b would have hit the
        # target. A saturated loop reads 1.0 whatever the excess, so a loop that is also behind
        # closes twice as fast.
        factor = self.cpu_target / max(busy, 1e-3)
        if lag_s > self.max_delay_s:
            factor = min(factor, 0.5)
        self.admit = min(1.0, max(MIN_ADMIT, self.admit * factor))

    def overloaded(self) -> bool:
        return self.enabled and self.clock() < self._until

    def calm(self) -> bool:
        """True when refusal() would let a request in whatever its timing: no backlog at
        either cap, no loop-lag hold, the cpu signal admitting all. No side effects (the
        door asks it before reading a request's headers for the parser-free refusal)."""
        n = self.preparing
        return not self.enabled or (
            self.admit >= 1.0
            and not 0 < self.standing_preparing <= n
            and not 0 < self.max_preparing <= n
            and self.clock() >= self._until
        )

    def refusal(self) -> str | None:
        """Why a new API request must be refused now (a reason of REASONS, counted), or None."""
        if not self.enabled:
            return None
        if self.admit < 1.0 and self._refuse_for_cpu():
            reason = "cpu"
        elif self._backlogged():
            reason = "backlog"
        elif self.clock() < self._until:
            reason = "loop_lag"
        else:
            return None
        self.shed_by[reason] += 1
        return reason

    def _backlogged(self) -> bool:
        n = self.preparing
        low = self.standing_preparing
        if 0 < low <= n:  # pressure: this arrival finds the low cap's worth ahead of it
            now = self.clock()
            if now - self._pressed_at > self.standing_s:  # after a gap: a new episode (a burst?)
                self._pressure_since = now
            self._pressed_at = now
            if now - self._pressure_since >= self.standing_s:  # it stood: a flood, not a burst
                return True
        return 0 < self.max_preparing <= n

    def _refuse_for_cpu(self) -> bool:
        self._credit += self.admit
        if self._credit >= 1.0:
            self._credit -= 1.0
            return False
        return True


_WINDOW_S = 0.1
