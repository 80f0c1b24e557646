"""The dashboard's window over the Prometheus metrics, the SVG chart geometry, and how the UI
words limits, errors and audit changes."""

from __future__ import annotations

import math

from laneway.admin.charts import Series, lines, nice_ceiling, stacked_bars
from laneway.admin.live import LiveFigures, histogram_quantile
from laneway.admin.presentation import audit_changes, field_message, iso_utc, typed_tenant
from laneway.metrics import GatewayMetrics

LABELS = ("interactive", "sim", "sim", "sim", "sim")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _requests(metrics: GatewayMetrics, n: int, *, status: int = 200, ttft_s: float = 0.03, lane: str = "") -> None:
    labels = (lane or LABELS[0], *LABELS[1:])
    for _ in range(n):
        metrics.requests.labels(*labels, str(status)).inc()
        metrics.prompt_tokens.labels(*labels).inc(10)
        metrics.completion_tokens.labels(*labels).inc(4)
        metrics.ttft.labels(*labels).observe(ttft_s)


def test_histogram_quantile_interpolates_like_promql() -> None:
    buckets = {0.01: 0.0, 0.05: 10.0, 0.1: 20.0, math.inf: 20.0}
    assert histogram_quantile(0.5, buckets) == 0.05
    assert abs(histogram_quantile(0.25, buckets) - 0.03) < 1e-12  # type: ignore[operator]
    assert abs(histogram_quantile(0.75, buckets) - 0.075) < 1e-12  # type: ignore[operator]
    assert histogram_quantile(0.99, {1.0: 0.0, math.inf: 5.0}) == 1.0  # past the last bound: that bound
    assert histogram_quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None


def test_the_window_forgets_what_is_older_than_it() -> None:
    metrics, clock = GatewayMetrics(), Clock()
    live = LiveFigures(metrics, window_s=300, sample_every_s=5, clock=clock)
    _requests(metrics, 8, ttft_s=0.03)
    _requests(metrics, 2, status=503, ttft_s=0.4)
    clock.now += 10
    view = live.read()
    (lane,) = view.lanes
    assert (lane.lane, lane.requests, lane.errors, lane.prompt_tokens, lane.completion_tokens) == (
        "interactive",
        10,
        2,
        100,
        40,
    )
    assert abs(lane.per_s - 1.0) < 1e-9 and view.span_s == 10
    assert 25 < lane.ttft_ms[0.5] < 50  # type: ignore[operator]  # inside the 25-50 ms bucket
    assert 250 < lane.ttft_ms[0.99] <= 500  # type: ignore[operator]

    for _ in range(70):  # reads every 5 s for ~6 minutes, with no new traffic
        clock.now += 5
        live.read()
    quiet = live.read()
    assert quiet.lanes == [] and 300 <= quiet.span_s < 310  # the old requests left the window

    _requests(metrics, 3, lane="batch")
    clock.now += 5
    (batch,) = live.read().lanes
    assert batch.lane == "batch" and batch.requests == 3


def test_after_nobody_looked_the_span_says_so() -> None:
    metrics, clock = GatewayMetrics(), Clock()
    live = LiveFigures(metrics, window_s=300, clock=clock)
    _requests(metrics, 4)
    clock.now += 3600
    view = live.read()
    assert view.span_s == 3600 and view.lanes[0].requests == 4  # measured since the last sample, and labelled so
    clock.now += 400
    assert live.read().lanes == []


def test_refusals_before_admission_are_counted_by_code() -> None:
    metrics, clock = GatewayMetrics(), Clock()
    live = LiveFigures(metrics, clock=clock)
    for _ in range(3):
        metrics.refused("/v1/chat/completions", 401, "invalid_api_key")
    metrics.refused("/admin/tenants/{tenant_id:int}", 404, "not_found")  # the admin's own pages: not traffic
    clock.now += 1
    assert live.read().refused == [(401, "invalid_api_key", 3)]


def test_chart_geometry() -> None:
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 7, 10, 11, 420, 5001)] == [1, 0.5, 1, 10, 10, 20, 500, 10000]
    chart = stacked_bars(
        "c", "Requests", ["a", "b", "c"], [Series("ok", "#00f", [4, 0, 2]), Series("err", "#f00", [1, None, 0])]
    )
    assert not chart.empty and len(chart.bars) == 3  # zero and missing values draw nothing
    ok_a, err_a = chart.bars[0], chart.bars[1]
    assert abs(err_a.y + err_a.h - ok_a.y) < 0.02  # stacked: errors sit on top of the successes
    assert abs(ok_a.h / err_a.h - 4) < 0.01 and "a: err 1" in err_a.title
    assert [t for _, t in chart.x_ticks] == ["a", "b", "c"]

    ttft = lines("t", "TTFT", ["1", "2", "3", "4"], [Series("p50", "#00f", [10.0, 20.0, None, 5.0])], unit=" ms")
    assert len(ttft.lines) == 1 and ttft.lines[0].points.count(",") == 2  # the gap breaks the line
    assert len(ttft.dots) == 3  # the lone point after the gap still shows
    assert lines("e", "TTFT", ["1"], [Series("p50", "#00f", [None])]).empty


def test_words_for_people() -> None:
    assert field_message("rpm", "rpm must be a whole number, at least 1.").startswith("Requests per minute must be")
    assert field_message("priority_floor", "kept as it is") == "kept as it is"
    shown = typed_tenant(
        {"name": "acme", "rpm": 5, "disabled": True, "allowed_models": ["a"]},
        {"csrf_token": "x", "rpm": "0", "allowed_models": "b, c,"},
    )
    assert shown == {"name": "acme", "rpm": "0", "disabled": False, "allowed_models": ["b", "c"]}
    assert iso_utc(None) == ""
    changes = audit_changes(
        {"id": 1, "rpm": None, "tpm": 10, "allowed_models": ["a"]},
        {"id": 1, "rpm": 60, "tpm": 10, "allowed_models": ["a", "b"]},
    )
    assert changes == [("rpm", "(none)", "60"), ("allowed_models", "a", "a, b")]
    created = audit_changes(None, {"id": 7, "name": "acme", "revoked_at": "2026-12-03T10:00:00.5+00:00"})
    assert created == [("name", "", "acme"), ("revoked_at", "", "2026-12-03T10:00:00Z")]
