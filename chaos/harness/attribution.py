"""What losses and duplicates are tied to: Redis's own loss bound, and the faults of a run on a timeline.

Redis's own bound for ``appendfsync everysec``: it writes each change to the file before it replies, and
fsyncs once a second; while that fsync is still running it holds new writes back, for up to two seconds,
and replies all the same. A SIGKILL loses what it held back, a crash of the machine what the kernel had
not written out: at most the writes acknowledged :data:`FSYNC_BOUND_SECONDS` before it either way. A call
acknowledged to the producer within that bound before a SIGKILL of Redis may be lost by Redis; any other
lost is the package's.

Both runners tie each loss and each duplicate to the fault that explains it, by time: the first fault of
some kinds in a window (a kill of the worker that ran it, after its run started; a fault of Redis between
two runs), the last one before a moment, or the nearest one. :class:`Timeline` answers those over the
injected faults, as the rows the report holds (``Fault.as_dict()``). Which fault explains what is each
runner's own judgement (``chaos/analysis.py``, ``chaos/battle/analysis.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..faults import CLIENT_KILL, REDIS_FAULTS, REDIS_KILL

#: The most a SIGKILL of an ``appendfsync everysec`` Redis may lose: writes acknowledged this long before it.
FSYNC_BOUND_SECONDS = 2.0
#: Faults that break the clients' connections: every fault of a redis-server, and ``CLIENT KILL``.
CONNECTION_FAULTS = (CLIENT_KILL, *REDIS_FAULTS)

Row = Mapping[str, Any]


def within_bound(acknowledged: float, kill_wall: float) -> bool:
    """Whether a write acknowledged at ``acknowledged`` (wall clock) is one a SIGKILL at ``kill_wall`` may lose."""
    return kill_wall - FSYNC_BOUND_SECONDS <= acknowledged <= kill_wall


def target_name(fault: Row) -> str:
    """The name of the process a fault hit (``worker0-3`` of ``worker0-3 pid 1234``)."""
    return str(fault.get("target") or "").partition(" pid ")[0]


class Timeline:
    """The injected faults of a run, in the order they came (by wall clock)."""

    def __init__(self, faults: Iterable[Row]) -> None:
        injected = (fault for fault in faults if fault.get("injected") and fault.get("wall") is not None)
        self.faults: list[Row] = sorted(injected, key=lambda fault: float(fault["wall"]))

    def of(self, kinds: Iterable[str] = ()) -> Iterator[Row]:
        """The faults of one of ``kinds`` (all, when none is given), in order."""
        wanted = tuple(kinds)
        return (fault for fault in self.faults if not wanted or fault["kind"] in wanted)

    def between(
        self, kinds: Iterable[str], low: float, high: float = math.inf, *, target: str | None = None
    ) -> list[Row]:
        """The faults of one of ``kinds`` (all, when empty) from ``low`` to ``high`` (wall clock, both included),
        of the process named ``target`` if given, in order."""
        return [
            fault
            for fault in self.of(kinds)
            if low <= float(fault["wall"]) <= high and (target is None or target_name(fault) == target)
        ]

    def first(
        self, kinds: Iterable[str], low: float, high: float = math.inf, *, target: str | None = None
    ) -> Row | None:
        """The first fault :meth:`between` finds, or None."""
        return next(iter(self.between(kinds, low, high, target=target)), None)

    def last(self, kinds: Iterable[str], low: float, high: float) -> Row | None:
        """The last fault :meth:`between` finds, or None."""
        found = self.between(kinds, low, high)
        return found[-1] if found else None

    def nearest(self, wall: float, kinds: Iterable[str] = ()) -> Row | None:
        """The fault of one of ``kinds`` (any, when empty) nearest to ``wall``, or None."""
        return min(self.of(kinds), key=lambda fault: abs(float(fault["wall"]) - wall), default=None)

    def kill_within_bound(self, acknowledged: float) -> Row | None:
        """The first SIGKILL of Redis that may have lost a write acknowledged at ``acknowledged``."""
        return self.first((REDIS_KILL,), acknowledged, acknowledged + FSYNC_BOUND_SECONDS)
