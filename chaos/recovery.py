"""How long each fault kept the calls it affected from running, and which setting bounds that.

A fault at wall time ``W`` affects:

* the runs it cut short on the killed worker (a worker kill), or, for a fault of Redis or of the
  connections, the runs that ended in a Redis error then or while it lasted;
* the messages the killed worker had received and not started (its prefetch), unless their call was
  already done;
* the calls due while the fault lasted (the process or Redis down), when the producer chose the due
  time (the soak);
* the calls the sweep brought back after the queue timeout, whose message was lost while they waited.

For each, the time from the fault (or from its due time, if later) to the next start of the call on a
worker; the report gives the count, the median and the longest, and what bounds the longest.
"""

from __future__ import annotations

from collections.abc import Iterator
from statistics import median
from typing import Any

from celery_redisdelay.settings import DEFAULTS

from .analysis import Run, WorkerLogs
from .config import TICK_INTERVAL
from .faults import BEAT_KILL, BROKER_KILL, BROKER_RESTART, CLIENT_KILL, RELEASER_KILL, WORKER_KILL, Fault

#: The workers' lease: the chaos runs keep the default (``redisdelay_lease``).
LEASE_SECONDS = float(DEFAULTS["redisdelay_lease"])
#: A run that started while Redis was down may end in the error a little after Redis answers again.
BROKEN_RUN_SLACK = 5.0


def bounds(kind: str, visibility_timeout: float, queue_timeout: float) -> str:
    """Which setting bounds the recovery of a fault of ``kind``."""
    run = (
        f"a run cut short is delivered again once its lease has run out (redisdelay_lease, {LEASE_SECONDS:g}s by "
        f"default) or, sooner, its own timeout has passed (the call's, {visibility_timeout:g}s here), and a sweep "
        f"has run (every tick, {TICK_INTERVAL:g}s)"
    )
    prefetched = (
        f"a message the worker had received and not started is held under the worker's lease (redisdelay_lease, "
        f"{LEASE_SECONDS:g}s by default, renewed every 10s): once the lease has run out the sweep delivers it again; "
        f"a message popped but never noted by kombu comes back after redisdelay_queue_timeout ({queue_timeout:g}s here)"
    )
    if kind == WORKER_KILL:
        return f"{run}; {prefetched}"
    if kind in (BEAT_KILL, RELEASER_KILL):
        return (
            "the other releaser (beat's tick, or the precise releaser) goes on releasing; nothing waits for the restart"
        )
    if kind in (BROKER_KILL, BROKER_RESTART):
        return (
            f"the broker's restart and the workers' reconnection; a message the broker lost comes back after "
            f"redisdelay_queue_timeout ({queue_timeout:g}s here); {run}"
        )
    if kind == CLIENT_KILL:
        return f"the clients' reconnection; {run}"
    return (
        f"Redis answering again (its restart from the append-only file, or the failover), the reconnections; {run}; "
        f"a run that could not even mark its start (Redis down then) keeps its queue deadline and comes back after "
        f"redisdelay_queue_timeout ({queue_timeout:g}s here)"
    )


def target_pid(fault: Fault) -> int | None:
    _, _, pid = fault.target.rpartition(" pid ")
    return int(pid) if pid.isdigit() else None


def per_fault(
    faults: list[Fault],
    runs: dict[str, list[Run]],
    logs: WorkerLogs,
    ready: dict[str, float],
    due: dict[str, float],
    *,
    visibility_timeout: float,
    queue_timeout: float,
) -> list[dict[str, Any]]:
    """One row per injected fault: calls affected, and how long until they ran. ``ready``: when each call
    parked by the runner could first run (its due time, else its park); ``due``: due times the producer chose."""
    starts = {call_id: sorted(run.started for run in calls) for call_id, calls in runs.items()}
    injected = [fault for fault in faults if fault.injected and fault.wall is not None]
    swept = swept_after(injected, runs, ready, queue_timeout)
    rows = []
    for fault in injected:
        assert fault.wall is not None
        wall, until = fault.wall, fault.wall + (fault.recovery_seconds or 0.0)
        affected: dict[str, tuple[float, float]] = {}  # call id -> (waiting since, next start after)
        killed = target_pid(fault) if fault.kind == WORKER_KILL else None
        for call_id, calls in runs.items():
            for run in calls:
                if fault.kind == WORKER_KILL:  # the runs it cut short
                    hit = run.worker_pid == killed and run.started <= wall and run.state is None
                else:  # a fault of Redis or of the connections: runs that ended in a Redis error then
                    hit = (
                        run.recorded is None
                        and run.ended is not None
                        and wall <= run.ended <= until + BROKEN_RUN_SLACK
                        and run.started <= until
                    )
                if hit and fault.kind not in (BEAT_KILL, RELEASER_KILL):
                    affected[call_id] = (wall, max(wall, run.started))
        if killed is not None:
            for call_id, seen in logs.receipts.items():
                calls = runs.get(call_id, [])
                if any(run.recorded and (run.ended or 0) <= wall for run in calls):
                    continue  # done before the kill: a message it held could only be a spare copy
                for moment, pid in seen:
                    started_here = any(run.worker_pid == killed and run.started >= moment - 0.05 for run in calls)
                    if pid == killed and moment <= wall and not started_here:
                        affected.setdefault(call_id, (wall, wall))  # prefetched, not started
        if fault.kind not in (WORKER_KILL, CLIENT_KILL):  # releasing or delivering stopped for a while
            for call_id, moment in due.items():
                if wall <= moment <= until:
                    affected.setdefault(call_id, (moment, moment))
        for call_id in swept.get(id(fault), []):
            affected.setdefault(call_id, (wall, wall))
        waits, never = [], 0
        for call_id, (waiting, after) in affected.items():
            following = next((moment for moment in starts.get(call_id, []) if moment > after), None)
            if following is None:
                never += 1
            else:
                waits.append(following - waiting)
        rows.append(
            {
                "kind": fault.kind,
                "at": fault.elapsed,
                "process_recovery_s": fault.recovery_seconds,
                "affected": len(affected),
                "ran_again": len(waits),
                "not_run_again": never,
                "median_s": round(median(waits), 2) if waits else None,
                "longest_s": round(max(waits), 2) if waits else None,
                "bounded_by": bounds(fault.kind, visibility_timeout, queue_timeout),
            }
        )
    return rows


def swept_after(
    faults: list[Fault], runs: dict[str, list[Run]], since: dict[str, float], queue_timeout: float
) -> dict[int, list[str]]:
    """Calls the sweep brought back after the queue timeout (:func:`chaos.analysis.long_gaps`), each given to
    the last fault of a worker, of Redis or of the connections while it waited: ``id(fault)`` -> call ids."""
    found: dict[int, list[str]] = {}
    candidates = [fault for fault in faults if fault.kind not in (BEAT_KILL, RELEASER_KILL)]
    for call_id, run, began in long_gaps(runs, since, queue_timeout):
        before = [fault for fault in candidates if began <= (fault.wall or 0) <= run.started]
        if before:
            found.setdefault(id(before[-1]), []).append(call_id)
    return found


def long_gaps(
    runs: dict[str, list[Run]], since: dict[str, float], queue_timeout: float
) -> Iterator[tuple[str, Run, float]]:
    """Deliveries that came about the queue timeout after the call's previous run (or after it was due, or
    parked: ``since``; calls not in it are judged from their second run on): the sweep bringing back a
    message lost between the broker and a worker (popped by a worker that was killed before kombu noted
    it, or whose reply was lost with a dropped connection). (call id, the late run, when the wait began.)"""
    for call_id, calls in runs.items():
        previous = since.get(call_id)
        for run in calls:
            if previous is not None and run.started - previous >= 0.9 * queue_timeout:
                yield call_id, run, previous
            previous = run.ended or run.started


def recoveries(runs: dict[str, list[Run]], since: dict[str, float], queue_timeout: float) -> dict[str, Any]:
    """The deliveries of :func:`long_gaps`; they make the run's tail."""
    swept = sorted(
        (run.number, round(run.started - began, 1)) for _, run, began in long_gaps(runs, since, queue_timeout)
    )
    return {"after_queue_timeout": len(swept), "examples": swept[:20]}
