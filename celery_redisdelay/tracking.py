"""The worker side: a call's run deadline starts when a worker starts it; it is acknowledged when done.

Hooked through Celery's ``task_prerun`` / ``task_postrun`` signals, which fire in the process that
runs the task. A failure to reach Redis here never fails the task: the call stays in flight and the
sweep delivers it again (at-least-once).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from celery import signals
from celery.states import IGNORED, REJECTED, RETRY

from .errors import Abandon, Deferred, RedisDelayError

if TYPE_CHECKING:
    from .extension import RedisDelay

logger = logging.getLogger(__name__)

#: Waits before the second and third attempt to acknowledge: long enough to outlast a Redis restart
#: or a dropped connection (the chaos runs saw acks fail inside 0.2 s restarts), short for a worker.
ACK_BACKOFF_SECONDS = (0.2, 1.0)
ACK_ATTEMPTS = len(ACK_BACKOFF_SECONDS) + 1


def finishes_call(state: str, retval: Any) -> bool:
    """Whether a delivery that ended in ``state`` finished the call, so it is acknowledged."""
    if state == RETRY:
        return False  # the retry parked the call again under the same id
    if state == IGNORED:
        return not isinstance(retval, (Abandon, Deferred))  # still in flight / parked behind a lock
    if state == REJECTED:
        return not getattr(retval, "requeue", False)  # a requeued message comes back from the broker
    return True


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
        if task_id is None or state is None or not owns(sender) or not finishes_call(state, retval):
            return
        for attempt in range(1, ACK_ATTEMPTS + 1):
            try:
                rd.shards.first(task_id, lambda store: store.ack(task_id))
                return
            except RedisDelayError as exc:
                if attempt == ACK_ATTEMPTS:
                    logger.error("redisdelay: could not acknowledge call %s; it will run again: %s", task_id, exc)
                else:
                    time.sleep(ACK_BACKOFF_SECONDS[attempt - 1])

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
    signals.task_unknown.connect(on_unknown, weak=False)
