"""Why a message was processed twice, or not at all: the workers' event logs matched with the faults.

Every worker process writes a ``start`` and an ``end`` line per run of the validation consumer
(``chaos.app``, to the ledger's files: ``chaos/harness/ledger.py``): the call id, the message number, the
process and its process group (the worker, as the runner killed it), and how the run ended (``SUCCESS``: the
consumer recorded the message; ``IGNORED``: it failed on purpose with ``Abandon``; ``FAILURE``: it raised). A
run without an ``end`` was cut short, by a SIGKILL of its worker.

The workers' own logs add what they saw: a receipt of a message, "could not acknowledge call" (the
package's acknowledgement failed), "Couldn't ack" (Celery's broker acknowledgement failed) and
"Restoring N unacknowledged message(s)" (kombu put messages back in the queue after a connection loss).

A duplicate is allowed only when an acknowledgement was lost: the worker was killed (or died) after the
consumer recorded the message but before the acknowledgement; the acknowledgement could not reach
Redis; the reply to the consumer's script was lost; the run outlived its visibility timeout; a broker
acknowledgement was lost, so kombu restored a copy of a message that had run (at reconnection, or
after kombu's visibility timeout for a worker that was killed holding it); or the runner retried a
park after a lost reply. Anything else is reported as unexplained. The faults a run is matched with are
found on the harness's timeline (``chaos/harness/attribution.py``), as the battle's are.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from celery_redisdelay.operations.validation import CONSUMER_TASK

from .cluster import Member
from .config import CLAIM_TIMEOUT
from .faults import CLIENT_KILL, REDIS_KILL, REDIS_RESTART, Fault
from .harness.attribution import CONNECTION_FAULTS, Timeline
from .harness.ledger import read_events

STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): "  # a Celery log line's timestamp
#: The package could not acknowledge the call (Redis unreachable): the sweep delivers it again.
ACK_FAILED = re.compile(STAMP + r".*could not acknowledge call ([^;\s]+);", re.M)
#: Celery could not acknowledge the broker message (kombu's ack) because the connection was gone.
BROKER_ACK_LOST = re.compile(STAMP + r"CRITICAL/MainProcess\] Couldn't ack '([^'.]+)\.\d+'", re.M)
#: A worker that lost its broker connection pushes back the messages it had not acknowledged to the
#: broker yet (kombu's ``restore_unacked``), even one whose task has already run.
RESTORING = re.compile(STAMP + r"INFO/MainProcess\] Restoring (\d+) unacknowledged", re.M)
RECEIVED = re.compile(STAMP + r"INFO/MainProcess\] Task " + re.escape(CONSUMER_TASK) + r"\[([^\]]+)\] received", re.M)
#: A releaser (or a tick) pushed calls to the broker but could not mark them published in the store.
CONFIRM_FAILED = "could not confirm published calls"
STORE_FAULTS = (CLIENT_KILL, REDIS_RESTART, REDIS_KILL)


@dataclass
class Run:
    """One run of the consumer for one delivery of a call."""

    id: str
    number: int
    started: float  # wall clock
    pid: int
    worker_pid: int  # the process group: the worker's main process
    ended: float | None = None
    state: str | None = None  # SUCCESS, IGNORED, FAILURE, DEFERRED (a busy lock); None when cut short
    exc: str | None = None
    items: tuple[int, ...] = ()  # a batch: the numbers of its other items

    @property
    def numbers(self) -> tuple[int, ...]:
        return (self.number, *self.items)

    @property
    def recorded(self) -> bool | None:
        """Whether the consumer recorded the message; None when unknown: the run was cut short, or its
        Redis call failed on the connection (the script may have run and only its reply been lost)."""
        if self.state is None:
            return None
        if self.state == "DEFERRED":
            return False  # its lock was busy: the body did not run
        if self.state == "FAILURE" and self.exc and ("ConnectionError" in self.exc or "TimeoutError" in self.exc):
            return None
        if self.state == "IGNORED" and self.exc and "on purpose" not in self.exc:
            return None  # abandoned for another reason than the deliberate failure (a Redis error)
        return self.state == "SUCCESS"


def read_runs(events_dir: Path, run_id: str) -> dict[str, list[Run]]:
    """The runs of validation ``run_id`` per call id, in start order."""
    runs: dict[str, list[Run]] = defaultdict(list)
    for events in read_events(events_dir):
        current: Run | None = None
        for event in events:
            if event.get("e") == "start":
                current = None
                if event.get("run") != run_id:
                    continue
                items = tuple(int(n) for n in event.get("items") or ())
                current = Run(event["id"], int(event["n"]), event["t"], event["pid"], event["pg"], items=items)
                runs[current.id].append(current)
            elif event.get("e") == "end" and current is not None and event.get("id") == current.id:
                current.ended = event["t"]
                current.state = event.get("state")
                current.exc = event.get("exc")
                current = None
    for calls in runs.values():
        calls.sort(key=lambda run: run.started)
    return runs


def log_time(stamp: str) -> float:
    """A Celery log timestamp (local time, as the workers log it) as a wall clock."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@dataclass
class WorkerLogs:
    """What the workers' logs say, from one pass over them."""

    ack_failed: dict[str, tuple[float, str]]  # call id -> (when, worker name), the first time
    broker_ack_lost: dict[str, tuple[float, str]]  # call id -> (when, worker name), the first time
    restores: dict[int, list[float]]  # worker pid -> when it restored unacknowledged messages
    receipts: dict[str, list[tuple[float, int]]]  # call id -> (when, worker pid) of each receipt
    confirm_failed: set[str] = field(default_factory=set)  # processes that logged CONFIRM_FAILED

    @classmethod
    def read(cls, members: Iterable[Member]) -> WorkerLogs:
        logs = cls({}, {}, {}, defaultdict(list))
        for member in members:
            try:
                text = member.output()
            except OSError:
                continue
            if CONFIRM_FAILED in text:  # the releaser's log lines carry no time
                logs.confirm_failed.add(member.name)
            if member.role != "worker":
                continue
            for match in ACK_FAILED.finditer(text):
                logs.ack_failed.setdefault(match.group(2), (log_time(match.group(1)), member.name))
            for match in BROKER_ACK_LOST.finditer(text):
                logs.broker_ack_lost.setdefault(match.group(2), (log_time(match.group(1)), member.name))
            logs.restores[member.pid] = [log_time(match.group(1)) for match in RESTORING.finditer(text)]
            for match in RECEIVED.finditer(text):
                logs.receipts[match.group(2)].append((log_time(match.group(1)), member.pid))
        return logs


class Explainer:
    """Matches runs with kills, faults and the workers' logs."""

    def __init__(
        self,
        runs: dict[str, list[Run]],
        members: list[Member],
        faults: list[Fault],
        *,
        started_wall: float,
        visibility_timeout: float,
        broker_visibility_timeout: float,
        park_retried: set[str],
        loss_window: float | None = None,
        numbers_retried: set[int] | None = None,
        queue_timeout: float = 0.0,
    ) -> None:
        self.runs = runs
        self.by_number: dict[int, str] = {}
        for call_id, calls in runs.items():
            for run in calls:
                for number in run.numbers:
                    self.by_number[number] = call_id
        self.workers = {member.pid: member for member in members if member.role == "worker"}
        self.timeline = Timeline(fault.as_dict() for fault in faults)
        self.started_wall = started_wall
        self.visibility_timeout = visibility_timeout
        self.broker_visibility_timeout = broker_visibility_timeout
        self.park_retried = park_retried
        self.loss_window = loss_window  # a SIGKILL of the store may lose writes acknowledged this long before it
        self.numbers_retried = numbers_retried or set()  # messages the runner parked (or added) again
        self.queue_timeout = queue_timeout
        logs = WorkerLogs.read(members)
        self.ack_failed = logs.ack_failed
        self.broker_ack_lost = logs.broker_ack_lost
        self.restores = logs.restores
        self.receipts = logs.receipts
        self.confirm_failed = logs.confirm_failed

    def at(self, wall: float) -> str:
        return f"+{wall - self.started_wall:.2f}s"

    def nearest_fault(self, wall: float, kinds: tuple[str, ...] = ()) -> str:
        """The injected fault nearest to ``wall`` (of one of ``kinds``, if there is one; else of any kind)."""
        fault = self.timeline.nearest(wall, kinds) or self.timeline.nearest(wall)
        if fault is None:
            return "none"
        return f"{fault['kind']} at {self.at(fault['wall'])} ({wall - fault['wall']:+.2f}s from it)"

    def describe(self, run: Run) -> dict[str, Any]:
        worker = self.workers.get(run.worker_pid)
        return {
            "started": self.at(run.started),
            "worker": worker.name if worker else f"pgid {run.worker_pid}",
            "pid": run.pid,
            "state": run.state or "cut short",
            "seconds": round(run.ended - run.started, 3) if run.ended is not None else None,
            "exc": run.exc,
        }

    def restored_copy(self, call_id: str, later: Run) -> str | None:
        """A copy of the message that kombu restored: a worker received it (its log says so) and was
        then SIGKILLed (or died) before the broker acknowledgement, and ``later`` started at least
        kombu's visibility timeout after that receipt."""
        for received, worker_pid in self.receipts.get(call_id, []):
            worker = self.workers.get(worker_pid)
            if (
                worker is not None
                and worker.how in ("killed", "exited")
                and worker.ended is not None
                and worker.ended >= received
                and later.started - received >= self.broker_visibility_timeout - 1
            ):
                ended = "was SIGKILLed" if worker.how == "killed" else "exited on its own"
                return (
                    f"probably a copy kombu restored: {worker.name} received a message of this call at "
                    f"{self.at(received)} and {ended} {worker.ended - received:.2f}s later, before its broker "
                    f"acknowledgement reached Redis; kombu puts such messages back after its "
                    f"{self.broker_visibility_timeout:g}s visibility timeout, besides the sweep's redelivery, and "
                    f"the call ran again at {self.at(later.started)}"
                )
        return None

    def why_again(self, calls: list[Run], index: int, later: Run) -> tuple[str, bool]:
        """Why ``later`` recorded the message again after ``calls[index]`` recorded it (or may have):
        (reason, allowed)."""
        run = calls[index]
        worker = self.workers.get(run.worker_pid)
        if run.state is None:
            if worker is not None and worker.how in ("killed", "exited") and worker.ended is not None:
                ended = "was SIGKILLed" if worker.how == "killed" else "exited on its own"
                return (
                    f"{worker.name} (pid {worker.pid}) {ended} {worker.ended - run.started:.2f}s after the run "
                    "started, after the consumer recorded the message and before the acknowledgement",
                    True,
                )
            return "the run never ended, and its worker was not killed", False
        if run.id in self.ack_failed:
            moment, name = self.ack_failed[run.id]
            return (
                f"its acknowledgement failed ({name} logged 'could not acknowledge call' at {self.at(moment)}; "
                f"nearest fault: {self.nearest_fault(moment, CONNECTION_FAULTS)})",
                True,
            )
        if run.state == "FAILURE":
            return (
                f"the consumer raised {run.exc} (its script may have run and only the reply been lost), and the "
                f"call was delivered again (nearest fault: {self.nearest_fault(run.started, CONNECTION_FAULTS)})",
                False,
            )
        if run.state == "IGNORED":
            return (
                f"the consumer abandoned the delivery with {run.exc} (its script may have run and only the reply "
                "been lost), so the sweep delivered it again: a lost acknowledgement "
                f"(nearest fault: {self.nearest_fault(run.started, CONNECTION_FAULTS)})",
                True,
            )
        if run.ended is not None and run.ended - run.started > self.visibility_timeout:
            return (
                f"the run took {run.ended - run.started:.2f}s, past its {self.visibility_timeout:g}s visibility "
                f"timeout, so the sweep delivered it again (nearest fault: {self.nearest_fault(run.started)})",
                True,
            )
        if run.ended is not None and later.started < run.ended:
            return "delivered again while this run was still going (overlapping runs)", False
        if run.id in self.broker_ack_lost:
            moment, name = self.broker_ack_lost[run.id]
            return (
                f"the broker acknowledgement of a message of this call was lost with the connection ({name} "
                f'logged "Couldn\'t ack" at {self.at(moment)}), so kombu restored that copy on reconnect and it '
                f"ran again (nearest fault: {self.nearest_fault(moment, CONNECTION_FAULTS)})",
                True,
            )
        for moment in self.restores.get(run.worker_pid, []):
            if run.started - 2 <= moment <= later.started and moment <= (run.ended or run.started) + 2:
                name = worker.name if worker else f"pgid {run.worker_pid}"
                return (
                    f"{name} lost its broker connection at {self.at(moment)} before the broker acknowledgement of "
                    "this message was sent, and restored it to the queue ('Restoring N unacknowledged message(s)') "
                    f"although the task had run (nearest fault: {self.nearest_fault(moment, CONNECTION_FAULTS)})",
                    True,
                )
        restored = self.restored_copy(run.id, later)
        if restored:
            return restored, True
        killed = self.lost_in_kill(run)
        if killed:
            return killed, True
        republished = self.published_twice(later)
        if republished:
            return republished, True
        if run.id in self.park_retried:
            return "the runner retried its park after a lost reply (the first park had already stored it)", True
        near = self.nearest_fault(later.started)
        return f"acknowledged without an error logged, yet delivered again (nearest fault: {near})", False

    def lost_in_kill(self, run: Run) -> str | None:
        """A run that ended shortly before a SIGKILL of the store: its acknowledgement was among the last
        writes, which the kill may lose (Redis's fsync bound, or a failover's replication lag)."""
        if self.loss_window is None or run.ended is None:
            return None
        fault = self.timeline.first((REDIS_KILL,), run.ended, run.ended + self.loss_window)
        if fault is None:
            return None
        return (
            f"it ended {fault['wall'] - run.ended:.2f}s before the SIGKILL of the store at {self.at(fault['wall'])}: "
            f"its acknowledgement was among the writes such a kill may lose (the last {self.loss_window:g}s)"
        )

    def published_twice(self, later: Run) -> str | None:
        """A second copy in the broker: a release pushed the call, the store went away before the release
        could mark it published, and after the claim timeout the sweep took the claim for abandoned and
        published the call again (the two-step release, with the broker on another Redis)."""
        if not self.confirm_failed:
            return None
        window = CLAIM_TIMEOUT + self.queue_timeout
        fault = self.timeline.last(STORE_FAULTS, later.started - window, later.started)
        if fault is None:
            return None
        return (
            f"probably published twice: {', '.join(sorted(self.confirm_failed))} logged '{CONFIRM_FAILED}' (a "
            f"release pushed calls to the broker and the store went away before it could mark them published; "
            f"nearest store fault: {fault['kind']} at {self.at(fault['wall'])}), so the sweep published them again "
            f"after the {CLAIM_TIMEOUT:g}s claim timeout and both copies ran"
        )

    def duplicate(self, number: int) -> dict[str, Any]:
        call_id = self.by_number.get(number)
        calls = self.runs.get(call_id, []) if call_id else []
        # Runs that recorded the message, or may have (cut short, or the reply to their script lost).
        recording = [index for index, run in enumerate(calls) if run.recorded is not False]
        reasons: list[str] = []
        allowed = len(recording) > 1
        for index, following in pairwise(recording):
            reason, ok = self.why_again(calls, index, calls[following])
            reasons.append(f"run {index + 1}: {reason}")
            allowed = allowed and ok
        if number in self.numbers_retried and not allowed:
            reasons.append("the runner parked (or added) it again after an error: the first may have been stored")
            allowed = True
        if not reasons:
            reasons.append("fewer than two runs recorded the message: not explained by the event logs")
        return {
            "number": number,
            "id": call_id,
            "runs": [self.describe(run) for run in calls],
            "successful_runs": sum(run.state == "SUCCESS" for run in calls),
            "explanation": "; ".join(reasons),
            "allowed": allowed,
        }

    def missing(self, number: int, store_state: dict[str, Any] | None, *, lost: bool = False) -> dict[str, Any]:
        call_id = self.by_number.get(number)
        calls = self.runs.get(call_id, []) if call_id else []
        failed = [run for run in calls if run.state == "FAILURE"]
        if lost:
            explanation = "acknowledged to the producer, and gone after a SIGKILL of the store (see the faults)"
        elif not calls:
            explanation = "never started on any worker"
        elif failed:
            run = failed[-1]
            explanation = (
                f"run at {self.at(run.started)} on {self.describe(run)['worker']} raised {run.exc}: Celery counts "
                "that as a failure it does not retry, so the call was acknowledged and never delivered again "
                f"(nearest fault: {self.nearest_fault(run.started, CONNECTION_FAULTS)})"
            )
        else:
            last = calls[-1]
            explanation = f"last run {self.describe(last)['state']} at {self.at(last.started)}; not delivered since"
        return {
            "number": number,
            "id": call_id,
            "runs": [self.describe(run) for run in calls],
            "store": store_state,
            "explanation": explanation,
        }


def run_counts(runs: dict[str, list[Run]]) -> dict[str, int]:
    """How the runs ended, over the whole validation."""
    counts: dict[str, int] = defaultdict(int)
    for calls in runs.values():
        for run in calls:
            counts[run.state or "cut short"] += 1
    return dict(counts)
