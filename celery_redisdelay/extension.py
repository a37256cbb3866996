"""``RedisDelay``: binds celery-redisdelay to a Celery app."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, overload

from celery import Celery, signals

from . import patching
from . import settings as settings_module
from .errors import ConfigurationError, RedisDelayError
from .message import wire
from .operations.api import Operations
from .operations.validation import register_validation_tasks
from .producer import batch
from .producer.decorators import decorator
from .producer.kept import TemplateCache
from .producer.routing import Router
from .producer.rules import CallRules
from .producer.task import DelayedTask
from .release.releaser import Releaser, Releasers
from .settings import Settings, positive_setting
from .store.calls import CallStore
from .store.depot import Depot
from .store.forks import cached_property
from .store.keys import Keyspace
from .worker import tracking

logger = logging.getLogger(__name__)

TICK_TASK = "redisdelay.tick"

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T", bound=DelayedTask)

_EXTENSIONS: weakref.WeakKeyDictionary[Celery, RedisDelay] = weakref.WeakKeyDictionary()


class RedisDelay(Operations):
    """celery-redisdelay for one Celery app.

    ``RedisDelay(app)`` registers the ``redisdelay.tick`` and ``redisdelay.validate`` tasks, adds the
    tick to ``beat_schedule`` and hooks the worker so calls are tracked until they finish. Settings
    are read from ``app.conf`` (``redisdelay_*``) the first time they are needed.
    """

    def __init__(self, app: Celery) -> None:
        if app in _EXTENSIONS:
            raise RedisDelayError(f"RedisDelay is already bound to app {app.main!r}; use RedisDelay.of(app)")
        # A misspelt redisdelay_* setting, before anything is bound: those set so far where the app's configuration
        # is still to be loaded (the rest are checked when the settings are read, see Settings.from_conf).
        conf = app.conf if app.configured else getattr(app, "_preconf", {})
        settings_module.check_names(conf, None if app.configured else app.namespace)
        # A choice that changes what a task does when its worker dies is refused at once, naming the allowed ones.
        settings_module.worker_lost_choice(conf.get("redisdelay_worker_lost"), "redisdelay_worker_lost")
        _EXTENSIONS[app] = self
        self.app: Any = app
        #: What the layers below take: the settings, the store and the stored form of this app's calls.
        self.depot = Depot(app)
        #: Templates of single calls by task and options (see :mod:`celery_redisdelay.producer.templates`).
        self.templates = TemplateCache()
        settings_module.check_protocol(conf)
        # Calls by name (app.send_task) to a delayed task of this app are parked too; Celery's own
        # send_task stays here for publishing at once (a released batch).
        self.celery_send_task: Callable[..., Any] = app.send_task
        #: Sends each call down its path (:mod:`celery_redisdelay.producer.routing`).
        self.router = Router(app, self.depot, self.templates, self.celery_send_task)
        patching.apply("send_task", app, {"send_task": self.send_task})
        #: A releaser per shard, for the tick, the precise releaser and the command line.
        self.releasers = Releasers(self.depot, self.celery_send_task)

        def tick() -> dict[str, int]:
            return self.tick()

        app.task(name=TICK_TASK, ignore_result=True, shared=False)(tick)
        register_validation_tasks(self.depot, self.delayed)
        tracking.connect(self.depot)
        # By name: the steps find this extension when a worker starts (celery_redisdelay.bootsteps).
        app.steps["worker"].add("celery_redisdelay.bootsteps:LeaseStep")
        app.steps["worker"].add("celery_redisdelay.bootsteps:PreciseReleaseStep")
        app.steps["worker"].add("celery_redisdelay.bootsteps:DurableRevokeStep")
        app.steps["worker"].add("celery_redisdelay.bootsteps:MessageHandlerStep")
        app.steps["worker"].add("celery_redisdelay.bootsteps:ContractStep")
        app.steps["consumer"].add("celery_redisdelay.bootsteps:SkipUnackedStep")
        app.steps["consumer"].add("celery_redisdelay.bootsteps:LoopTurnStep")
        if app.configured:
            self._install_schedule(app.conf)
        app.on_after_configure.connect(self._on_configured, weak=False)
        # dispatch_uid: Celery before 5.7 keys a bound method by its function alone, so a second
        # extension's receivers were taken for the first one's and dropped.
        uid = f"redisdelay-{id(self)}"
        signals.beat_init.connect(self._on_beat_init, weak=False, dispatch_uid=f"{uid}-schedule")
        signals.worker_ready.connect(self._warn_about_server, weak=False, dispatch_uid=f"{uid}-warn")
        signals.beat_init.connect(self._warn_about_server, weak=False, dispatch_uid=f"{uid}-warn")

    @classmethod
    def registered(cls, app: Any) -> RedisDelay | None:
        """The extension bound to ``app``, or None."""
        return _EXTENSIONS.get(app) if app is not None else None

    @classmethod
    def of(cls, app: Celery) -> RedisDelay:
        """The extension bound to ``app`` (the command line finds it this way)."""
        try:
            return _EXTENSIONS[app]
        except KeyError:
            raise RedisDelayError(
                f"app {app.main!r} has no RedisDelay: create one with RedisDelay(app) in the module celery -A loads"
            ) from None

    # -- the parts (see Depot) -----------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The ``redisdelay_*`` settings, read from ``app.conf`` the first time they are needed."""
        return self.depot.settings

    @property
    def client(self) -> Any:
        """The store's client: ``redis.Redis`` (one server or Sentinel's master) or ``RedisCluster``."""
        return self.depot.client

    @property
    def store(self) -> CallStore:
        """The first shard's store (the only one unless ``redisdelay_shards`` is set)."""
        return self.depot.store

    @property
    def keys(self) -> Keyspace:
        """The keys of the first shard."""
        return self.depot.keys

    @property
    def fast_release(self) -> bool:
        """Whether the release script pushes stored broker messages itself (see :attr:`Depot.fast_release`)."""
        return self.depot.fast_release

    @property
    def wire_format(self) -> bool:
        """Whether calls are stored as broker messages (see :attr:`Depot.wire_format`)."""
        return self.depot.wire_format

    @property
    def broker_layout(self) -> wire.BrokerLayout:
        """How kombu's Redis transport names the app's queue lists."""
        return self.depot.broker_layout

    @property
    def accepted_content_types(self) -> frozenset[str] | None:
        """The content types workers accept (the app's ``accept_content``), or None for any."""
        return self.depot.accepted_content_types

    def releaser_for(self, store: CallStore) -> Releaser:
        """The releaser of one shard."""
        return self.releasers.of(store)

    @property
    def releaser(self) -> Releaser:
        """The first shard's releaser."""
        return self.releasers.of(self.store)

    def _on_configured(self, sender: Any = None, source: Any = None, **_: Any) -> None:
        if sender is self.app and source is not None:
            self._install_schedule(source)
            try:
                settings_module.check_protocol(source)
            except ConfigurationError as exc:
                # Celery logs and swallows errors of this signal; parking raises it again.
                logger.error("redisdelay: %s", exc)

    def _on_beat_init(self, sender: Any = None, **_: Any) -> None:
        beat_app: Any = getattr(sender, "app", None)
        if beat_app is not None and beat_app is self.app:
            self._install_schedule(beat_app.conf)

    def _install_schedule(self, conf: Any) -> None:
        """Add the tick to ``beat_schedule``, keeping the user's entries (and theirs wins on a clash)."""
        interval = float(positive_setting(conf, "redisdelay_tick_interval"))
        schedule = dict(conf.get("beat_schedule") or {})
        schedule.setdefault(TICK_TASK, {"task": TICK_TASK, "schedule": interval})
        conf["beat_schedule"] = schedule
        prefix = getattr(conf, "prefix", None)
        if prefix:  # Celery before 5.7 reads a namespaced CELERY_BEAT_SCHEDULE before beat_schedule set later
            name = prefix + "beat_schedule"
            conf[name.upper() if prefix.isupper() else name] = schedule

    # -- the decorator -------------------------------------------------------------------------

    @cached_property
    def Task(self) -> type[DelayedTask]:
        """The base class of this extension's delayed tasks: :class:`DelayedTask` over the app's own
        task class (``app.Task``: the ``task_cls`` of the app, Django's ``DjangoTask`` under its fixup)."""
        return self._task_class(DelayedTask)

    @cached_property
    def BatchedTask(self) -> type[batch.BatchedTask]:
        """The base class of this extension's batched tasks, over the app's own task class too."""
        return self._task_class(batch.BatchedTask)

    def _task_class(self, kind: type[T]) -> type[T]:
        parts = {"depot": self.depot, "templates": self.templates, "redisdelay": self, "__module__": kind.__module__}
        return type(kind.__name__, (kind, self.app.Task), parts)

    @overload
    def delayed(self, fun: F) -> DelayedTask: ...

    @overload
    def delayed(self, fun: None = None, **options: Any) -> Callable[[F], DelayedTask]: ...

    def delayed(self, fun: F | None = None, **options: Any) -> Any:
        """Make a Celery task whose calls wait in Redis: ``@rd.delayed`` or ``@rd.delayed(countdown=10, ...)``.

        Options: ``countdown`` (default seconds to wait), ``timeout`` (visibility timeout of a run),
        ``max_deliveries``; ``lock``, ``lock_timeout``, ``lock_retry`` (a lock the call holds while it
        runs, see :class:`DelayedTask`); ``limit_rate``, ``limit_concurrency``, ``limit_key``, ``limit_quota``
        (limits that hold across every worker, see :mod:`celery_redisdelay.store.limits`); ``queue``,
        ``routing_key``, ``exchange``, ``priority`` (the
        task's routing defaults, which calls and ``task_routes`` can override); any other option of
        ``app.task`` (``name``, ``bind``, ``max_retries``, ...). Tasks are not shared with other apps.
        """
        decorate = decorator(self.app, self.Task, options, self.router.task_names)
        return decorate(fun) if fun is not None else decorate

    @overload
    def batched(self, fun: F) -> batch.BatchedTask: ...

    @overload
    def batched(
        self, fun: None = None, *, size: int = 10, max_wait: float = 60.0, **options: Any
    ) -> Callable[[F], batch.BatchedTask]: ...

    def batched(self, fun: F | None = None, *, size: int = 10, max_wait: float = 60.0, **options: Any) -> Any:
        """Make a task called with a key and the items gathered under it: ``@rd.batched(size=10, max_wait=240)``.

        ``task.add(key, item)`` gathers items per key; a group runs as one call ``task(key, items)``
        when it holds ``size`` items or its first item has waited ``max_wait`` seconds. Other options
        are those of :meth:`delayed` (``name``, ``queue``, ``timeout``, ...).
        """
        options.update(batch_size=size, batch_max_wait=max_wait)
        decorate = decorator(self.app, self.BatchedTask, options, self.router.task_names)
        return decorate(fun) if fun is not None else decorate

    # -- parking -------------------------------------------------------------------------------

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``app.send_task`` of this app: a call by name to one of its delayed tasks is parked as
        ``task.apply_async`` would park it (the message is still the one ``send_task`` builds); with
        ``redisdelay_all_tasks``, so is a call of a plain task of the app with a countdown or an eta in the
        future (``apply_async``, signatures and retries all come here), and with ``redisdelay_track_due_now`` too, its
        call due now is stored in flight and queued in one script (:func:`~.producer.parking.store_call`); any other
        call is Celery's own. The rule is :func:`celery_redisdelay.producer.paths.path`."""
        return self.router.send_task(name, *args, **kwargs)

    def rules_of(self, task: Any) -> CallRules | None:
        """The rules ``task``'s calls are parked by, or None (see :meth:`.producer.routing.Router.rules_of`)."""
        return self.router.rules_of(task)

    def _warn_about_server(self, sender: Any = None, **_: Any) -> None:
        app = getattr(sender, "app", None)
        if app is not None and app is not self.app:
            return
        try:
            problems = self.check_config() + self.check_server()
        except RedisDelayError:
            return
        for problem in problems:
            logger.warning("redisdelay: WARNING: %s", problem)
