"""The overview's history charts: what happened per minute over the last hour, or per 10 minutes over the
last 24 hours (:mod:`celery_redisdelay.operations.history`), laid out here as plain numbers and drawn as SVG
by ``_history.html``. The page's script fetches the same fragment again every few seconds."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..operations.history import EVENTS, History, Minute, per_bucket, read_history
from .overview import tidy_step

#: The windows offered: name -> (minutes read, minutes per point, title).
WINDOWS = {"1h": (60, 1, "last hour, per minute"), "24h": (1440, 10, "last 24 hours, per 10 minutes")}
#: The charts: title, then (event, CSS class) per line drawn.
FLOW = (
    "Calls per {step}",
    [("parked", "s-parked"), ("released", "s-released"), ("acked", "s-acked"), ("limited", "s-limited")],
)
TROUBLE = (
    "Trouble per {step}",
    [("swept", "s-swept"), ("dead_lettered", "s-dead"), ("cancelled", "s-cancelled")],
)
LATENESS = ("Release lateness (ms)", [("p50", "s-p50"), ("p99", "s-p99")])
WIDTH, HEIGHT = 560, 170
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 10, 22


@dataclass(frozen=True)
class Line:
    name: str
    tone: str  # CSS class of the stroke and of its legend swatch
    points: str  # SVG polyline points, "x,y x,y ..."
    dots: list[tuple[float, float, str]]  # a point per step that has a value: x, y, tooltip
    summary: str  # in the legend: the window's total, or its quantile


@dataclass(frozen=True)
class LineChart:
    title: str
    width: int
    height: int
    lines: list[Line]
    grid: list[tuple[float, int]]  # y, value
    labels: list[tuple[float, str, str]]  # x, text, text-anchor (the last one ends at the right edge)


def history_view(rd: Any, window: str) -> dict[str, Any]:
    """Everything ``_history.html`` draws for ``window`` (a key of :data:`WINDOWS`)."""
    minutes, step, title = WINDOWS[window]
    history = read_history(rd.depot, minutes)
    points = per_bucket(history.minutes, step)
    unit = "minute" if step == 1 else f"{step} minutes"
    totals = history.totals()
    charts = [
        _counts_chart(FLOW[0].format(step=unit), FLOW[1], points, totals, step),
        _counts_chart(TROUBLE[0].format(step=unit), TROUBLE[1], points, totals, step),
        _lateness_chart(points, history, step),
    ]
    age = None if history.last_release is None else max(0.0, history.now - history.last_release)
    return {
        "window": window,
        "windows": {name: spec[2] for name, spec in WINDOWS.items()},
        "title": title,
        "charts": charts,
        "totals": totals,
        "labels": EVENTS,
        "last_release_age": age,
        "read_at": time.strftime("%H:%M:%S", time.gmtime(history.now)),
    }


def _counts_chart(
    title: str, series: list[tuple[str, str]], points: list[Minute], totals: dict[str, int], step: int
) -> LineChart:
    values: dict[str, list[float | None]] = {
        name: [float(point.counts[name]) for point in points] for name, _ in series
    }
    lines: list[Series] = [
        (EVENTS[name], tone, values[name], f"{totals[name]:,}", lambda v: f"{v:,.0f}") for name, tone in series
    ]
    return _chart(title, lines, points, step)


def _lateness_chart(points: list[Minute], history: History, step: int) -> LineChart:
    lines: list[Series] = []
    for name, tone in LATENESS[1]:
        quantile = 0.5 if name == "p50" else 0.99
        values = [point.lateness_ms(quantile) for point in points]
        whole = history.lateness_ms(quantile)
        lines.append((name, tone, values, "-" if whole is None else f"{whole:,.0f} ms", lambda v: f"{v:,.0f} ms"))
    return _chart(LATENESS[0], lines, points, step)


#: A line to draw: its name, CSS class, a value per point (None: nothing to show), legend summary, tooltip format.
Series = tuple[str, str, list[float | None], str, Callable[[float], str]]


def _chart(title: str, lines: list[Series], points: list[Minute], step: int) -> LineChart:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    peak = math.ceil(max([value for _, _, values, _, _ in lines for value in values if value is not None] + [1.0]))
    grid_step = tidy_step(peak)
    ceiling = grid_step * -(-peak // grid_step)
    slot = plot_w / max(1, len(points) - 1)

    def x_of(index: int) -> float:
        return round(LEFT + index * slot, 1)

    def y_of(value: float) -> float:
        return round(TOP + plot_h - plot_h * value / ceiling, 1)

    drawn = []
    for name, tone, values, summary, fmt in lines:
        coords = [
            (x_of(i), y_of(v), _when(points[i], step) + f": {fmt(v)}") for i, v in enumerate(values) if v is not None
        ]
        drawn.append(Line(name, tone, " ".join(f"{x},{y}" for x, y, _ in coords), coords, summary))
    grid = [(y_of(value), value) for value in range(0, ceiling + 1, grid_step)]
    every = max(1, len(points) // 6)
    labels = [
        (x_of(i), time.strftime("%H:%M", time.gmtime(points[i].start)), "end" if i == len(points) - 1 else "middle")
        for i in range(len(points) - 1, -1, -every)
    ]
    return LineChart(title, WIDTH, HEIGHT, drawn, grid, labels)


def _when(point: Minute, step: int) -> str:
    start = time.strftime("%H:%M", time.gmtime(point.start))
    return start if step == 1 else f"{start}-{time.strftime('%H:%M', time.gmtime(point.start + step * 60))}"
