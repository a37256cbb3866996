"""The battle's outcome from the ledger: pure functions of what was sent, what ran, and the faults.

A *unit* is one run the battle expects: call ``n``'s run (``"n.0"``), or for a retrying call each attempt
(``"n.1"`` is its retry). The ledger holds every unit's send (its kind, its due time, when it was sent, its
path: parked by the extension, or Celery's own, with an eta or due now), every start of a run and every end
of one (a run that ended was acknowledged, or about to be), and every cancel.

* exactly once: one end; a cancel that succeeded expects none;
* dead-lettered by contract: no end, and its call is a dead letter of the store whose reason starts
  :data:`WORKER_LOST`, which the ledger bears out (:meth:`Outcome.judge_letter`): a run of a task that
  acknowledges early (plain ``@app.task``, Celery's default) cut short by a fault of its worker is not run
  again (``celery_redisdelay/worker/contract.py``). Neither lost nor a duplicate. A ``worker lost`` dead letter
  the ledger does not bear out is *wrong*; one of a run that ended (its acknowledgement lost) is reported apart;
* lost: no end, and no such dead letter. A parked call lost is a bug of the package, unless it was acknowledged
  within Redis's own bound (:data:`FSYNC_BOUND_SECONDS`) before a SIGKILL of Redis; a call due now takes
  Celery's own path (acknowledged when its run starts) and what Celery loses is reported, split the same way.
  Among them, runs *cut short*: started, a kill of their worker, never run again nor dead-lettered (what plain
  Celery loses where the extension dead-letters);
* duplicate: more than one end; each is tied to the fault that explains it (the worker killed after the
  first run, a Redis or connection fault between the two or within a second of its send (a reply lost, the
  client sending again), or a send the producer made again after an error);
* early: a start before the unit's due time: the one the run's own message carried (a retry's, which a fault
  may have sent twice, the ledger hearing of one send only), else its send's;
* lateness: the first start less that due time (the send, for a call due now);
* recovery: for each fault, the runs it cut short or the calls due while it lasted, and how long until each
  started again.

Redis's bound and the faults' timeline are the harness's (``chaos/harness/attribution.py``), as the validation's
runner's are; what this module judges (the delivery contract, the units) is the battle's own.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from statistics import median
from typing import Any

from ..harness.attribution import CONNECTION_FAULTS, FSYNC_BOUND_SECONDS, Timeline, target_name

#: A start this much before the due time counts as early (the due time is kept to the millisecond).
EARLY_TOLERANCE = 0.001
#: A unit that started more than this after its due time is late, for the per-SIGKILL comparison.
LATE_SECONDS = 5.0
PARKED, CELERY_ETA, CELERY_NOW = "parked", "celery-eta", "celery-now"
#: A call due now that ``redisdelay_track_due_now`` sent through the store: judged as a parked call is.
TRACKED = "tracked"
WORKER_FAULTS = ("worker_kill", "worker_term")
ROW_LIMIT = 200
#: How the reason of a dead letter starts when the store's sweep buried a run cut short with its worker.
WORKER_LOST = "worker lost:"
#: The kinds whose task runs a call again when its run is cut short (``@rd.batched``, ``@rd.delayed``): never
#: dead-lettered for it. The others are plain ``@app.task`` tasks, which acknowledge early unless ``acks_late``.
RUN_AGAIN_KINDS = ("batch", "lock")
#: The store records a run's start in task_prerun, before the task's body, a moment before the run's first write to
#: the ledger:
#: a kill of its worker this soon after the store's start may leave a dead letter of a run the ledger never saw.
ACCEPT_SECONDS = 1.0
#: A pool process outlives its worker's main process by a moment after a SIGKILL of the main process (the runner
#: kills the main process; its pool processes see it gone and end): a run it started then has its start in the store
#: up to this long after the kill, and its call is a dead letter by contract as well.
ORPHAN_SECONDS = 0.5
#: A run's acknowledgement reaches the store this soon after its end (the outbox's window and a round trip, or its
#: retries while Redis is away): a fault within it may leave a run that ended dead-lettered all the same.
ACK_SECONDS = 2.0
#: The judgements of a ``worker lost`` dead letter that count its unit as dead-lettered by contract.
BY_CONTRACT = ("cut", "accepted")
_REASON = re.compile(r"started on (?P<worker>\S+?)(?: at (?P<at>\d{4}-\d\d-\d\dT[\d:.]+)Z)? had not reported its end")


def quantiles(values: Iterable[float]) -> dict[str, Any]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "p50": None, "p99": None, "max": None}

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))], 4)

    return {"n": len(ordered), "p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 4)}


def lateness_group(send: Mapping[str, Any]) -> str:
    """The path, and apart the kinds that wait by design: batch items (for their batch), locked calls (for
    their lock), retries (sent by a worker)."""
    kind = str(send["k"])
    return f"{send['c']} ({kind})" if kind in ("batch", "lock", "retry") else str(send["c"])


def worker_name(hostname: str) -> str:
    return hostname.split("@", 1)[0]


def attempt(unit: str) -> int:
    """The attempt of a unit (``1`` of ``"5.1"``, a retry)."""
    return int(unit.rpartition(".")[2] or 0)


def reason_start(why: str) -> tuple[str | None, float | None]:
    """The worker and the wall clock of the run start a ``worker lost`` reason names (``... started on
    worker0-1@host at 2026-01-02T03:04:05.678Z had not reported its end ...``); None for what it does not say."""
    found = _REASON.search(why)
    if found is None:
        return None, None
    worker = worker_name(found["worker"]) if "@" in found["worker"] else None
    at = datetime.fromisoformat(found["at"] + "+00:00").timestamp() if found["at"] else None
    return worker, at


class Outcome:
    """The analysis of one battle; :meth:`as_dict` is its report's data."""

    def __init__(
        self,
        sends: Mapping[str, Mapping[str, Any]],
        starts: Sequence[Mapping[str, Any]],
        ends: Sequence[Mapping[str, Any]],
        cancels: Mapping[str, bool],
        faults: Sequence[Mapping[str, Any]],
        received: Sequence[Mapping[str, Any]] = (),
        dead_letters: Sequence[Mapping[str, Any]] = (),
        *,
        acks_late: bool = False,
    ) -> None:
        """``dead_letters``: the store's dead letters after the drain (``id``, ``why``); ``acks_late``: the
        battle's tasks acknowledge late, so no run of theirs is dead-lettered for being cut short."""
        self.sends = sends
        self.received: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for row in received:
            self.received[row["u"]].append(row)
        self.cancels = cancels
        self.timeline = Timeline(faults)
        self.faults = self.timeline.faults
        self.starts: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        self.ends: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for start in starts:
            self.starts[start["u"]].append(start)
        for end in ends:
            self.ends[end["u"]].append(end)
        for rows in (*self.starts.values(), *self.ends.values()):
            rows.sort(key=lambda row: row.get("s", row.get("t", 0.0)))
        self.acks_late = acks_late
        self.units_of_call: dict[str, list[str]] = defaultdict(list)
        for unit, send in sorted(sends.items(), key=lambda item: attempt(item[0])):
            self.units_of_call[str(send.get("id"))].append(unit)
        worker_lost = [str(letter.get("why") or "").startswith(WORKER_LOST) for letter in dead_letters]
        self.other_letters = [letter for letter, lost in zip(dead_letters, worker_lost, strict=True) if not lost]
        self.letters = [self.judge_letter(row) for row, lost in zip(dead_letters, worker_lost, strict=True) if lost]
        #: The units whose call is dead-lettered by contract: not run again, by design.
        self.dead_lettered = {row["unit"] for row in self.letters if row["category"] in BY_CONTRACT}

    # -- what each unit did -----------------------------------------------------------------------

    def expected(self, unit: str) -> int:
        return 0 if self.cancels.get(unit) else 1

    def due(self, unit: str, run: Mapping[str, Any]) -> float:
        """The due time a run is judged by: the one its own message carried (a retry's), else its send's."""
        return float(run.get("d", self.sends[unit]["d"]))

    def lateness(self, unit: str) -> float | None:
        ends = self.ends.get(unit)
        if not ends:
            return None
        first = min(ends, key=lambda end: end["s"])
        return float(first["s"]) - self.due(unit, first)

    def lost_explanation(self, unit: str) -> tuple[str, str]:
        """(category, why): ``bound`` for a parked call acknowledged within the fsync bound before a SIGKILL of
        Redis, ``cut`` for a run a worker fault cut short, ``fault`` near another fault, ``none``."""
        send = self.sends[unit]
        sent = float(send["t"])
        kill = self.timeline.kill_within_bound(sent)
        if kill is not None:
            return "bound", f"sent {kill['wall'] - sent:.3f}s before the SIGKILL of Redis at {kill['elapsed']}s"
        for start in self.starts.get(unit, []):
            hit = self._worker_fault_after(worker_name(start["w"]), start["t"])
            if hit is not None:
                return "cut", (
                    f"its run started on {worker_name(start['w'])} {hit['wall'] - start['t']:.2f}s before its "
                    f"{hit['kind']} at {hit['elapsed']}s and never ran again"
                )
            return "none", f"started on {worker_name(start['w'])} and never ended, with no fault of that worker after"
        for row in self.received.get(unit, []):
            hit = self._worker_fault_after(worker_name(row["w"]), row["t"])
            if hit is not None:
                return "held", (
                    f"received by {worker_name(row['w'])} {hit['wall'] - row['t']:.2f}s before its {hit['kind']} at "
                    f"{hit['elapsed']}s, never started"
                )
        due = max(float(send["d"]), sent)
        # A send under way when a fault hit was acknowledged after it: faults from just before the send on.
        fault = self.timeline.first((), min(sent, float(send["d"])) - 0.5)
        if fault is not None:
            return "fault", (
                f"never started; the next fault after its send: {fault['kind']} of {target_name(fault) or 'Redis'} "
                f"at {fault['elapsed']}s ({fault['wall'] - due:+.2f}s from its due time)"
            )
        return "none", "never started, and no fault after its send"

    def _worker_fault_after(self, name: str, moment: float) -> Mapping[str, Any] | None:
        return self.timeline.first(WORKER_FAULTS, moment, target=name)

    def explain_duplicate(self, unit: str) -> tuple[bool, str]:
        ends = self.ends[unit]
        first, second = ends[0], ends[1]
        name = worker_name(first["w"])
        fault = self._worker_fault_after(name, first["s"])
        if fault is not None and fault["wall"] <= second["s"] + 1.0:
            return True, (
                f"{fault['kind']} of {name} at {fault['elapsed']}s, {fault['wall'] - first['e']:.3f}s after its first "
                "run ended: the acknowledgement was lost"
            )
        fault = self.timeline.first(CONNECTION_FAULTS, first["s"] - 1.0, second["s"])
        if fault is not None:
            return True, (
                f"{fault['kind']} at {fault['elapsed']}s, between the two runs: the acknowledgement was lost "
                "with the connection or with Redis's last writes"
            )
        if self.sends[unit].get("r"):
            return True, "the producer sent it again after an error (the first send had gone through)"
        sent = float(self.sends[unit]["t"])
        fault = self.timeline.first(CONNECTION_FAULTS, sent - 1.0, sent + 1.0)
        if fault is not None:
            return True, (
                f"{fault['kind']} at {fault['elapsed']}s, {sent - fault['wall']:+.3f}s from its send: the reply to "
                "a send that landed was lost and the client sent it again"
            )
        fault = self.timeline.first(WORKER_FAULTS, first["s"] - 1.0, second["s"])
        if fault is not None:
            return True, (
                f"{fault['kind']} of {target_name(fault)} at {fault['elapsed']}s between the two runs (the "
                "message of the first run was held by the killed worker)"
            )
        return False, "no fault between the two runs"

    # -- the dead letters ---------------------------------------------------------------------------

    def letter_unit(self, call_id: str) -> str | None:
        """The unit a dead letter of call ``call_id`` is of: its last attempt the ledger saw start or received
        (a retry shares its call's id), else its last attempt sent; None for a call the battle did not send."""
        units = self.units_of_call.get(call_id, [])
        for unit in reversed(units):
            if self.starts.get(unit) or self.received.get(unit):
                return unit
        return units[-1] if units else None

    def judge_letter(self, letter: Mapping[str, Any]) -> dict[str, Any]:
        """A ``worker lost`` dead letter against the ledger and the faults: its call id and unit, its category
        (``cut`` or ``accepted``: by contract; ``ended``: a run that ended, ``explained`` or not; ``wrong``),
        the worker its reason names, and why."""
        call_id, reason = str(letter["id"]), str(letter.get("why") or "")
        unit = self.letter_unit(call_id)
        worker, started = reason_start(reason)
        row: dict[str, Any] = {"id": call_id, "unit": unit, "kind": None, "path": None, "worker": worker}
        if unit is None:
            category, explained, why = "wrong", False, "a dead letter of no call the battle sent"
        elif self.acks_late or self.sends[unit]["k"] in RUN_AGAIN_KINDS:
            row.update(kind=self.sends[unit]["k"], path=self.sends[unit]["c"])
            category, explained, why = "wrong", False, "its task runs a call cut short again: no dead letter is due"
        else:
            row.update(kind=self.sends[unit]["k"], path=self.sends[unit]["c"])
            category, explained, why = self._judge_runs(unit, worker, started)
        return {**row, "category": category, "explained": explained, "why": why, "reason": reason}

    def _judge_runs(self, unit: str, worker: str | None, started: float | None) -> tuple[str, bool, str]:
        """(category, explained, why) of a dead letter of ``unit`` by its last run in the ledger."""
        starts = self.starts.get(unit, [])
        if not starts:
            return self._judge_unstarted(unit, worker, started)
        last = starts[-1]
        name = worker_name(last["w"])
        end = next((end for end in self.ends.get(unit, []) if end["w"] == last["w"] and end["s"] == last["t"]), None)
        if end is not None:
            return self._judge_ended(end)
        if worker is not None and worker != name:
            return "wrong", False, f"its last run started on {name}, but the dead letter names {worker}"
        fault = self._worker_fault_after(name, last["t"])
        if fault is None:
            return "wrong", False, f"its run started on {name} and never ended, with no fault of that worker after"
        why = (
            f"its run started on {name} {fault['wall'] - last['t']:.2f}s before its {fault['kind']} at "
            f"{fault['elapsed']}s, never ended, and was not run again"
        )
        return "cut", True, why

    def _judge_unstarted(self, unit: str, worker: str | None, started: float | None) -> tuple[str, bool, str]:
        """A dead letter of a unit the ledger never saw start: by contract only if a worker that had received it
        was killed at most :data:`ACCEPT_SECONDS` after the store recorded its start there (in task_prerun, before
        the run's first write to the ledger), or at most :data:`ORPHAN_SECONDS` before it (a pool process that
        outlived the main process)."""
        for row in reversed(self.received.get(unit, [])):
            name = worker_name(row["w"])
            fault = self._worker_fault_after(name, row["t"])
            if fault is None or worker not in (None, name):
                continue
            window = started is not None and row["t"] - 0.01 <= started <= fault["wall"] + ORPHAN_SECONDS
            if window and started is not None and fault["wall"] <= started + ACCEPT_SECONDS:
                why = (
                    f"received by {name}; its run, started {fault['wall'] - started:+.3f}s before its "
                    f"{fault['kind']} at {fault['elapsed']}s (a negative time: by a pool process that outlived the "
                    "worker's main process), was cut short before its first write to the ledger"
                )
                return "accepted", True, why
            when = "no time" if started is None else f"{started - fault['wall']:+.3f}s from the kill"
            why = (
                f"never started in the ledger; received by {name} before its {fault['kind']} at {fault['elapsed']}s, "
                f"but the store's start ({when}) is not within {ACCEPT_SECONDS:g}s before it or "
                f"{ORPHAN_SECONDS:g}s after it"
            )
            return "wrong", False, why
        return "wrong", False, "never started in the ledger, and no worker that had received it was killed after"

    def _judge_ended(self, end: Mapping[str, Any]) -> tuple[str, bool, str]:
        """A dead letter of a run that ended: explained when its acknowledgement could be lost, with its worker
        (a fault of it within :data:`ACK_SECONDS` after the end) or with Redis (a fault of Redis at most that and
        Redis's own bound after the end, or one that had Redis away when the run ended)."""
        name = worker_name(end["w"])
        fault = self._worker_fault_after(name, end["s"])
        if fault is not None and fault["wall"] <= end["e"] + ACK_SECONDS:
            why = (
                f"its run on {name} ended {fault['wall'] - end['e']:.3f}s before its {fault['kind']} at "
                f"{fault['elapsed']}s: the acknowledgement was lost with the worker"
            )
            return "ended", True, why
        for fault in self.timeline.of(CONNECTION_FAULTS):
            # An end while Redis was away, its acknowledgement tried and dropped; one just before a fault, lost in it.
            away = float(fault.get("recovery_seconds") or 0.0) + ACK_SECONDS
            if -away <= fault["wall"] - end["e"] <= ACK_SECONDS + FSYNC_BOUND_SECONDS:
                why = (
                    f"{fault['kind']} at {fault['elapsed']}s, {fault['wall'] - end['e']:+.3f}s from the end of its "
                    f"run on {name}: the acknowledgement was lost with the connection or with Redis's last writes"
                )
                return "ended", True, why
        return "ended", False, f"its run on {name} ended, and no fault came within {ACK_SECONDS:g}s after"

    def letter_figures(self, worker_kills: int) -> dict[str, Any]:
        """The ``worker lost`` dead letters by category, each with its call id, and the other dead letters."""
        counts = {name: sum(row["category"] == name for row in self.letters) for name in (*BY_CONTRACT, "ended")}
        by_contract = counts["cut"] + counts["accepted"]
        return {
            "by_contract": by_contract,
            **counts,
            "ended_unexplained": sum(row["category"] == "ended" and not row["explained"] for row in self.letters),
            "wrong": sum(row["category"] == "wrong" for row in self.letters),
            "per_worker_sigkill": round(by_contract / worker_kills, 3) if worker_kills else None,
            "rows": self.letters,
            "other": len(self.other_letters),
            "other_rows": [{"id": row["id"], "why": row.get("why")} for row in self.other_letters[:ROW_LIMIT]],
        }

    # -- the figures ------------------------------------------------------------------------------

    def as_dict(self, *, late_seconds: float = LATE_SECONDS) -> dict[str, Any]:
        by_kind: dict[str, int] = defaultdict(int)
        by_path: dict[str, int] = defaultdict(int)
        exactly_once = 0
        lost: list[dict[str, Any]] = []
        duplicates: list[dict[str, Any]] = []
        cancelled_ran: list[str] = []
        late: dict[str, list[float]] = defaultdict(list)
        late_count = 0
        for unit, send in self.sends.items():
            by_kind[send["k"]] += 1
            by_path[send["c"]] += 1
            runs = len(self.ends.get(unit, []))
            if self.expected(unit) == 0:
                if runs:
                    cancelled_ran.append(unit)
                continue
            if runs == 1:
                exactly_once += 1
            elif runs == 0:
                if unit not in self.dead_lettered:  # a run cut short and dead-lettered by contract is not lost
                    why, text = self.lost_explanation(unit)
                    lost.append({"unit": unit, "kind": send["k"], "path": send["c"], "category": why, "why": text})
            else:
                explained, text = self.explain_duplicate(unit)
                duplicates.append(
                    {
                        "unit": unit,
                        "kind": send["k"],
                        "path": send["c"],
                        "runs": len(self.ends[unit]),
                        "explained": explained,
                        "why": text,
                        "workers": [worker_name(end["w"]) for end in self.ends[unit]],
                    }
                )
            lateness = self.lateness(unit)
            if lateness is not None:
                late[lateness_group(send)].append(lateness)
                # A batch item waits for its batch by design (up to max_wait): not late for the comparison.
                late_count += lateness > late_seconds and send["k"] != "batch"
        early = [
            {"unit": unit, "early_s": round(self.due(unit, start) - start["t"], 4), "worker": start["w"]}
            for unit, starts in self.starts.items()
            if unit in self.sends
            for start in starts
            if start["t"] < self.due(unit, start) - EARLY_TOLERANCE
        ]
        runs_unsent = sorted(unit for unit in self.ends if unit not in self.sends)
        lost_parked = [row for row in lost if row["path"] == PARKED]
        lost_tracked = [row for row in lost if row["path"] == TRACKED]
        worker_kills = sum(fault["kind"] == "worker_kill" for fault in self.faults)
        by_contract = sum(row["category"] in BY_CONTRACT for row in self.letters)
        recovery, pooled = self.recovery()
        return {
            "sent": len(self.sends),
            "sent_by_kind": dict(sorted(by_kind.items())),
            "sent_by_path": dict(sorted(by_path.items())),
            "expected": sum(self.expected(unit) for unit in self.sends),
            "cancelled": sum(1 for unit in self.sends if self.cancels.get(unit)),
            "cancel_too_late": sum(1 for unit in self.sends if self.cancels.get(unit) is False),
            "cancelled_but_ran": cancelled_ran[:ROW_LIMIT],
            "cancelled_but_ran_count": len(cancelled_ran),
            "exactly_once": exactly_once,
            "lost": {
                "total": len(lost),
                "parked": len(lost_parked),
                "parked_within_redis_bound": sum(row["category"] == "bound" for row in lost_parked),
                "parked_beyond_bound": sum(row["category"] != "bound" for row in lost_parked),
                "celery_eta": sum(row["path"] == CELERY_ETA for row in lost),
                "celery_now": sum(row["path"] == CELERY_NOW for row in lost),
                "tracked": len(lost_tracked),
                "tracked_beyond_bound": sum(row["category"] != "bound" for row in lost_tracked),
                "cut_short": sum(row["category"] == "cut" for row in lost),
                "rows": lost[:ROW_LIMIT],
            },
            "dead_letters": self.letter_figures(worker_kills),
            "duplicates": {
                "total": len(duplicates),
                "unexplained": sum(not row["explained"] for row in duplicates),
                "rows": duplicates[:ROW_LIMIT],
            },
            "early": {"total": len(early), "rows": early[:ROW_LIMIT]},
            "lateness": {path: quantiles(values) for path, values in sorted(late.items())},
            "late_count": late_count,
            "late_seconds": late_seconds,
            "runs_of_unknown_units": runs_unsent[:ROW_LIMIT],
            "per_worker_sigkill": {
                "sigkills": worker_kills,
                "lost": round(len(lost) / worker_kills, 3) if worker_kills else None,
                "dead_lettered": round(by_contract / worker_kills, 3) if worker_kills else None,
                "duplicated": round(len(duplicates) / worker_kills, 3) if worker_kills else None,
                "late": round(late_count / worker_kills, 3) if worker_kills else None,
            },
            "recovery": recovery,
            "recovery_pooled": pooled,
        }

    # -- recovery ---------------------------------------------------------------------------------

    def recovery(self) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
        """Per fault: the runs it cut short (a worker fault; for a fault of Redis, the runs under way on any
        worker that never ended), the messages a killed worker had received and not run, and the calls due while
        it lasted, and how long until each started again (or how many never did, and of those how many were
        dead-lettered by contract); and those waits pooled by kind of fault and path."""
        ended = {(end["u"], end["w"], end["s"]) for ends in self.ends.values() for end in ends}
        open_runs = sorted(
            (start["t"], unit, worker_name(start["w"]))
            for unit, starts in self.starts.items()
            for start in starts
            if (unit, start["w"], start["t"]) not in ended
        )
        by_worker: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for moment, unit, name in open_runs:
            by_worker[name].append((moment, unit))
        open_moments = [row[0] for row in open_runs]
        received_by: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for unit, receipts in self.received.items():
            for row in receipts:
                received_by[worker_name(row["w"])].append((row["t"], unit))
        killed = {target_name(fault) for fault in self.faults if fault["kind"] in WORKER_FAULTS}
        first_end = {unit: min(end["e"] for end in ends) for unit, ends in self.ends.items() if ends}
        started_on: dict[tuple[str, str], float] = {}  # (unit, worker) -> its first start there
        for unit, starts in self.starts.items():
            for start in starts:
                key = (unit, worker_name(start["w"]))
                started_on[key] = min(started_on.get(key, start["t"]), start["t"])
        dues = sorted((float(send["d"]), unit) for unit, send in self.sends.items())
        due_moments = [row[0] for row in dues]
        rows = []
        pooled: dict[tuple[str, str], list[float]] = defaultdict(list)
        worst: dict[tuple[str, str], tuple[str, float]] = {}
        for fault in self.faults:
            wall = float(fault["wall"])
            back = float(fault.get("recovery_seconds") or 0.0)
            affected: dict[str, float] = {}  # unit -> waiting since
            cut = held = 0
            if fault["kind"] in WORKER_FAULTS:
                name = target_name(fault)
                for moment, unit in by_worker.get(name, []):
                    if moment <= wall:
                        affected[unit] = wall
                        cut += 1
                for moment, unit in received_by.get(name, []):
                    if (
                        moment <= wall
                        and unit not in affected
                        and self.sends.get(unit, {}).get("k") != "lock"  # a locked call's receipts include deferrals
                        and first_end.get(unit, wall + 1) > wall
                        and started_on.get((unit, name), wall + 1) > wall  # not running then (a warm stop ends it)
                    ):
                        affected[unit] = max(wall, float(self.sends[unit]["d"]) if unit in self.sends else wall)
                        held += 1
            else:
                low, high = bisect_left(open_moments, wall - 5.0), bisect_right(open_moments, wall)
                for _, unit, name in open_runs[low:high] if fault["kind"] in CONNECTION_FAULTS else []:
                    if name not in killed:  # a run a worker fault cut short is that fault's
                        affected[unit] = wall
                low, high = bisect_left(due_moments, wall), bisect_right(due_moments, wall + back)
                for due, unit in dues[low:high]:
                    affected.setdefault(unit, due)
            waits, not_again, dead = [], 0, 0
            by_path: dict[str, list[float]] = defaultdict(list)
            for unit, since in affected.items():
                later = [start["t"] for start in self.starts.get(unit, []) if start["t"] > since]
                if later:
                    waits.append(min(later) - since)
                    path = lateness_group(self.sends[unit]) if unit in self.sends else "?"
                    by_path[path].append(min(later) - since)
                    pooled[(fault["kind"], path)].append(min(later) - since)
                    if min(later) - since > worst.get((fault["kind"], path), ("", -1.0))[1]:
                        worst[(fault["kind"], path)] = (unit, min(later) - since)
                else:
                    not_again += 1
                    dead += unit in self.dead_lettered
            summary = quantiles(waits)
            rows.append(
                {
                    "kind": fault["kind"],
                    "at": fault.get("elapsed"),
                    "target": fault.get("target"),
                    "back_s": back,
                    "affected": len(affected),
                    "cut_short": cut,
                    "held": held,
                    "median_s": round(median(waits), 3) if waits else None,
                    "max_s": summary["max"],
                    "not_run_again": not_again,
                    "dead_lettered": dead,
                    "by_path": {path: quantiles(values) for path, values in sorted(by_path.items())},
                }
            )
        return rows, {
            f"{kind} {path}": {**quantiles(values), "worst_unit": worst[(kind, path)][0]}
            for (kind, path), values in sorted(pooled.items())
        }
