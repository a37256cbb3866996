"""The verdict of ``celery -A proj redisdelay probe``: whether a worker works, from what it writes itself.

:func:`probe_worker` reads the worker's heartbeat from the store (:mod:`celery_redisdelay.worker.probe` writes it
each second) and fails it, saying why, when:

- no worker of that name has written one (in the last ten minutes): a name no worker has is a failure, never a pass;
- the worker is stopping;
- its heartbeat is older than the bound (its main process is gone, frozen, or cannot reach Redis);
- its event loop has not turned for longer than the bound, while no run holds it (a stuck loop: the leases' stall
  watch gives up the calls it has not started after one lease too);
- its consumer has consumed fewer queues than it should for longer than the bound (none, after a reconnection that
  did not come back; one cancelled);
- no renewal of its leases has reached Redis for longer than the bound or its lease, whichever is longer.

The bound (``max_stall``) is the worker's ``redisdelay_lease`` (30 s by default) unless given. Every age is counted
to the moment of the probe: what the record says, plus how long ago it was written by the Redis clock.
:func:`probe_file` judges the file that ``redisdelay_probe_file`` makes a worker touch, by its age.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..store.depot import depot_of
from ..worker.probe import RECORD_TTL_SECONDS, heartbeat_names, read_beat

if TYPE_CHECKING:
    from ..store.calls import CallStore
    from ..store.depot import Depot, HoldsDepot

__all__ = ["SHORTEST_BOUND", "ProbeResult", "probe_file", "probe_worker"]

#: The shortest bound a probe takes (seconds): the worker writes each second, and its loop notes a turn each second.
SHORTEST_BOUND = 3.0


@dataclass(frozen=True)
class ProbeResult:
    """A probe's verdict: whether it passed, the worker (or file) probed, the one line that says why, each failure,
    the bound (seconds), and the heartbeat's record as read (with ``age``: seconds since it was written)."""

    ok: bool
    worker: str
    line: str
    failures: tuple[str, ...] = ()
    bound: float | None = None
    record: dict[str, Any] | None = field(default=None, compare=False)

    def __bool__(self) -> bool:
        return self.ok

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "worker": self.worker,
            "line": self.line,
            "failures": list(self.failures),
            "bound": self.bound,
            "record": self.record,
        }


def _failed(worker: str, failures: list[str], bound: float | None, record: dict[str, Any] | None) -> ProbeResult:
    return ProbeResult(False, worker, f"FAIL {worker}: " + "; ".join(failures), tuple(failures), bound, record)


def seconds(value: float) -> str:
    return f"{value:.1f} s"


def probe_worker(source: Depot | HoldsDepot, worker: str, max_stall: float | None = None) -> ProbeResult:
    """Judge the worker named ``worker`` (its full name, ``celery@host``) by its heartbeat; see the module's doc.
    Raises :class:`~celery_redisdelay.errors.StoreUnavailableError` when the store cannot be read."""
    depot = depot_of(source)
    if not worker:
        return _failed("(no name)", ["no worker name was given (-n, as the worker's own)"], max_stall, None)
    store = depot.store
    beat = read_beat(store, worker)
    if beat is None:
        return _failed(worker, [_unknown(store, worker)], max_stall, None)
    shown = {**beat.record, "age": round(beat.age, 3)}
    reading = _Reading.of(beat.record, beat.age, max_stall)
    if reading is None:
        return _failed(worker, [f"its heartbeat cannot be read ({beat.record!r})"], max_stall, shown)
    failures = _failures(reading)
    if failures:
        return _failed(worker, failures, reading.bound, shown)
    return ProbeResult(True, worker, _healthy(worker, reading), (), reading.bound, shown)


def _unknown(store: CallStore, worker: str) -> str:
    """Why a worker without a heartbeat fails, naming the workers that have one (some of them, if many)."""
    names, complete = heartbeat_names(store)
    known = ", ".join(names) if names else "none"
    if names and not complete:
        known += ", ..."
    where = store.registries.heartbeat_key(worker)
    return (
        f"no heartbeat of a worker named {worker} in the store ({where}): no worker of this "
        f"app has run under that name in the last {RECORD_TTL_SECONDS // 60} minutes, or -n differs from the "
        f"worker's own; workers with one: {known}"
    )


@dataclass(frozen=True)
class _Reading:
    """A heartbeat's record as the probe judges it: every age (the loop's last turn, the leases' last renewal)
    counted to the moment of the probe, the bound, and the queues the consumer should and does consume."""

    age: float
    lease: float
    bound: float
    loop: float | None
    renewed: float
    short: float
    should: list[str]
    consumes: list[str]
    busy: bool
    stopping: bool

    @classmethod
    def of(cls, record: dict[str, Any], age: float, max_stall: float | None) -> _Reading | None:
        """The reading of ``record``, written ``age`` seconds ago, bound by ``max_stall`` (by default the worker's
        lease); None when the record lacks a field or holds one of the wrong kind."""
        try:
            lease = float(record["lease"])
            bound = float(max_stall) if max_stall is not None else lease
            loop = None if record.get("loop") is None else float(record["loop"]) + age
            renewed = float(record["renewed"]) + age
            short = float(record["short"])
            should = [str(name) for name in record["should"]]
            consumes = [str(name) for name in record["consumes"]]
        except (KeyError, TypeError, ValueError):
            return None
        busy, stopping = bool(record.get("busy")), bool(record.get("stopping"))
        return cls(age, lease, bound, loop, renewed, short, should, consumes, busy, stopping)

    @property
    def missing(self) -> list[str]:
        """The queues the consumer should consume but does not."""
        return [name for name in self.should if name not in self.consumes]


def _failures(reading: _Reading) -> list[str]:
    """Why the worker fails, each reason a line; none when it passes. A worker that is stopping, or whose heartbeat
    is older than the bound, fails on that alone: nothing else the record says is known to hold."""
    bound, age = reading.bound, reading.age
    if reading.stopping:
        return [f"it is stopping (its last heartbeat, {seconds(age)} ago, said so)"]
    if age > bound:  # what the record says is that old: nothing else is known
        return [
            f"its last heartbeat is {seconds(age)} old (bound {seconds(bound)}): its main process is gone, frozen, "
            "or cannot reach Redis"
        ]
    return _stalls(reading)


def _stalls(reading: _Reading) -> list[str]:
    """The parts of a live worker stalled for longer than the bound: its event loop (while no run holds it), its
    consumer (fewer queues than it should), the renewal of its leases (bound by the lease, if longer)."""
    bound, loop, missing = reading.bound, reading.loop, reading.missing
    failures: list[str] = []
    if loop is not None and loop > bound and not reading.busy:
        failures.append(f"its event loop has not turned for {seconds(loop)} (bound {seconds(bound)}): it is stuck")
    if reading.short > 0 and reading.short + reading.age > bound and missing:
        should, consumes = reading.should, reading.consumes
        what = "none of its queues" if not set(should) & set(consumes) else f"not {', '.join(missing)}"
        failures.append(
            f"it has consumed {what} for {seconds(reading.short + reading.age)} (bound {seconds(bound)}; "
            f"should: {', '.join(should)})"
        )
    renewal_bound = max(bound, reading.lease)
    if reading.renewed > renewal_bound:
        failures.append(
            f"its leases were last renewed {seconds(reading.renewed)} ago (bound {seconds(renewal_bound)}): its lease "
            "thread is gone or cannot reach Redis"
        )
    return failures


def _healthy(worker: str, reading: _Reading) -> str:
    """The line of a worker that passes: how long ago its loop turned and its leases were renewed, what it consumes."""
    bound, loop, missing = reading.bound, reading.loop, reading.missing
    if loop is None:
        turns = "its event loop is not watched (no event loop under this pool)"
    elif reading.busy and loop > bound:
        turns = f"its event loop runs a call (solo pool) for {seconds(loop)}"
    else:
        turns = f"its event loop turned {seconds(loop)} ago"
    consuming = f"it consumes {', '.join(reading.consumes) or 'no queue'}"
    if missing:
        consuming += f" (not {', '.join(missing)} for {seconds(reading.short + reading.age)})"
    return (
        f"OK {worker}: {turns}, its leases were renewed {seconds(reading.renewed)} ago, {consuming}; "
        f"bound {seconds(bound)}"
    )


def probe_file(path: str | Path, max_age: float, now: float | None = None) -> ProbeResult:
    """Judge the file a worker touches (``redisdelay_probe_file``) by its age: it fails when the file is missing or
    older than ``max_age`` seconds. ``now``: the time to count from (seconds since the epoch; by default, now)."""
    file = Path(path)
    try:
        touched = file.stat().st_mtime
    except FileNotFoundError:
        why = (
            f"no file {file}: the worker has not touched it (redisdelay_probe_file not set to it, or the worker "
            "has not looked healthy since it started), or it stopped"
        )
        return _failed(str(file), [why], max_age, None)
    except OSError as exc:
        return _failed(str(file), [f"cannot read {file}: {exc}"], max_age, None)
    age = max(0.0, (time.time() if now is None else now) - touched)
    if age > max_age:
        why = (
            f"{file} was last touched {seconds(age)} ago (bound {seconds(max_age)}): the worker's event loop is "
            "stuck, it consumes fewer queues than it should, its leases are not renewed, or it is gone"
        )
        return _failed(str(file), [why], max_age, {"age": round(age, 3)})
    line = f"OK {file}: touched {seconds(age)} ago; bound {seconds(max_age)}"
    return ProbeResult(True, str(file), line, (), max_age, {"age": round(age, 3)})
