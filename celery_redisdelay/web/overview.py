"""What the overview page shows: counts over all shards, the queues' latency, parked calls by due time, and by task
name.

Every read is bounded whatever the backlog (:mod:`celery_redisdelay.operations.counts`): the due-time histograms are
one ``ZCOUNT`` per bar and shard, and the split by task reads the metadata of a sample of at most ``SAMPLE`` parked
calls; the page says when it is an estimate. The bar charts are laid out here, as plain numbers, and drawn as SVG by
the template: no script, nothing from outside.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..operations import counts
from ..operations.listing import server_ms
from ..operations.queues import LAG_MINUTES, queue_figures

if TYPE_CHECKING:
    from ..extension import RedisDelay

MINUTE_MS, HOUR_MS = 60_000, 3_600_000
#: Parked calls whose metadata is read for the split by task (over all shards).
SAMPLE = 2000
#: Tasks shown by name; the others are added up as one bar.
TOP_TASKS = 8


STATE_TITLES = {
    "delayed": "Delayed",
    "limited": "Held by limits",
    "paused": "Paused",
    "inflight": "In flight",
    "dead": "Dead",
}


def state_counts(rd: RedisDelay) -> dict[str, int]:
    """Calls per state over all shards, in the order of :data:`STATE_TITLES`."""
    found = counts.state_counts(rd.depot)
    return {state: found[state] for state in STATE_TITLES}


@dataclass(frozen=True)
class Bar:
    label: str  # under the bar (may be empty: the axis shows every few)
    count: int
    title: str  # the tooltip: the bar's span and its count
    tone: str = ""  # a CSS class: "late" for calls already due


@dataclass(frozen=True)
class Chart:
    """A bar chart laid out for an SVG of ``width`` x ``height``: each bar as (x, y, w, h, bar), the
    gridlines as (y, value), and the axis labels as (x, text)."""

    width: int
    height: int
    bars: list[tuple[float, float, float, float, Bar]]
    grid: list[tuple[float, int]]
    labels: list[tuple[float, str]]
    total: int


def limit_rows(rd: RedisDelay, limits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The limits as ``status`` gives them (see :mod:`celery_redisdelay.operations.limits`), each with ``next_in``:
    seconds until its next waiting call may go (None when none waits)."""
    now = server_ms(rd.depot)
    return [
        {**row, "next_in": None if row["next_ms"] is None else max(row["next_ms"] - now, 0.0) / 1000} for row in limits
    ]


def queue_rows(rd: RedisDelay) -> dict[str, Any]:
    """The queues' latency (see :mod:`celery_redisdelay.operations.queues`): a row per queue, the release lag of all
    queues, and whether the store's counts are estimated."""
    figures = queue_figures(rd.depot)
    first = next(iter(figures.values()), None)
    return {
        "rows": [{"name": name, **found.as_dict()} for name, found in figures.items()],
        "lag_p50": first and first.release_lag_p50_seconds,
        "lag_p99": first and first.release_lag_p99_seconds,
        "lag_minutes": LAG_MINUTES,
        "estimated": any(found.estimated for found in figures.values()),
    }


def due_histogram(rd: RedisDelay) -> dict[str, Any]:
    """Parked calls due already, in each 5 minutes of the next hour, each hour of the next day, and later."""
    hour = [(step * 5 * MINUTE_MS, (step + 1) * 5 * MINUTE_MS) for step in range(12)]
    day = [(step * HOUR_MS, (step + 1) * HOUR_MS) for step in range(24)]
    windows = [*hour, *day, (24 * HOUR_MS, None)]
    found = counts.due_counts(rd.depot, windows)  # the first: already due
    due, hour_counts, day_counts, later = found[0], found[1:13], found[13:37], found[37]
    hour_bars = [Bar("due", due, f"already due: {due:,}", "late")]
    for step, count in enumerate(hour_counts):
        label = f"{(step + 1) * 5}m" if step % 3 == 2 else ""
        hour_bars.append(Bar(label, count, f"due in {step * 5}-{(step + 1) * 5} min: {count:,}"))
    day_bars = [
        Bar(f"{step + 1}h" if step % 4 == 3 else "", count, f"due in {step}-{step + 1} h: {count:,}")
        for step, count in enumerate(day_counts)
    ]
    return {
        "due": due,
        "next_hour": sum(hour_counts),
        "next_day": sum(day_counts),
        "later": later,
        "hour": layout(hour_bars),
        "day": layout(day_bars),
    }


def tasks_sample(rd: RedisDelay, sample: int = SAMPLE) -> dict[str, Any]:
    """Parked calls per task name: counted exactly when at most ``sample`` are parked, else estimated from
    an even sample of each shard. Returns the rows (task, count) largest first and what was read."""
    estimated, total, read = counts.parked_by_task(rd.depot, sample)
    rows = sorted(((task, round(count)) for task, count in estimated.items()), key=lambda row: -row[1])
    shown = rows[:TOP_TASKS]
    if len(rows) > TOP_TASKS:
        shown.append((f"{len(rows) - TOP_TASKS} other tasks", sum(count for _, count in rows[TOP_TASKS:])))
    return {"rows": shown, "total": total, "read": read, "exact": read >= total}


def layout(bars: list[Bar], width: int = 560, height: int = 180) -> Chart:
    """Place the bars in a chart area with room for the axis labels; the scale rounds up to a tidy step."""
    top, bottom, left, right = 12, 22, 40, 6
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max([bar.count for bar in bars] + [1])
    step = tidy_step(peak)
    ceiling = step * -(-peak // step)
    slot = plot_w / len(bars)
    gap = min(6.0, slot * 0.25)
    placed = []
    for index, bar in enumerate(bars):
        h = plot_h * bar.count / ceiling
        x = left + index * slot + gap / 2
        placed.append((round(x, 1), round(top + plot_h - h, 1), round(slot - gap, 1), round(h, 1), bar))
    grid = [(round(top + plot_h - plot_h * value / ceiling, 1), value) for value in range(0, ceiling + 1, step)]
    labels = [(round(x + w / 2, 1), bar.label) for x, _, w, _, bar in placed if bar.label]
    return Chart(width, height, placed, grid, labels, sum(bar.count for bar in bars))


@dataclass(frozen=True)
class TaskChart:
    """Horizontal bars, one per task: each as (y, bar width, shown name, full name, count)."""

    width: int
    height: int
    label_width: int
    rows: list[tuple[float, float, str, str, int]]
    total: int
    read: int
    exact: bool


def task_chart(sample: dict[str, Any], width: int = 560, row_height: int = 26) -> TaskChart:
    """The split by task laid out as horizontal bars, names on the left (their tail, when too long)."""
    label_width, count_width = 250, 70
    peak = max([count for _, count in sample["rows"]] + [1])
    room = width - label_width - count_width
    rows: list[tuple[float, float, str, str, int]] = []
    for index, (name, count) in enumerate(sample["rows"]):
        shown = name if len(name) <= 34 else "…" + name[-33:]
        rows.append((index * row_height, round(max(2.0, room * count / peak), 1), shown, name, count))
    height = max(row_height, len(rows) * row_height)
    return TaskChart(width, height, label_width, rows, sample["total"], sample["read"], sample["exact"])


def tidy_step(peak: int) -> int:
    """A gridline step of 1, 2 or 5 times a power of ten giving three to five lines up to ``peak``."""
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            step = factor * magnitude
            if peak / step <= 4:
                return step
        magnitude *= 10
