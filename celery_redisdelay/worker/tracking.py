"""The worker side: a call's run deadline starts when a worker starts it; it is acknowledged when done.

Hooked through Celery's signals: ``task_prerun`` / ``task_postrun`` in the process that runs the task;
``task_failure`` for the failures the worker's main process records itself (a pool process that died,
a run its hard time limit ended); ``task_revoked`` when a worker discards a revoked or expired
message. A call is acknowledged when Celery considers it finished, and only then. A failure to reach Redis here never
fails the task: the call stays in flight and the sweep delivers it again (at-least-once).

A worker also makes a ``revoke`` durable for parked calls: when the broadcast arrives, the call is
dropped from the delay set (Celery keeps revoked ids in worker memory only, for three hours, and a
parked call may wait longer than that).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from billiard.exceptions import WorkerLostError
from celery import bootsteps, signals
from celery.exceptions import TimeLimitExceeded
from celery.states import IGNORED, REJECTED, RETRY
from celery.utils.functional import maybe_list

from ..errors import Abandon, Deferred, RedisDelayError

if TYPE_CHECKING:
    from ..extension import RedisDelay

logger = logging.getLogger(__name__)

#: Waits before the second and third attempt to acknowledge: long enough to outlast a Redis restart
#: or a dropped connection (the chaos runs saw acks fail inside 0.2 s restarts), short for a worker.
ACK_BACKOFF_SECONDS = (0.2, 1.0)
ACK_ATTEMPTS = len(ACK_BACKOFF_SECONDS) + 1
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


def acknowledge(rd: RedisDelay, task_id: str, outcome: str = "acked") -> None:
    """Stop tracking a finished call, counting how it ended; retried a little, then left to the sweep."""
    for attempt in range(1, ACK_ATTEMPTS + 1):
        try:
            rd.shards.first(task_id, lambda store: store.ack(task_id, outcome))
            return
        except RedisDelayError as exc:
            if attempt == ACK_ATTEMPTS:
                logger.error("redisdelay: could not acknowledge call %s; it will run again: %s", task_id, exc)
            else:
                time.sleep(ACK_BACKOFF_SECONDS[attempt - 1])


def connect(rd: RedisDelay) -> None:
    """Connect ``rd``'s handlers; each ignores tasks that are not ``rd``'s delayed tasks."""

    def owns(task: Any) -> bool:
        return getattr(task, "redisdelay", None) is rd and not getattr(task.request, "is_eager", False)

    def on_prerun(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
        if task_id is None or not owns(sender):
            return
        try:
            timeout_ms = round(rd.settings.visibility_timeout * 1000)
            rd.shards.first(task_id, lambda store: store.start(task_id, timeout_ms))
        except RedisDelayError as exc:
            logger.warning("redisdelay: could not mark call %s started: %s", task_id, exc)

    def on_postrun(
        sender: Any = None, task_id: str | None = None, state: str | None = None, retval: Any = None, **_: Any
    ) -> None:
        if task_id is not None and state is not None and owns(sender) and finishes_call(state, retval):
            acknowledge(rd, task_id)

    def on_failure(sender: Any = None, task_id: str | None = None, exception: Any = None, **_: Any) -> None:
        # The worker's main process records these failures itself and sends this signal (billiard reports
        # a hard time limit through the same error callback), unless task_reject_on_worker_lost requeued
        # the message or the task retried: Celery will not run the call again, so neither do we.
        # Failures raised by the task itself are acknowledged by task_postrun, in the pool process.
        if task_id is not None and isinstance(exception, MAIN_PROCESS_FAILURES) and owns(sender):
            acknowledge(rd, task_id)

    def on_revoked(sender: Any = None, request: Any = None, expired: bool = False, **_: Any) -> None:
        # A worker discarded the message unrun (revoked, or past its expires), or terminated its run;
        # Celery has marked the result REVOKED. Stop tracking the call, or the sweep would send it again.
        call_id = getattr(request, "id", None)
        if call_id is not None and getattr(sender, "redisdelay", None) is rd:
            acknowledge(rd, call_id, "expired" if expired else "revoked")

    def on_unknown(sender: Any = None, name: str | None = None, id: str | None = None, **_: Any) -> None:
        # Celery discards a message for a task this worker does not know; a call of ours would only
        # come back after its queue timeout, again and again. Quarantine it now, saying why.
        if id is None or getattr(sender, "app", None) is not rd.app:
            return
        reason = f"task {name!r} is not registered on the worker that received it; deploy it, then requeue"
        try:
            if rd.shards.first(id, lambda store: store.bury(id, reason, only_inflight=True)):
                logger.error("redisdelay: dead-lettered call %s: %s", id, reason)
        except RedisDelayError as exc:
            logger.warning("redisdelay: could not dead-letter call %s of unknown task %r: %s", id, name, exc)

    signals.task_prerun.connect(on_prerun, weak=False)
    signals.task_postrun.connect(on_postrun, weak=False)
    signals.task_failure.connect(on_failure, weak=False)
    signals.task_revoked.connect(on_revoked, weak=False)
    signals.task_unknown.connect(on_unknown, weak=False)


def drop_revoked(rd: RedisDelay, task_ids: list[str]) -> int:
    """Drop revoked calls that are still parked and record them revoked; how many were parked."""
    return len(rd.cancel_many(task_ids)) if task_ids else 0


def make_revokes_durable() -> None:
    """Wrap the worker's ``revoke`` remote-control command (once per process): after Celery's own
    handling, calls of an app with celery-redisdelay that are still parked are dropped for good.

    Celery looks its control commands up in the registry ``Panel.data`` when a broadcast arrives; the
    wrapper stays there for the life of the worker process and defers to Celery's handler first.
    """
    from celery.worker.control import Panel

    original = Panel.data["revoke"]
    if getattr(original, "redisdelay_wrapped", False):
        return

    def revoke(state: Any, task_id: Any, *args: Any, **kwargs: Any) -> Any:
        reply = original(state, task_id, *args, **kwargs)
        from ..extension import RedisDelay

        rd = RedisDelay.registered(getattr(state, "app", None))
        if rd is not None:
            ids = [str(one) for one in maybe_list(task_id) or []]
            try:
                dropped = drop_revoked(rd, ids)
            except Exception as exc:  # noqa: BLE001 - the worker's revoke has happened; the release discards it
                logger.warning("redisdelay: could not drop revoked calls %s from the delay set: %r", ids, exc)
            else:
                if dropped:
                    logger.info("redisdelay: dropped %d revoked parked call(s): %s", dropped, ", ".join(ids))
        return reply

    revoke.redisdelay_wrapped = True  # type: ignore[attr-defined]
    revoke.__doc__ = original.__doc__
    Panel.data["revoke"] = revoke


class DurableRevokeStep(bootsteps.Step):  # type: ignore[misc]  # Celery is untyped
    """A worker step that makes ``revoke`` durable for parked calls (see :func:`make_revokes_durable`)."""

    label = "redisdelay revokes"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        make_revokes_durable()
