"""The app's ``send_task``: each call looked up, its path chosen (:mod:`.paths`), and sent down that path.

Celery's ``send_task`` stays the way out for every call the extension leaves to Celery, and for building the
message of a call it parks (the message is the one Celery builds).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from ..store.depot import Depot
from .adoption import CELERY_PREFIXES, TRACK_OPTION, AdoptedRules, adoptable, parks_later
from .binding import Binder
from .kept import TemplateCache
from .parking import park_sent
from .parking_producer import ParkingProducer
from .paths import Call, Path, may_leave_celery, path
from .rules import CallRules
from .task import DelayedTask

logger = logging.getLogger(__name__)


class Router:
    """Sends each call of one app down its path; what it learns of a task (limited, tracked, its adopted rules) is
    kept by the task's name."""

    def __init__(self, app: Any, depot: Depot, templates: TemplateCache, celery_send_task: Callable[..., Any]) -> None:
        self.app = app
        self.depot = depot
        self.templates = templates
        #: Celery's own ``send_task`` of the app, from before the extension's.
        self.celery_send_task = celery_send_task
        self._binder = Binder(inspect.signature(celery_send_task))
        #: The names of the extension's tasks, known as they are made (a call to one needs no look-up of the
        #: app's tasks, which would finalize the app).
        self.task_names: set[str] = set()
        self._adopted: dict[str, AdoptedRules] = {}  # rules of the plain tasks redisdelay_all_tasks parks
        self._limited: dict[str, bool] = {}  # plain tasks under limits, whose every call is parked
        self._tracked: dict[str, bool] = {}  # plain tasks whose calls due now are tracked
        self._tracks_due_now: bool | None = None

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``app.send_task``: a call parked, tracked or left to Celery, as :func:`.paths.path` says."""
        if isinstance(kwargs.get("producer"), ParkingProducer):
            return self.celery_send_task(name, *args, **kwargs)  # our own park going through Celery
        track = kwargs.pop(TRACK_OPTION, None)  # a call's own opt-out: apply_async(..., redisdelay_track=False)
        conf = self.app.conf
        # A task made with the extension's decorators, or of its task class otherwise (``app.Task = rd.Task``), but
        # not Celery's own tasks nor the extension's tick: beat sends the tick by name, and a parked tick would
        # wait for a release that only it makes.
        explicit = name in self.task_names or (
            self.app.finalized
            and not name.startswith(CELERY_PREFIXES)
            and isinstance(self.app.tasks.get(name), DelayedTask)
        )
        protocol_1 = (conf.get("task_protocol") or 2) != 2
        all_tasks = bool(conf.get("redisdelay_all_tasks"))
        # Looked up only where they can matter (path() leaves any other call under protocol 1 to Celery): reading
        # the settings refuses protocol 1.
        looks = all_tasks and not protocol_1
        tracked = bool(track is not False and looks and self.tracked(name))
        waits = len(args) > 2 or kwargs.get("countdown") is not None or kwargs.get("eta") is not None
        limited = looks and not explicit and self.limited(name)
        if not may_leave_celery(
            explicit=explicit, protocol_1=protocol_1, all_tasks=all_tasks, waits=waits, limited=limited, tracked=tracked
        ):
            return self.celery_send_task(name, *args, **kwargs)
        task = self.app.tasks.get(name)
        given = self._binder.arguments(name, *args, **kwargs)
        ours = explicit and isinstance(task, DelayedTask) and task.depot is self.depot
        adopted = adoptable(task)
        call = Call(
            ours=ours,
            own_producer=isinstance(given.get("producer") or given.get("publisher"), ParkingProducer),
            protocol_1=protocol_1,
            all_tasks=all_tasks,
            adopted=adopted,
            later=waits and parks_later(given.get("countdown"), given.get("eta"), conf.timezone),
            limited=adopted and self.limited(name),
            tracked=tracked,
            opted_out=track is False,
        )
        chosen = path(call)
        if chosen is Path.CELERY:
            return self.celery_send_task(name, *args, **kwargs)
        rules: CallRules = task if ours else self.adopted_rules(task)
        return park_sent(task, rules, given, self.celery_send_task, send_now=chosen is Path.TRACK)

    def limited(self, name: str) -> bool:
        """Whether a plain task of the app is under limits (``redisdelay_limit_*`` options or the
        ``redisdelay_task_limits`` setting): with ``redisdelay_all_tasks``, all its calls are parked."""
        limited = self._limited.get(name)
        if limited is None:
            task = self.app.tasks.get(name)
            limited = self._limited[name] = bool(adoptable(task) and self.adopted_rules(task).task_limits is not None)
        return limited

    def tracked(self, name: str) -> bool:
        """Whether the calls due now of a plain task of the app go through the store (``redisdelay_track_due_now``
        with ``redisdelay_all_tasks``, where the broker is the store's Redis), unless the task opts out
        (``redisdelay_track = False``, or ``redisdelay_park = False`` for all of it)."""
        tracked = self._tracked.get(name)
        if tracked is None:
            task = self.app.tasks.get(name)
            tracked = bool(self.tracks_due_now and adoptable(task) and getattr(task, TRACK_OPTION, True) is not False)
            self._tracked[name] = tracked
        return tracked

    @property
    def tracks_due_now(self) -> bool:
        """Whether calls due now are tracked: in the app mode, where the broker is a Redis on the store's server and
        database (the script that stores a call pushes its message too), unless ``redisdelay_track_due_now`` is
        False. Elsewhere they keep Celery's path, with a warning (once) when the setting insists (True)."""
        if self._tracks_due_now is None:
            self._tracks_due_now = self._track_due_now()
        return self._tracks_due_now

    def _track_due_now(self) -> bool:
        settings = self.depot.settings
        wanted = settings.track_due_now
        if wanted is False:
            return False
        if not settings.all_tasks:
            if wanted:
                logger.warning("redisdelay_track_due_now has no effect without redisdelay_all_tasks")
            return False
        if not self.depot.fast_release:
            if wanted:
                logger.warning(
                    "redisdelay_track_due_now has no effect: the broker is not a Redis on the store's server and "
                    "database, so calls due now keep Celery's own path (untracked)"
                )
            return False
        return True

    def rules_of(self, task: Any) -> CallRules | None:
        """The rules ``task``'s calls are parked by, if its calls may be parked: a delayed task of this
        extension is its own; a plain task of the app has :class:`AdoptedRules` where ``redisdelay_all_tasks``
        or ``redisdelay_park_received`` is on (its workers then track the runs of its parked calls); None for
        any other task (Celery's own, another app's, one that opts out)."""
        if isinstance(task, DelayedTask):
            return task if task.depot is self.depot else None
        settings = self.depot.settings
        adopting = settings.all_tasks or settings.park_received
        if adopting and adoptable(task) and getattr(task, "_app", None) is self.app:
            return self.adopted_rules(task)
        return None

    def adopted_rules(self, task: Any) -> AdoptedRules:
        """The rules a plain task's delayed calls are parked by (``redisdelay_all_tasks``)."""
        rules = self._adopted.get(task.name)
        if rules is None:
            rules = self._adopted[task.name] = AdoptedRules(task, self.depot, self.templates)
        return rules
