"""``redisdelay_all_tasks``: the app's plain tasks park their delayed calls too, without being re-decorated.

Every call of an app goes through ``app.send_task`` (``apply_async``, ``delay``, signatures, ``self.retry``,
``autoretry_for``), which the extension holds: with the setting on, a call of a plain task of the app
(``@app.task``, ``@shared_task``, a class-based task, a task of an installed package) that has a countdown
or an eta in the future is parked as a delayed task's call is, by :class:`AdoptedRules`. A call due now goes
to the broker as Celery sends it. Celery's own tasks (``celery.*``: chord unlock, backend cleanup, canvas
helpers), the extension's (``redisdelay.*``) and tasks that opt out (``redisdelay_park = False``) are left to
Celery.
"""

from __future__ import annotations

import time
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any

from celery.utils.time import maybe_iso8601, maybe_make_aware

from .rules import CallRules
from .task import DelayedTask

if TYPE_CHECKING:
    from ..store.depot import Depot
    from .kept import TemplateCache

#: Task names left to Celery: its own tasks, and the extension's.
CELERY_PREFIXES = ("celery.", "redisdelay.")
#: The task attribute that opts a task out: ``@app.task(redisdelay_park=False)``.
OPT_OUT = "redisdelay_park"


class AdoptedRules(CallRules):
    """The rules a plain task's delayed calls are parked by: the settings' limits (``apply_async`` may give
    its own per call), unique and debounce keys as for a delayed task, no lock, and the routing Celery gives
    the call. Nothing is read from the task's attributes, so a task class's own names cannot clash."""

    def __init__(self, task: Any, depot: Depot, templates: TemplateCache) -> None:
        self.name, self.depot, self.templates = task.name, depot, templates


def adoptable(task: Any) -> bool:
    """Whether ``task`` is a plain task whose delayed calls ``redisdelay_all_tasks`` parks."""
    name = getattr(task, "name", None)
    return (
        isinstance(name, str)
        and not name.startswith(CELERY_PREFIXES)
        and not isinstance(task, DelayedTask)
        and getattr(task, OPT_OUT, True) is not False
    )


def parks_later(countdown: object, eta: object, timezone: tzinfo | str | None) -> bool:
    """Whether a call with these ``apply_async`` options is due later (a countdown above 0, an eta after
    now): such a call is parked. Options Celery would refuse are not ours to judge: False, and Celery
    raises its own error."""
    if countdown is not None:
        return isinstance(countdown, (int, float)) and not isinstance(countdown, bool) and countdown > 0
    if eta is None:
        return False
    try:
        when = maybe_iso8601(eta) if isinstance(eta, str) else eta
        if not isinstance(when, datetime):
            return False
        return bool(maybe_make_aware(when, timezone).timestamp() > time.time())
    except (ValueError, TypeError, OverflowError):
        return False
