"""Adoption: delayed calls the app's tasks did not park themselves are parked all the same.

``redisdelay_all_tasks``: the app's plain tasks park their delayed calls too, without being re-decorated.

Every call of an app goes through ``app.send_task`` (``apply_async``, ``delay``, signatures, ``self.retry``,
``autoretry_for``), which the extension holds: with the setting on, a call of a plain task of the app
(``@app.task``, ``@shared_task``, a class-based task, a task of an installed package) that has a countdown
or an eta in the future is parked as a delayed task's call is, by :class:`AdoptedRules`. A call due now goes
to the broker as Celery sends it, unless the task is under limits, or ``redisdelay_track_due_now`` tracks it (the
store writes it in flight and pushes its message in one script). Celery's own tasks (``celery.*``: chord
unlock, backend cleanup, canvas helpers), the extension's (``redisdelay.*``) and tasks that opt out
(``redisdelay_park = False``) are left to Celery.
"""

from __future__ import annotations

import time
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any

from celery.utils.time import maybe_iso8601, maybe_make_aware

from ..errors import ConfigurationError, RedisDelayError
from ..message.envelope import Envelope
from ..store.calls import BrokerCopy
from ..store.limits import LIMIT_OPTIONS
from ..store.meta import meta_json, routed
from .rules import CallRules, check_limit_options
from .schedule import resolve_due
from .task import DelayedTask

if TYPE_CHECKING:
    from ..store.depot import Depot
    from .kept import TemplateCache

#: Task names left to Celery: its own tasks, and the extension's.
CELERY_PREFIXES = ("celery.", "redisdelay.")
#: The task attribute that opts a task out: ``@app.task(redisdelay_park=False)``.
OPT_OUT = "redisdelay_park"
#: Opts a task's calls due now out of ``redisdelay_track_due_now``: the task attribute ``@app.task(
#: redisdelay_track=False)``, or a call's option ``apply_async(..., redisdelay_track=False)``.
TRACK_OPTION = "redisdelay_track"


class AdoptedRules(CallRules):
    """The rules a plain task's delayed calls are parked by: the settings' timeouts (``apply_async`` may give
    its own per call), unique and debounce keys as for a delayed task, no lock, and the routing Celery gives
    the call. Of the task's attributes only the ``redisdelay_``-prefixed limits are read (``@app.task(
    redisdelay_limit_rate="10/s")``), so a task class's own names cannot clash; the ``redisdelay_task_limits``
    setting gives limits by task name too (``{"proj.fetch": {"rate": "10/s", "key": "host:{host}"}}``), and
    the task's own options win. A task under limits parks every call, due now or not (see
    :mod:`celery_redisdelay.store.limits`)."""

    def __init__(self, task: Any, depot: Depot, templates: TemplateCache) -> None:
        self.name, self.depot, self.templates = task.name, depot, templates
        given = task_limit_options(task, depot.app.conf)
        for option, value in given.items():
            setattr(self, option, value)
        if given:
            check_limit_options(task.run, {"name": task.name, **given})
            self.run = task.run  # the limit_key template names its arguments


#: What the ``redisdelay_task_limits`` setting calls each limit option.
SETTING_NAMES = {"rate": "limit_rate", "concurrency": "limit_concurrency", "key": "limit_key", "quota": "limit_quota"}


def task_limit_options(task: Any, conf: Any) -> dict[str, Any]:
    """A plain task's limit options: from ``redisdelay_task_limits[task.name]``, then its own ``redisdelay_limit_*``
    attributes over them."""
    table = conf.get("redisdelay_task_limits") or {}
    if not isinstance(table, dict):
        raise ConfigurationError(f"redisdelay_task_limits must be a dict of task name -> limits, not {table!r}")
    from_setting = table.get(task.name) or {}
    if not isinstance(from_setting, dict) or set(from_setting) - set(SETTING_NAMES):
        raise ConfigurationError(
            f"redisdelay_task_limits[{task.name!r}] must be a dict with {', '.join(SETTING_NAMES)}, "
            f"not {from_setting!r}"
        )
    given = {SETTING_NAMES[name]: value for name, value in from_setting.items() if value is not None}
    for option in LIMIT_OPTIONS:
        own = getattr(task, f"redisdelay_{option}", None)
        if own is not None:
            given[option] = own
    return given


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


def waiting_due_ms(depot: Depot, headers: dict[str, Any]) -> int | None:
    """When a waiting task message (its protocol 2 ``headers``) is due, if it is one to park: an eta more than
    ``redisdelay_park_received_after`` seconds away, and no ``expires`` already past (Celery discards those)."""
    eta = headers.get("eta")
    if not isinstance(eta, str) or "task" not in headers or "id" not in headers:
        return None  # no eta, or protocol 1 (whose body carries it): Celery's
    timezone = depot.app.conf.timezone
    try:
        due = resolve_due(eta=eta, timezone=timezone).at_ms
        expires = headers.get("expires")
        if expires is not None and maybe_make_aware(maybe_iso8601(expires), timezone).timestamp() <= time.time():
            return None
    except (RedisDelayError, ValueError, TypeError, OverflowError):
        return None  # Celery's handler says what is wrong with it
    if due is None or due - time.time() * 1000 <= depot.settings.park_received_after * 1000:
        return None
    return due


def park_waiting(
    depot: Depot, rules: CallRules, envelope: Envelope, due_ms: int, broker_copy: BrokerCopy | None = None
) -> int:
    """Park a message that waited in the broker (its eta taken out: ``envelope``) as its call, due at ``due_ms``,
    unless the store knows its id; ``broker_copy`` goes in the same script (see ``CallStore.adopt``). The
    store's status: ``STORED``, ``KEPT`` (known) or ``CONFLICT`` (the broker's copy was gone)."""
    payload, fast = depot.encode(envelope)
    depot.check_size(envelope.task, len(payload))
    limits = rules.call_limits()
    meta = meta_json(routed(limits, fast.key) if fast else limits)
    call_id = str(envelope.headers["id"])
    return depot.shards.home(call_id).adopt(call_id, payload, meta, due_ms, broker_copy)
