"""A task's message handler in the worker's main process, with a step of ours ahead of Celery's own.

Celery makes each task's handler from its ``Strategy`` when the consumer starts. :func:`wrap` puts a step in
front of it for the tasks it is given a step for: the step sees each message first and says whether it took
it (parked it, or dropped it as stale); a taken message is acknowledged as Celery's request acknowledges
one, and Celery never sees it. Every other message goes to Celery's handler unchanged, and so does one a step
failed on (logged): Celery's consumer would drop it without a word, unacknowledged. Each kind of step
wraps a task once (its patch, :mod:`celery_redisdelay.patching`), so a worker's consumer restarting does not wrap it
again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from celery.utils.imports import instantiate

from .. import patching

logger = logging.getLogger(__name__)

#: A step: the received message -> whether it took it.
Step = Callable[[Any], bool]


def wrap(tasks: Any, patch: str, step_for: Callable[[Any], Step | None]) -> int:
    """Put ``step_for(task)`` ahead of the handler of each task it gives a step for, as the patch ``patch``; how
    many it wrapped."""
    wrapped = 0
    for task in list(tasks.values()):
        step = step_for(task)
        if step is None or patching.applied(task, patch):
            continue
        patching.apply(patch, task, {"Strategy": functools.partial(_strategy, step=step, original=task.Strategy)})
        wrapped += 1
    return wrapped


def _strategy(task: Any, app: Any, consumer: Any, *, step: Step, original: Any, **options: Any) -> Callable[..., Any]:
    """A task's message handler: ``step``, then Celery's own (``original``) for what it did not take."""
    handle: Callable[..., Any] = instantiate(original, task, app, consumer, **options)

    def handler(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **more: Any) -> Any:
        try:
            took = step(message)
        except Exception:  # a step's own defect must not lose the message: Celery's handler has it, as without us
            logger.exception("redisdelay: a message handler step failed on message %r; Celery handles it", message)
            took = False
        if took:
            ack(logger, consumer.connection_errors)  # as Celery's request acknowledges
            return None
        return handle(message, body, ack, reject, callbacks, **more)

    return handler
