"""Each task's delivery contract: what becomes of a call whose run was cut short with its worker.

A call a dead worker held but had not started runs again on another worker, whatever its task. A call it was
running is another matter: Celery acknowledges a message early by default (when the pool accepts the run), so that
a task that must not run twice ("charge the card") is not run again when its worker dies mid-run; Celery then loses
the run without a word. With ``acks_late`` the message is acknowledged when the run ends, and a run cut short is
run again.

celery-redisdelay keeps each task's choice, and loses nothing either way:

* :data:`RUN_AGAIN`: the call runs again on another worker once its lease runs out (at-least-once). The default of
  a task that acknowledges late, and of ``@rd.delayed`` tasks (their documented contract).
* :data:`DEAD_LETTER`: the call is not run again. It becomes a dead letter whose reason names the worker, the
  delivery and when the run started, counted as ``worker_lost``; it runs again only when a person requeues it. The
  default of a task that acknowledges early (Celery's default).

Either can be chosen for one task (``@app.task(redisdelay_worker_lost="run_again")``) or for the whole app (the
setting ``redisdelay_worker_lost``); the task's own choice wins.

For a :data:`DEAD_LETTER` task the process that runs the call writes the start before the task's body runs, in one
round trip of its own (``task_prerun``, :func:`celery_redisdelay.worker.tracking.connect`): a run that has done any
work is never taken for one that has not started. (Plain Celery acknowledges the message once the pool process has
told the worker's main process it started the run, a moment after the body began.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..settings import DEAD_LETTER, RUN_AGAIN, worker_lost_choice

#: The task option, named as the setting.
OPTION = "redisdelay_worker_lost"
__all__ = ["DEAD_LETTER", "OPTION", "RUN_AGAIN", "check_tasks", "worker_lost"]


def check_tasks(tasks: Iterable[Any], setting: str | None) -> None:
    """Refuse a task's bad ``redisdelay_worker_lost`` (:class:`~celery_redisdelay.errors.ConfigurationError` naming the
    task and the allowed values): a worker does not start with one."""
    for task in tasks:
        worker_lost(task, setting)


def worker_lost(task: Any, setting: str | None) -> str:
    """What becomes of a run of ``task`` cut short with its worker: the task's own option, else the app's
    ``setting``, else :data:`RUN_AGAIN` for an ``@rd.delayed`` task or one that acknowledges late and
    :data:`DEAD_LETTER` for one that acknowledges early."""
    own = worker_lost_choice(getattr(task, OPTION, None), f"{OPTION} of the task {getattr(task, 'name', task)!r}")
    if own is not None:
        return own
    if setting is not None:
        return setting
    if getattr(task, "depot", None) is not None or getattr(task, "acks_late", False):
        return RUN_AGAIN  # a delayed task (it has a depot) keeps its documented at-least-once contract
    return DEAD_LETTER
