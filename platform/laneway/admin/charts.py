"""Server-rendered SVG charts: the geometry is computed here, the template draws it.

No JavaScript charting library: the page stays under a CSP of 'self' only, renders the same
without JavaScript, and an htmx refresh swaps a fragment that already holds the drawing. The
viewBox makes a chart scale down to a phone's width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

WIDTH, HEIGHT = 640, 180
LEFT, RIGHT, TOP, BOTTOM = 56, 8, 10, 24  # room for the axis labels


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    fill: str
    title: str


@dataclass(frozen=True)
class Line:
    points: str
    stroke: str
    label: str


@dataclass(frozen=True)
class Dot:
    x: float
    y: float
    fill: str
    title: str


@dataclass(frozen=True)
class Series:
    label: str
    color: str
    values: Sequence[float | None]


@dataclass
class Chart:
    id: str
    title: str
    unit: str
    width: int = WIDTH
    height: int = HEIGHT
    bars: list[Rect] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    dots: list[Dot] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)
    empty: bool = True

    @property
    def plot_bottom(self) -> float:
        return self.height - BOTTOM


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above value (an axis maximum)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)


def short_number(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1_000:
        return f"{value / 1_000:g}k"
    return f"{value:g}"


def _frame(chart: Chart, top: float, labels: Sequence[str], unit: str) -> tuple[float, float]:
    """Axis ticks; returns (the width of one slot, pixels per unit)."""
    plot_w = chart.width - LEFT - RIGHT
    plot_h = chart.plot_bottom - TOP
    slot = plot_w / max(1, len(labels))
    chart.y_ticks = [(chart.plot_bottom - plot_h * f, f"{short_number(top * f)}{unit}") for f in (0.0, 0.5, 1.0)]
    if labels:
        picks = sorted({0, len(labels) // 2, len(labels) - 1})
        chart.x_ticks = [(LEFT + slot * i + slot / 2, labels[i]) for i in picks]
    return slot, plot_h / top


def stacked_bars(chart_id: str, title: str, labels: Sequence[str], series: Sequence[Series], unit: str = "") -> Chart:
    """One bar per slot, each series stacked on the one before (a missing value is 0)."""
    chart = Chart(chart_id, title, unit, legend=[(s.label, s.color) for s in series])
    totals = [sum(float(s.values[i] or 0) for s in series) for i in range(len(labels))]
    chart.empty = not any(totals)
    slot, scale = _frame(chart, nice_ceiling(max(totals, default=0)), labels, unit)
    for i, label in enumerate(labels):
        base = chart.plot_bottom
        for s in series:
            value = float(s.values[i] or 0)
            if value <= 0:
                continue
            h = value * scale
            chart.bars.append(
                Rect(
                    round(LEFT + slot * i + slot * 0.12, 2),
                    round(base - h, 2),
                    round(slot * 0.76, 2),
                    round(h, 2),
                    s.color,
                    f"{label}: {s.label} {value:,.0f}{unit}",
                )
            )
            base -= h
    return chart


def lines(chart_id: str, title: str, labels: Sequence[str], series: Sequence[Series], unit: str = "") -> Chart:
    """A polyline per series through each slot's centre; a slot without a value breaks the line
    (no request there is not a zero), and a lone point still shows as a dot."""
    chart = Chart(chart_id, title, unit, legend=[(s.label, s.color) for s in series])
    present = [float(v) for s in series for v in s.values if v is not None]
    chart.empty = not present
    slot, scale = _frame(chart, nice_ceiling(max(present, default=0)), labels, unit)
    for s in series:
        run: list[str] = []
        for i, value in enumerate([*s.values, None]):
            if value is None:
                if len(run) > 1:
                    chart.lines.append(Line(" ".join(run), s.color, s.label))
                run = []
                continue
            x, y = round(LEFT + slot * i + slot / 2, 2), round(chart.plot_bottom - float(value) * scale, 2)
            run.append(f"{x},{y}")
            chart.dots.append(Dot(x, y, s.color, f"{labels[i]}: {s.label} {float(value):,.1f}{unit}"))
    return chart
