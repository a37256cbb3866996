"""The way out: every call waiting in the store handed back to Celery's own path, so the extension can be removed.

A parked call, a call held by its limits and a call waiting on a pause each go to the broker as the message Celery
built for it, with Celery's own ``eta`` header set to the call's due time: a worker without the extension holds it
until then, as it holds any eta message, and runs it. It keeps its id, its arguments and its options; one already
due runs at once. A flushed batch goes out as its task's call ``task(key, items)``, as the release sends it.

Each step takes up to :data:`STEP` calls out of the store in one script (``cancel.lua``, with the drain's own keys:
:attr:`~celery_redisdelay.store.keys.Keyspace.undrained` keeps their payloads), publishes them, then forgets the
payloads. A drain that dies between the two leaves them there; the next drain hands them out first, so none is lost,
and a finished drain leaves nothing to hand out twice.

What Celery has no form for stays in place, listed with its reason: a call deferred behind a busy lock (``lock=``),
a batch group still gathering items, a payload that cannot be read. The calls in flight are in the broker or
running already, and the dead letters wait for a person: both are counted, not moved.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kombu.exceptions import OperationalError

from ..errors import RedisDelayError
from ..message.envelope import Envelope, EnvelopeError
from ..message.marks import ETA_HEADER, strip_marks
from ..message.stored import BatchCall, decode_stored
from ..producer.batch import BatchedTask
from ..release.releaser import publish
from ..store.calls import LARGEST_STEP, CallStore, Entry

if TYPE_CHECKING:
    from celery import Celery

    from ..store.depot import Depot

#: The most calls one step takes out of the store (one script) and publishes.
STEP = 500
#: The states a drain empties, in the order it empties them (names of ``CallStore.read``).
DRAINED_STATES = ("delayed", "limited", "paused")


class DrainError(RedisDelayError):
    """The broker refused a drained call; the calls taken and not published stay for the next drain."""


@dataclass
class Kept:
    """A call left in the store, and why."""

    id: str
    state: str
    task: str
    reason: str


@dataclass
class DrainReport:
    """What a drain did: the calls it handed back (by id), those it left with their reasons, and what it does not
    move (calls in flight, dead letters, batch groups still open)."""

    handed: list[str] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    in_flight: int = 0
    dead: int = 0
    open_batches: int = 0
    batch_items: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "handed_back": len(self.handed),
            "left": [dataclasses.asdict(kept) for kept in self.kept],
            "in_flight": self.in_flight,
            "dead": self.dead,
            "open_batch_groups": self.open_batches,
            "batch_items": self.batch_items,
        }


def iso(ms: float) -> str:
    """A due time (ms since the epoch) as Celery writes an eta: ISO 8601, in UTC."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()


def why_kept(app: Celery, entry: Entry) -> str | None:
    """Why a parked call cannot be handed to Celery, or None when it can."""
    if entry.meta.get("s") == "deferred":
        return "deferred behind its busy lock (lock=): Celery has no form for a call that waits for a lock"
    if not entry.envelope:
        return "it has no payload"
    try:
        stored = decode_stored(entry.envelope)
    except EnvelopeError as exc:
        return f"its payload cannot be read ({exc})"
    if isinstance(stored, BatchCall) and not isinstance(app.tasks.get(stored.task), BatchedTask):
        return f"a batch of task {stored.task!r}, which this app does not register: import its module, drain again"
    return None


def hand_out(app: Celery, send_task: Any, producer: Any, call_id: str, payload: bytes, due_ms: float | None) -> None:
    """Publish one drained call as Celery would have sent it, with an eta of ``due_ms`` (or the eta Celery wrote
    in it, for a call an earlier drain left without its due time)."""
    stored = decode_stored(payload)
    if isinstance(stored, BatchCall):
        task = app.tasks[stored.task]
        eta = iso(due_ms) if due_ms is not None else None
        send_task(
            stored.task,
            args=(stored.key, stored.items),
            task_id=call_id,
            producer=producer,
            eta=eta,
            **task.routing_options,
        )
        return
    headers = strip_marks(stored.headers)
    eta = iso(due_ms) if due_ms is not None else stored.headers.get(ETA_HEADER)
    if eta:
        headers["eta"] = eta
    publish(app, producer, Envelope(**{**dataclasses.asdict(stored), "headers": headers}))


class Drain:
    """One drain of a deployment's store (:func:`drain`)."""

    def __init__(self, app: Celery, depot: Depot, send_task: Any) -> None:
        self.app = app
        self.depot = depot
        self.send_task = send_task
        self.report = DrainReport()

    def _publish(self, store: CallStore, calls: list[tuple[str, bytes]], due: dict[str, float]) -> None:
        """Publish the calls taken; then forget their payloads. A refusal stops the drain: what was not
        published stays in the store's undrained calls."""
        published: list[str] = []
        try:
            with self.app.producer_or_acquire() as producer:
                for call_id, payload in calls:
                    try:
                        hand_out(self.app, self.send_task, producer, call_id, payload, due.get(call_id))
                    except (OperationalError, OSError) as exc:
                        raise DrainError(
                            f"the broker refused call {call_id} ({exc}); it and the {len(calls) - len(published) - 1} "
                            "after it wait in the store's undrained calls: run drain again"
                        ) from exc
                    published.append(call_id)
        finally:
            for start in range(0, len(published), LARGEST_STEP):
                store.drain_done(published[start : start + LARGEST_STEP])
            self.report.handed += published

    def leftovers(self, store: CallStore) -> None:
        """Hand out first what an earlier drain took and did not publish."""
        while calls := store.undrained(STEP):
            self._publish(store, calls, {})

    def state(self, store: CallStore, state: str) -> None:
        """Hand out every call of ``state`` that can be, a page at a time; the ones kept stay at the front."""
        kept = 0
        while True:
            entries, _ = store.read(state, kept, STEP, payloads="all")
            if not entries:
                return
            wanted: dict[str, float] = {}
            for entry in entries:
                reason = why_kept(self.app, entry)
                if reason is None:
                    wanted[entry.id] = entry.score_ms
                else:
                    kept += 1
                    self.report.kept.append(Kept(entry.id, state, str(entry.meta.get("t", "?")), reason))
            if wanted:
                self._publish(store, store.drain_take(list(wanted)), wanted)

    def run(self) -> DrainReport:
        for store in self.depot.shards.all():
            self.leftovers(store)
            for state in DRAINED_STATES:
                self.state(store, state)
        stats = self.depot.stats()
        self.report.in_flight = stats.get("inflight", 0)
        self.report.dead = stats.get("dead", 0)
        self.report.open_batches = stats.get("batch_groups", 0)
        self.report.batch_items = stats.get("batch_items", 0)
        return self.report


def drain(app: Celery, depot: Depot, send_task: Any) -> DrainReport:
    """Hand every call waiting in the store back to Celery's own path (see the module's docstring); ``send_task``
    is Celery's own (a flushed batch goes out through it)."""
    return Drain(app, depot, send_task).run()


def waiting(depot: Depot) -> dict[str, int]:
    """What a drain would look at, counted without moving anything: the calls of each state it empties, and
    those in flight and dead, which it leaves."""
    counts: dict[str, int] = {}
    for store in depot.shards.all():
        for state in (*DRAINED_STATES, "inflight", "dead"):
            _, size = store.read(state, 0, 1)
            counts[state] = counts.get(state, 0) + size
    return counts
