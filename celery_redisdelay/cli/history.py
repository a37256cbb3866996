"""``status --history``: the totals of the last hour and the last day, then the last minutes one by one."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..operations.history import EVENTS, KEPT_MINUTES, History, read_history
from ..operations.humanize import span
from .output import say, table

if TYPE_CHECKING:
    from ..extension import RedisDelay


def print_history(rd: RedisDelay, minutes: int) -> None:
    day = read_history(rd.depot, KEPT_MINUTES)
    hour = History(day.minutes[-60:], day.now, day.last_release)
    say()
    table(
        ["history", "last hour", "last 24 hours"],
        [
            *([label, f"{hour.totals()[name]:,}", f"{day.totals()[name]:,}"] for name, label in EVENTS.items()),
            ["lateness p50", _ms(hour.lateness_ms(0.5)), _ms(day.lateness_ms(0.5))],
            ["lateness p99", _ms(hour.lateness_ms(0.99)), _ms(day.lateness_ms(0.99))],
        ],
        right=(1, 2),
    )
    last = "never" if day.last_release is None else f"{span(max(0.0, day.now - day.last_release))} ago"
    say(f"last release: {last}")
    say()
    table(
        ["minute (UTC)", *EVENTS.values(), "p50", "p99"],
        [
            [
                time.strftime("%H:%M", time.gmtime(minute.start)),
                *(f"{minute.counts[name]:,}" for name in EVENTS),
                _ms(minute.lateness_ms(0.5)),
                _ms(minute.lateness_ms(0.99)),
            ]
            for minute in day.minutes[-minutes:]
        ],
        right=range(1, len(EVENTS) + 3),
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"
