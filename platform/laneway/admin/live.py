"""The dashboard's live figures, read from this replica's Prometheus metrics (GatewayMetrics),
not from the usage table: a 2-second poll must cost a few dictionary walks, not a scan.

The metrics are cumulative since start, so a window is the difference between now and a
snapshot taken earlier. Snapshots are taken when the dashboard is read (at most one per
`sample_every_s`; no background task) and kept for `window_s`; the baseline is the newest
snapshot at least `window_s` old, else the oldest one, so the span shown is the span measured
(longer after nobody looked for a while, shorter just after start). TTFT percentiles are
interpolated within the histogram's buckets, as PromQL's histogram_quantile does: an estimate
as fine as the buckets (metrics.LATENCY_BUCKETS).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from laneway.metrics import GatewayMetrics

QUANTILES = (0.5, 0.95, 0.99)


@dataclass
class LaneCounts:
    requests: float = 0.0
    errors: float = 0.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    ttft_buckets: dict[float, float] = field(default_factory=dict)  # upper bound (s) -> cumulative count

    def minus(self, earlier: LaneCounts | None) -> LaneCounts:
        if earlier is None:
            return self
        return LaneCounts(
            self.requests - earlier.requests,
            self.errors - earlier.errors,
            self.prompt_tokens - earlier.prompt_tokens,
            self.completion_tokens - earlier.completion_tokens,
            {le: n - earlier.ttft_buckets.get(le, 0.0) for le, n in self.ttft_buckets.items()},
        )


@dataclass(frozen=True)
class Snapshot:
    at: float
    lanes: dict[str, LaneCounts]
    refused: dict[tuple[int, str], float]  # (status, code) -> refusals before admission


@dataclass(frozen=True)
class LaneFigures:
    lane: str
    requests: int
    errors: int
    per_s: float
    prompt_tokens: int
    completion_tokens: int
    ttft_n: int
    ttft_ms: dict[float, float | None]


@dataclass(frozen=True)
class LiveView:
    span_s: float
    lanes: list[LaneFigures]
    refused: list[tuple[int, str, int]]

    @property
    def requests(self) -> int:
        return sum(f.requests for f in self.lanes) + sum(n for _, _, n in self.refused)


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """The q-quantile (seconds) of cumulative `buckets` (le -> count), linear within a bucket;
    past the last finite bound it is that bound (the histogram knows no more)."""
    ordered = sorted(buckets.items())
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return lower
            inside = count - below
            return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = le, count
    return lower


def _samples(metric: Any) -> Iterable[Any]:
    for family in metric.collect():
        yield from family.samples


class LiveFigures:
    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        window_s: float = 300.0,
        sample_every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self.window_s = window_s
        self._every = sample_every_s
        self._clock = clock
        self._kept: deque[Snapshot] = deque([self._snapshot()])

    def _snapshot(self) -> Snapshot:
        m = self._metrics
        lanes: dict[str, LaneCounts] = {}

        def lane(labels: dict[str, str]) -> LaneCounts:
            return lanes.setdefault(labels.get("lane") or "-", LaneCounts())

        for s in _samples(m.requests):
            if s.name.endswith("_total"):
                counts = lane(s.labels)
                counts.requests += s.value
                if int(s.labels.get("status", "0")) >= 400:
                    counts.errors += s.value
        for metric, attr in ((m.prompt_tokens, "prompt_tokens"), (m.completion_tokens, "completion_tokens")):
            for s in _samples(metric):
                if s.name.endswith("_total"):
                    counts = lane(s.labels)
                    setattr(counts, attr, getattr(counts, attr) + s.value)
        for s in _samples(m.ttft):
            if s.name.endswith("_bucket"):
                buckets = lane(s.labels).ttft_buckets
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
        refused: dict[tuple[int, str], float] = {}
        for s in _samples(m.refusals):
            # The API's refusals (auth, validation, unknown model); not the admin pages' own 404s.
            if s.name.endswith("_total") and s.labels["endpoint"].startswith("/v1"):
                key = (int(s.labels["status"]), s.labels["code"] or "-")
                refused[key] = refused.get(key, 0.0) + s.value
        return Snapshot(self._clock(), lanes, refused)

    def read(self) -> LiveView:
        now = self._snapshot()
        kept = self._kept
        if now.at - kept[-1].at >= self._every:
            kept.append(now)
        # Drop what an older-than-the-window snapshot makes redundant as a baseline.
        while len(kept) > 1 and kept[1].at <= now.at - self.window_s:
            kept.popleft()
        base = kept[0]
        span = max(now.at - base.at, 1e-9)
        figures = []
        for name in sorted(now.lanes):
            d = now.lanes[name].minus(base.lanes.get(name))
            if d.requests <= 0 and not any(d.ttft_buckets.values()):
                continue
            n = max(d.ttft_buckets.values(), default=0.0)
            ttft = {q: None if (v := histogram_quantile(q, d.ttft_buckets)) is None else v * 1000 for q in QUANTILES}
            figures.append(
                LaneFigures(
                    name,
                    round(d.requests),
                    round(d.errors),
                    d.requests / span,
                    round(d.prompt_tokens),
                    round(d.completion_tokens),
                    round(n),
                    ttft,
                )
            )
        refused = [
            (status, code, round(n - base.refused.get((status, code), 0.0)))
            for (status, code), n in now.refused.items()
        ]
        refused.sort(key=lambda r: (-r[2], r[0]))
        return LiveView(span, figures, [r for r in refused if r[2] > 0])
