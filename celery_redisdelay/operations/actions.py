"""The operator's actions on many calls: a selection of ids, or everything matching a filter.

Each step is one script call on one shard over at most 1,000 ids (``store.LARGEST_STEP``): the ids are
grouped by the shard they live in (a call parked under another shard count is looked for in the
others). "Everything matching a filter" reads the matching calls page by page with the paginator of
:mod:`celery_redisdelay.operations.listing` and acts on each page as it goes, so it never holds more than one step
of ids and no script walks an unbounded backlog; it stops early, and says so, after ``most`` calls or
``budget`` seconds. Cancelling goes through :func:`~celery_redisdelay.worker.revocation.cancel_many`,
which also marks each cancelled call REVOKED in the result backend.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from ..errors import RedisDelayError
from ..store.calls import LARGEST_STEP
from ..store.shards import Step, on_shards
from ..worker.revocation import cancel_many
from .listing import Filter, Scanner, scanner_for, server_ms

if TYPE_CHECKING:
    from ..store.depot import Depot

#: Actions and the state their calls must be in.
ACTION_STATES = {"run-now": "delayed", "reschedule": "delayed", "cancel": "delayed", "requeue": "dead", "purge": "dead"}
#: The lists (:data:`~celery_redisdelay.store.calls.LISTS`) each action reaches: a cancel also takes the due calls
#: waiting on their limits out of their gates, and the calls waiting on pauses out of the paused set (cancel.lua).
CANCELLED = ("delayed", "limited", "paused")
ACTION_LISTS = {action: (state,) for action, state in ACTION_STATES.items()} | {"cancel": CANCELLED}


def step_for(depot: Depot, action: str, due_ms: int | None = None) -> Step:
    """The script step of an action (``cancel`` is :func:`~celery_redisdelay.worker.revocation.cancel_many`)."""
    if action == "run-now":
        return lambda store, ids: (store.reschedule_many(ids, countdown_ms=0)[1], [])
    if action == "reschedule":
        if due_ms is None:
            raise RedisDelayError("reschedule needs a due time")
        return lambda store, ids: (store.reschedule_many(ids, due_ms=due_ms)[1], [])
    if action == "requeue":
        return lambda store, ids: store.requeue_many(ids)
    if action == "purge":
        return lambda store, ids: (store.purge_many(ids), [])
    raise RedisDelayError(f"unknown action {action!r}; expected one of {', '.join(ACTION_STATES)}")


def act_on(depot: Depot, action: str, ids: Sequence[str], due_ms: int | None = None) -> tuple[list[str], list[str]]:
    """Do ``action`` to the calls ``ids``: (ids done, ids found but refused: dead without a payload).

    Ids that are not in the action's state (released, finished, cancelled meanwhile) are in neither.
    """
    if action == "cancel":
        return cancel_many(depot, ids), []
    return on_shards(depot.shards, ids, step_for(depot, action, due_ms))


@dataclass
class BulkReport:
    """What an action on everything matching a filter did."""

    action: str
    done: int = 0  # calls changed
    refused: int = 0  # calls found but left as they were (dead without a payload)
    scanned: int = 0  # entries read
    steps: int = 0  # script rounds
    stopped: str | None = None  # why it ended before the end of the set
    refused_ids: list[str] = field(default_factory=list)  # the first 100

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "done": self.done,
            "refused": self.refused,
            "refused_ids": self.refused_ids,
            "scanned": self.scanned,
            "steps": self.steps,
            "stopped": self.stopped,
        }


@dataclass(frozen=True)
class BulkRequest:
    """How an action on everything matching a filter goes: the new due time of a reschedule (``due_ms``, or
    ``countdown_ms`` from when it starts), the order it reads in, ``step`` calls per script call and at most ``scan``
    entries read per round, the most calls and seconds (``budget``) it takes, and the lists it goes over (None: all
    the action reaches)."""

    due_ms: int | None = None
    countdown_ms: int | None = None
    newest_first: bool = False
    step: int = LARGEST_STEP
    scan: int = 10_000
    most: int | None = None
    budget: float | None = None
    lists: tuple[str, ...] | None = None

    def check(self) -> None:
        """Refuse a step no script takes, or a round that reads nothing."""
        if not 1 <= self.step <= LARGEST_STEP or self.scan < 1:
            raise RedisDelayError(
                f"step must be from 1 to {LARGEST_STEP} and scan at least 1, not {self.step} and {self.scan}"
            )

    def stop_reason(self, done: int, started: float) -> str | None:
        """Why the action stops before the end of the set, having done ``done`` calls since ``started`` (a
        ``time.monotonic()``); None while it may go on."""
        if self.most is not None and done >= self.most:
            return f"stopped after {done:,} calls (the most one request does); run it again"
        if self.budget is not None and time.monotonic() - started > self.budget:
            return f"stopped after {self.budget:.0f} s with {done:,} calls done; run it again"
        return None


class BulkOptions(TypedDict, total=False):
    """The keywords :func:`act_on_matching` takes: the fields of :class:`BulkRequest`."""

    due_ms: int | None
    countdown_ms: int | None
    newest_first: bool
    step: int
    scan: int
    most: int | None
    budget: float | None
    lists: tuple[str, ...] | None


def act_on_matching(depot: Depot, action: str, found: Filter, **options: Unpack[BulkOptions]) -> BulkReport:
    """Do ``action`` to every call of its state that ``found`` matches, ``step`` calls per script call (a
    ``cancel``: the delayed calls, then those held by their limits, then those waiting on pauses; ``lists`` chooses
    among the action's). The keywords are those of :class:`BulkRequest`, with its defaults.

    Each round reads at most ``scan`` entries (and keeps at most ``step`` matching ones), acts on them,
    and moves the read position back over the calls that left the set (or, for a reschedule, moved
    behind it), so no call is skipped; a reschedule leaves calls already due at the new time alone, so
    none is moved twice. A reschedule's ``countdown_ms`` is turned into one due time when it starts.
    It stops after ``most`` calls or ``budget`` seconds, saying so in ``stopped``; running it again
    carries on. Calls that change state meanwhile may be skipped, as with any page.
    """
    request = BulkRequest(**options)
    lists = _lists_of(action, request.lists)
    request.check()
    report = BulkReport(action)
    action, due_ms = _due_of(depot, action, request)
    started = time.monotonic()
    for listed in lists:
        chunk = min(request.step, request.scan)
        scanner = scanner_for(depot, listed, None, found, newest_first=request.newest_first, chunk=chunk)
        while True:
            picked, last = _pick(depot, scanner, found, report, request.step, request.scan, skip_score=due_ms)
            if picked:
                _act(depot, action, scanner, picked, last, report, due_ms, request.newest_first)
            if scanner.exhausted:
                break
            stopped = request.stop_reason(report.done, started)
            if stopped is not None:
                report.stopped = stopped
                return report
    return report


def _lists_of(action: str, lists: tuple[str, ...] | None) -> tuple[str, ...]:
    """The lists ``action`` goes over: ``lists``, or every one it reaches. An unknown action is refused, and so are
    lists it does not reach."""
    if action not in ACTION_LISTS:
        raise RedisDelayError(f"unknown action {action!r}; expected one of {', '.join(ACTION_LISTS)}")
    if lists is None:
        lists = ACTION_LISTS[action]
    if not lists or any(listed not in ACTION_LISTS[action] for listed in lists):
        raise RedisDelayError(f"{action} reaches the {' and '.join(ACTION_LISTS[action])} calls, not {lists}")
    return lists


def _due_of(depot: Depot, action: str, request: BulkRequest) -> tuple[str, int | None]:
    """The action a bulk action runs as, and the one due time it moves calls to (None but for a reschedule): a
    ``run-now`` is a reschedule to the store's now, and a reschedule's countdown counts from the store's now."""
    due_ms = request.due_ms
    if action == "reschedule" and request.countdown_ms is not None:
        due_ms = server_ms(depot) + request.countdown_ms
    if action == "run-now":
        action, due_ms = "reschedule", server_ms(depot)  # one due time for all: each call is moved once
    if action == "reschedule" and due_ms is None:
        raise RedisDelayError("reschedule needs countdown_ms or due_ms")
    if action != "reschedule":
        due_ms = None
    return action, due_ms


def _pick(
    depot: Depot,
    scanner: Scanner,
    found: Filter,
    report: BulkReport,
    step: int,
    scan: int,
    skip_score: int | None,
) -> tuple[dict[int, list[str]], dict[int, tuple[float, str]]]:
    """The next matching ids per shard (at most ``step``), and the last entry read from each shard."""
    picked: dict[int, list[str]] = {}
    last: dict[int, tuple[float, str]] = {}
    count = read = 0
    while count < step and read < scan:
        item = scanner.next()
        if item is None:
            break
        shard, entry = item
        read += 1
        last[shard] = (entry.score_ms, entry.id)
        if skip_score is not None and entry.score_ms == skip_score:
            continue  # already due at the new time (moved by an earlier round)
        if found.matches(depot, entry):
            picked.setdefault(shard, []).append(entry.id)
            count += 1
    report.scanned += read
    return picked, last


def _act(
    depot: Depot,
    action: str,
    scanner: Scanner,
    picked: dict[int, list[str]],
    last: dict[int, tuple[float, str]],
    report: BulkReport,
    due_ms: int | None,
    newest_first: bool,
) -> None:
    """One round: the action on the picked ids, then the read position moved back over the calls that
    left the part of the set already read."""
    ids = [call_id for shard_ids in picked.values() for call_id in shard_ids]
    done, refused = act_on(depot, action, ids, due_ms)
    report.steps += 1
    report.done += len(done)
    report.refused += len(refused)
    report.refused_ids += refused[: max(0, 100 - len(report.refused_ids))]
    gone = set(done)
    for shard, shard_ids in picked.items():
        left = [call_id for call_id in shard_ids if call_id in gone]
        if due_ms is not None:
            # A rescheduled call left the part already read only if its new place sorts after the last read.
            edge = last[shard]
            left = [i for i in left if ((due_ms, i) < edge if newest_first else (due_ms, i) > edge)]
        scanner.offsets[shard] -= len(left)
    scanner.reset()
