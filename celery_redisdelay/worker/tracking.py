"""The worker side: a call's run deadline starts when a worker starts it; it is acknowledged when done.

Hooked through Celery's signals: ``task_prerun`` / ``task_postrun`` in the process that runs the task;
``task_failure`` for the failures the worker's main process records itself (a pool process that died,
a run its hard time limit ended); ``task_revoked`` when a worker discards a revoked or expired
message. A call is acknowledged when Celery considers it finished, and only then. Starts and
acknowledgements go through the process's outbox (:mod:`celery_redisdelay.store.outbox`), which writes
them in batches from a thread: a run makes no Redis call of its own. A failure to reach Redis never fails
the task: the call stays in flight and the sweep delivers it again (at-least-once). A worker also makes a
``revoke`` durable for parked calls (:func:`drop_revoked`, see :mod:`celery_redisdelay.bootsteps`).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from billiard.exceptions import WorkerLostError
from celery import signals
from celery.exceptions import TimeLimitExceeded
from celery.states import IGNORED, REJECTED, RETRY

from ..errors import Abandon, Deferred, RedisDelayError
from ..message.marks import drop_mark, request_from_store
from ..producer.adoption import adoptable
from .contract import DEAD_LETTER, worker_lost
from .revocation import cancel_many

if TYPE_CHECKING:
    from ..store.depot import Depot

logger = logging.getLogger(__name__)

#: Failures of a run that the worker's main process records (the pool process never got to report).
MAIN_PROCESS_FAILURES = (WorkerLostError, TimeLimitExceeded)


def finishes_call(state: str, retval: Any) -> bool:
    """Whether a delivery that ended in ``state`` finished the call, so it is acknowledged."""
    if state == RETRY:
        return False  # the retry parked the call again under the same id
    if state == IGNORED:
        return not isinstance(retval, (Abandon, Deferred))  # still in flight / parked behind a lock
    if state == REJECTED:
        return not getattr(retval, "requeue", False)  # a requeued message comes back from the broker
    return True


class Tracking:
    """The handlers of ``depot``'s calls (see :func:`connect`); each ignores tasks whose calls are not parked in
    ``depot``: its app's delayed tasks, and its plain tasks where ``redisdelay_all_tasks`` or
    ``redisdelay_park_received`` parks their delayed calls. Of a plain task only the runs of parked calls are
    tracked: a run of a call never parked (its message has no mark, see :mod:`celery_redisdelay.message.marks`)
    makes no Redis call."""

    def __init__(self, depot: Depot) -> None:
        self.depot = depot
        self.outbox = depot.outbox
        # Runs of parked calls, until they end, counted by call: under the threads, gevent and eventlet pools one
        # call's runs may overlap in a process (a run deferred behind a lock ends after the wake-up's delivery has
        # started).
        self.tracked: Counter[str] = Counter()
        self.counting = threading.Lock()  # two threads' runs of one call: neither count may be lost

    def ours(self, task: Any) -> bool:
        return parks_calls_of(self.depot, task)

    def owns(self, task: Any) -> bool:
        return self.ours(task) and not getattr(task.request, "is_eager", False)

    def on_prerun(self, sender: Any = None, task_id: str | None = None, **_: Any) -> None:
        # The mark first: a run of a call never parked (most, in redisdelay_all_tasks mode) stops here, at the
        # cost of a look at its request (message/marks.py), and makes no Redis call.
        if task_id is None or sender is None:
            return
        request = sender.request
        if not request_from_store(request) or not self.owns(sender):
            return
        drop_mark(request)
        with self.counting:
            self.tracked[task_id] += 1
        # The worker's main process holds the call under a lease (worker/leases.py); the start takes it
        # for this worker too, should it come first, under the name the leases use.
        depot = self.depot
        worker = depot.worker_name or getattr(request, "hostname", None) or ""
        if worker_lost(sender, depot.settings.worker_lost) == DEAD_LETTER:
            start_now(depot, task_id, worker)  # before the body runs: a run that did any work counts as started
        else:
            self.outbox.start(task_id, worker)

    def on_postrun(
        self, sender: Any = None, task_id: str | None = None, state: str | None = None, retval: Any = None, **_: Any
    ) -> None:
        if task_id is None:
            return
        with self.counting:
            tracked = self.tracked
            if not tracked[task_id]:
                return
            tracked[task_id] -= 1
            if not tracked[task_id]:
                del tracked[task_id]
        if state is not None and finishes_call(state, retval):
            self.outbox.ack(task_id)

    def on_failure(self, sender: Any = None, task_id: str | None = None, exception: Any = None, **_: Any) -> None:
        # The worker's main process records these failures itself and sends this signal (billiard reports
        # a hard time limit through the same error callback), unless task_reject_on_worker_lost requeued
        # the message or the task retried: Celery will not run the call again, so neither do we.
        # Failures raised by the task itself are acknowledged by task_postrun, in the pool process.
        if task_id is not None and isinstance(exception, MAIN_PROCESS_FAILURES) and self.owns(sender):
            self.outbox.ack(task_id)

    def on_revoked(self, sender: Any = None, request: Any = None, expired: bool = False, **_: Any) -> None:
        # A worker discarded the message unrun (revoked, or past its expires), or terminated its run;
        # Celery has marked the result REVOKED. Stop tracking the call, or the sweep would send it again.
        call_id = getattr(request, "id", None)
        if call_id is not None and self.ours(sender):
            self.outbox.ack(call_id, "expired" if expired else "revoked")

    def on_exit(self, **_: Any) -> None:
        self.outbox.flush()  # a pool process that ends, or the worker: what it gathered reaches Redis first

    def on_unknown(self, sender: Any = None, name: str | None = None, id: str | None = None, **_: Any) -> None:
        # Celery discards a message for a task this worker does not know; a call of ours would only
        # come back after its queue timeout, again and again. Quarantine it now, saying why.
        if id is None or getattr(sender, "app", None) is not self.depot.app:
            return
        reason = f"task {name!r} is not registered on the worker that received it; deploy it, then requeue"
        try:
            if self.depot.shards.first(id, lambda store: store.bury(id, reason, only_inflight=True)):
                logger.error("redisdelay: dead-lettered call %s: %s", id, reason)
        except RedisDelayError as exc:
            logger.warning("redisdelay: could not dead-letter call %s of unknown task %r: %s", id, name, exc)

    def handlers(self) -> dict[Any, Callable[..., None]]:
        """Each signal of :data:`SIGNALS` and its handler."""
        on_exit = self.on_exit
        handlers = (
            self.on_prerun,
            self.on_postrun,
            self.on_failure,
            self.on_revoked,
            self.on_unknown,
            on_exit,
            on_exit,
        )
        return dict(zip(SIGNALS, handlers, strict=True))


def connect(depot: Depot) -> Tracking:
    """Connect the handlers of ``depot``'s calls (:class:`Tracking`), each under a ``dispatch_uid`` of the depot."""
    tracking = Tracking(depot)
    for signal, handler in tracking.handlers().items():
        signal.connect(handler, weak=False, dispatch_uid=_uid(depot, signal))
    return tracking


#: The signals :func:`connect` connects a depot's handlers to.
SIGNALS = (
    signals.task_prerun,
    signals.task_postrun,
    signals.task_failure,
    signals.task_revoked,
    signals.task_unknown,
    signals.worker_process_shutdown,
    signals.worker_shutdown,
)


def _uid(depot: Depot, signal: Any) -> str:
    return f"redisdelay-tracking-{id(depot)}-{signal.name}"


def disconnect(depot: Depot) -> int:
    """Disconnect the handlers :func:`connect` connected for ``depot``; how many there were."""
    return sum(bool(signal.disconnect(dispatch_uid=_uid(depot, signal))) for signal in SIGNALS)


def start_now(depot: Depot, call_id: str, worker: str) -> None:
    """Write the start of a run that is not run again if cut short with its worker (worker/contract.py), in this
    thread, before the task's body runs, with what the process's outbox gathered so far (``Outbox.start_now``);
    should the store not take it, the outbox writes it when it does (a worker that dies meanwhile has the call run
    again)."""
    if not depot.outbox.start_now(call_id, worker):
        logger.warning("redisdelay: could not write the start of call %s now; the outbox will", call_id)


def parks_calls_of(depot: Depot, task: Any) -> bool:
    """Whether ``task``'s calls may be parked in ``depot``: its app's delayed tasks, and its plain tasks
    where ``redisdelay_all_tasks`` or ``redisdelay_park_received`` parks their delayed calls."""
    if getattr(task, "depot", None) is depot:
        return True
    settings = depot.settings
    return (settings.all_tasks or settings.park_received) and adoptable(task) and _app_of(task) is depot.app


def _app_of(task: Any) -> Any:
    try:
        return task._get_app()
    except Exception:  # noqa: BLE001 - an object that is no bound task belongs to no app of ours
        return None


def drop_revoked(depot: Depot, task_ids: list[str]) -> int:
    """Drop revoked calls that are still parked and record them revoked; how many were parked. Every worker
    hears the broadcast: the one whose cancel drops a call records it."""
    return len(cancel_many(depot, task_ids, take_over=False)) if task_ids else 0
