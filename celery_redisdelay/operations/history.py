"""History: what happened minute by minute over the last day, read from each shard's ``history`` hash.

The store's scripts count every total twice in the same atomic step: in the running ``counters``
(:mod:`.metrics`) and in the current minute of ``history`` (field ``<minute>:<name>``, the minute being
ms since the epoch // 60000 by the Redis clock). Each tick's sweep forgets minutes older than a day, a
few per tick, so the hash holds at most :data:`KEPT_MINUTES` minutes of each name. Reading a window is
one ``HMGET`` per shard (in slices for long windows); the shards' counts are added up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..store.calls import redis_errors
from ..store.census import history_window
from ..store.depot import Depot
from ..store.layout import HISTORY_MINUTES, LATENESS_BOUNDS_MS
from .metrics import oldest_release

#: How many minutes the store keeps (layout.py's HISTORY_MINUTES).
KEPT_MINUTES = HISTORY_MINUTES
#: What each minute counts, in the order the charts and tables show them: field name -> label.
EVENTS = {
    "parked": "parked",
    "released": "released",
    "acked": "acknowledged",
    "swept": "delivered again",
    "dead_lettered": "dead-lettered",
    "cancelled": "cancelled",
    "limited": "held by limits",
    "revoked": "revoked",
    "expired": "expired",
}
LATENESS_FIELDS = [f"late_le_{bound}" for bound in LATENESS_BOUNDS_MS] + ["late_le_inf"]
FIELDS_PER_READ = 4000


@dataclass(frozen=True)
class Minute:
    """One minute: when it began (seconds since the epoch), its counts, and its release lateness."""

    start: int
    counts: dict[str, int]
    lateness: tuple[int, ...]  # calls released per lateness bucket (LATENESS_BOUNDS_MS, then unbounded)

    def lateness_ms(self, quantile: float) -> float | None:
        """The ``quantile`` of this minute's release lateness in ms (None: nothing released)."""
        return lateness_quantile(quantile, self.lateness)


@dataclass(frozen=True)
class History:
    """Minutes oldest first, every minute of the window present (empty ones with zero counts)."""

    minutes: list[Minute]
    now: float  # the Redis clock when read (seconds)
    last_release: float | None  # when a releaser last ran (seconds), the oldest over the shards

    def totals(self) -> dict[str, int]:
        return {name: sum(minute.counts[name] for minute in self.minutes) for name in EVENTS}

    def lateness_ms(self, quantile: float) -> float | None:
        """The ``quantile`` of release lateness over the whole window, in ms."""
        summed = [sum(column) for column in zip(*(minute.lateness for minute in self.minutes), strict=True)]
        return lateness_quantile(quantile, summed) if summed else None

    def as_dict(self) -> dict[str, Any]:
        """For JSON: the window's totals and lateness, and each minute (``start``: seconds since the epoch)."""
        return {
            "now": self.now,
            "last_release": self.last_release,
            "totals": self.totals(),
            "lateness_ms": {"p50": self.lateness_ms(0.5), "p99": self.lateness_ms(0.99)},
            "minutes": [
                {
                    "start": minute.start,
                    **minute.counts,
                    "lateness_p50_ms": minute.lateness_ms(0.5),
                    "lateness_p99_ms": minute.lateness_ms(0.99),
                }
                for minute in self.minutes
            ],
        }


def lateness_quantile(quantile: float, counts: Sequence[int]) -> float | None:
    """A quantile from counts per bucket, interpolated within its bucket as Prometheus's
    ``histogram_quantile`` does: linear from the bucket's lower bound (0 for the first) to its upper
    bound; in the unbounded bucket, the highest finite bound."""
    total = sum(counts)
    if total == 0:
        return None
    rank = quantile * total
    cumulative = 0
    for index, count in enumerate(counts):
        if count and cumulative + count >= rank:
            if index == len(LATENESS_BOUNDS_MS):
                return float(LATENESS_BOUNDS_MS[-1])
            lower = LATENESS_BOUNDS_MS[index - 1] if index else 0
            upper = LATENESS_BOUNDS_MS[index]
            return lower + (upper - lower) * (rank - cumulative) / count
        cumulative += count
    return float(LATENESS_BOUNDS_MS[-1])  # pragma: no cover - rank <= total always finds a bucket


def read_history(depot: Depot, minutes: int = 60) -> History:
    """The last ``minutes`` minutes (1 to a day), the current one included, summed over every shard."""
    if not 1 <= minutes <= KEPT_MINUTES:
        raise ValueError(f"minutes must be 1 to {KEPT_MINUTES} (the store keeps a day), not {minutes!r}")
    stores = depot.shards.all()
    with redis_errors("read the history"):
        now_ms = stores[0].registries.time_ms()
        current = now_ms // 60_000
        window = range(current - minutes + 1, current + 1)
        names = [*EVENTS, *LATENESS_FIELDS]
        fields = [f"{minute}:{name}" for minute in window for name in names]
        summed = [0] * len(fields)
        releases: list[int | None] = []
        for store in stores:
            values, released_at = history_window(store.registries, fields, FIELDS_PER_READ)
            for index, value in enumerate(values):
                if value is not None:
                    summed[index] += value
            releases.append(released_at)
    width = len(names)
    rows = [summed[start : start + width] for start in range(0, len(summed), width)]
    return History(
        minutes=[
            Minute(
                start=minute * 60,
                counts=dict(zip(EVENTS, row[: len(EVENTS)], strict=True)),
                lateness=tuple(row[len(EVENTS) :]),
            )
            for minute, row in zip(window, rows, strict=True)
        ],
        now=now_ms / 1000,
        last_release=oldest_release(releases),
    )


def per_bucket(minutes: Iterable[Minute], size: int) -> list[Minute]:
    """Add up consecutive minutes ``size`` at a time (the 24-hour chart draws 10-minute bars)."""
    grouped: list[Minute] = []
    batch: list[Minute] = []
    for minute in minutes:
        batch.append(minute)
        if len(batch) == size:
            grouped.append(_merged(batch))
            batch = []
    if batch:
        grouped.append(_merged(batch))
    return grouped


def _merged(minutes: list[Minute]) -> Minute:
    return Minute(
        start=minutes[0].start,
        counts={name: sum(m.counts[name] for m in minutes) for name in EVENTS},
        lateness=tuple(sum(column) for column in zip(*(m.lateness for m in minutes), strict=True)),
    )


__all__ = ["EVENTS", "KEPT_MINUTES", "History", "Minute", "lateness_quantile", "per_bucket", "read_history"]
