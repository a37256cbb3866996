"""``RedisDelay``: binds celery-redisdelay to a Celery app."""

from __future__ import annotations

import difflib
import inspect
import logging
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, overload

from celery import Celery, signals

from . import patching
from . import settings as settings_module
from .errors import ConfigurationError, RedisDelayError, ScheduleError
from .message import wire
from .operations import checks, pausing
from .operations import queues as queue_latency
from .operations.listing import Scanner
from .operations.validation import register_validation_tasks
from .producer import batch
from .producer.adoption import CELERY_PREFIXES, TRACK_OPTION, AdoptedRules, adoptable, parks_later
from .producer.batch import check_batch_options
from .producer.kept import TemplateCache
from .producer.locks import Lock
from .producer.parking import park_sent
from .producer.parking_producer import ParkingProducer
from .producer.rules import CallRules, check_limit_options, check_lock_options
from .producer.schedule import resolve_due
from .producer.task import ROUTING_OPTIONS, DelayedTask, combined_base
from .release.releaser import Releaser, Releasers, TickReport
from .settings import Settings, positive_setting
from .store.calls import LARGEST_STEP, CallStore, Entry
from .store.depot import Depot
from .store.forks import cached_property
from .store.keys import Keyspace
from .store.shards import ShardSet
from .worker import revocation, tracking

logger = logging.getLogger(__name__)

TICK_TASK = "redisdelay.tick"

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T", bound=DelayedTask)

_EXTENSIONS: weakref.WeakKeyDictionary[Celery, RedisDelay] = weakref.WeakKeyDictionary()

# Decorator options that are ours; everything else goes to ``app.task``.
_OPTION_ATTRIBUTES = {"countdown": "default_countdown", "timeout": "visibility_timeout"}
#: The arguments of ``rd.batched`` that are attributes of a batched task.
_BATCH_ARGUMENTS = {"size": "batch_size", "max_wait": "batch_max_wait"}
#: Options of ``app.task`` besides the attributes of the task class: its own, and those Celery's autoretry reads.
_CELERY_OPTIONS = frozenset(
    {"base", "shared", "lazy", "filter", "pydantic", "pydantic_strict", "pydantic_context", "pydantic_dump_kwargs",
     "autoretry_for", "dont_autoretry_for", "retry_kwargs", "retry_backoff", "retry_backoff_max", "retry_jitter"}
)  # fmt: skip
#: How alike (difflib's ratio) an option neither Celery nor we know must be to one of ours to be taken for a
#: misspelling of it: ``limit_rat`` and ``limit_rate`` are 0.95 alike; ``count`` and ``countdown`` 0.71.
_MISSPELT = 0.8


def own_options(base: type[CallRules]) -> set[str]:
    """The decorators' own options for tasks of ``base``: the attributes of the rules their calls are parked by
    (:class:`~celery_redisdelay.producer.rules.CallRules` and its subclasses: ``lock``, ``limit_rate``,
    ``batch_size``...), the names the decorators give some of them (``countdown``, ``size``), the routing ones."""
    attributes = {
        name
        for kind in base.__mro__
        if issubclass(kind, CallRules)
        for name, value in vars(kind).items()
        if not name.startswith("_") and not callable(value) and not hasattr(value, "__get__")
    }
    renamed = {**_OPTION_ATTRIBUTES, **_BATCH_ARGUMENTS}
    aliases = {alias for alias, attribute in renamed.items() if attribute in attributes}
    return attributes | aliases | set(ROUTING_OPTIONS)


def warn_of_misspelt_options(task: str, options: Iterable[str], base: type[CallRules]) -> None:
    """Warn of a task option close to one of ours that neither celery-redisdelay nor Celery knows (``limit_rat``):
    Celery keeps it as an attribute of the task, where it does nothing. Called by the decorator, which the
    warning points at; Celery's options and attributes (``rate_limit``...) and the task's own ones pass."""
    own = sorted(own_options(base))
    known = set(own) | set(dir(base)) | _CELERY_OPTIONS
    for option in options:
        close = [] if option in known else difflib.get_close_matches(option, own, n=1, cutoff=_MISSPELT)
        if close:
            warnings.warn(
                f"option {option} of task {task} is not one of celery-redisdelay's: did you mean {close[0]}? Celery "
                "keeps it as an attribute of the task, where it does nothing; rename it",
                UserWarning,
                stacklevel=3,
            )


def check_task_id(task_id: object, argument: str = "task_id") -> None:
    """Refuse an id that is not a string, naming the argument (a Celery task id is a string)."""
    if not isinstance(task_id, str):
        raise TypeError(f"{argument} must be a string (a Celery task id), not {task_id!r}")


class RedisDelay:
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
        self._task_names: set[str] = set()  # the names of this extension's tasks
        self._adopted: dict[str, AdoptedRules] = {}  # rules of the plain tasks redisdelay_all_tasks parks
        self._limited_names: dict[str, bool] = {}  # plain tasks under limits, whose every call is parked
        self._tracked_names: dict[str, bool] = {}  # plain tasks whose calls due now are tracked
        settings_module.check_protocol(conf)
        # Calls by name (app.send_task) to a delayed task of this app are parked too; Celery's own
        # send_task stays here for publishing at once (a released batch).
        self.celery_send_task: Callable[..., Any] = app.send_task
        self._send_task_signature = inspect.signature(app.send_task)
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
    def shards(self) -> ShardSet:
        """The call stores: ``redisdelay_shards`` of them, plus retired ones that still hold calls."""
        return self.depot.shards

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
        decorate = self._decorator(self.Task, options)
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
        decorate = self._decorator(self.BatchedTask, options)
        return decorate(fun) if fun is not None else decorate

    def _decorator(self, base: type[DelayedTask], options: dict[str, Any]) -> Callable[[F], Any]:
        routing = {key: options.pop(key) for key in ROUTING_OPTIONS if key in options}
        task_options = {_OPTION_ATTRIBUTES.get(key, key): value for key, value in options.items()}
        task_options["base"] = combined_base(base, task_options.get("base"))
        # A delayed task parks through this extension: it must not be copied into other apps.
        task_options.setdefault("shared", False)
        if routing:
            task_options["routing_options"] = routing

        def decorate(function: F) -> Any:
            # Checked here: app.task may return a lazy proxy that builds the task class later.
            check_lock_options(function, task_options)
            check_limit_options(function, task_options)
            if issubclass(task_options["base"], batch.BatchedTask):
                check_batch_options(function, task_options)
            # The name Celery will give it (``_task_from_fun``), known now so that send_task can tell a
            # call to it without binding every pending task of the app.
            name = task_options.get("name") or self.app.gen_task_name(function.__name__, function.__module__)
            warn_of_misspelt_options(name, task_options, task_options["base"])
            self._task_names.add(name)
            return self.app.task(**task_options)(function)

        return decorate

    # -- parking -------------------------------------------------------------------------------

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``app.send_task`` of this app: a call by name to one of its delayed tasks is parked as
        ``task.apply_async`` would park it (the message is still the one ``send_task`` builds); with
        ``redisdelay_all_tasks``, so is a call of a plain task of the app with a countdown or an eta in the
        future (``apply_async``, signatures and retries all come here), and with ``redisdelay_track_due_now`` too, its
        call due now is stored in flight and queued in one script (:func:`~.producer.parking.store_call`); any other
        call is Celery's own."""
        if isinstance(kwargs.get("producer"), ParkingProducer):
            return self.celery_send_task(name, *args, **kwargs)  # our own park going through Celery
        track = kwargs.pop(TRACK_OPTION, None)  # a call's own opt-out: apply_async(..., redisdelay_track=False)
        # A task made with the extension's decorators, or of its task class otherwise (``app.Task = rd.Task``), but
        # not Celery's own tasks nor the extension's tick: beat sends the tick by name, and a parked tick would
        # wait for a release that only it makes.
        explicit = name in self._task_names or (
            self.app.finalized
            and not name.startswith(CELERY_PREFIXES)
            and isinstance(self.app.tasks.get(name), DelayedTask)
        )
        if not explicit and (self.app.conf.get("task_protocol") or 2) != 2:
            # Protocol 1, set after the extension was made, cannot be stored: a plain task's call is Celery's, as
            # without the extension (a delayed task's call goes on, to be refused with ConfigurationError).
            return self.celery_send_task(name, *args, **kwargs)
        waits = len(args) > 2 or kwargs.get("countdown") is not None or kwargs.get("eta") is not None
        # Due now: no countdown nor eta, or a countdown of 0 (``self.retry(countdown=0)``).
        due_now = not waits or (len(args) <= 2 and kwargs.get("eta") is None and kwargs.get("countdown") == 0)
        all_tasks = self.app.conf.get("redisdelay_all_tasks")
        trackable = bool(track is not False and all_tasks and self._tracked(name))
        if not explicit and not (all_tasks and (waits or self._limited(name) or (trackable and due_now))):
            return self.celery_send_task(name, *args, **kwargs)
        task = self.app.tasks.get(name)
        given = self._send_task_signature.bind(name, *args, **kwargs).arguments
        if isinstance(given.get("producer") or given.get("publisher"), ParkingProducer):
            return self.celery_send_task(name, *args, **kwargs)
        if explicit and isinstance(task, DelayedTask) and task.depot is self.depot:
            return park_sent(task, task, given, self.celery_send_task)
        if (
            adoptable(task)
            and self.settings.all_tasks
            and (
                parks_later(given.get("countdown"), given.get("eta"), self.app.conf.timezone)
                or self.adopted_rules(task).task_limits is not None  # a limited task's calls wait on their limits
            )
        ):
            return park_sent(task, self.adopted_rules(task), given, self.celery_send_task)
        if trackable:
            # Due now (or at an eta already past): stored in flight and pushed onto its queue in one script, held
            # under a lease from there.
            return park_sent(task, self.adopted_rules(task), given, self.celery_send_task, send_now=True)
        return self.celery_send_task(name, *args, **kwargs)

    def _limited(self, name: str) -> bool:
        """Whether a plain task of the app is under limits (``redisdelay_limit_*`` options or the
        ``redisdelay_task_limits`` setting): with ``redisdelay_all_tasks``, all its calls are parked."""
        limited = self._limited_names.get(name)
        if limited is None:
            task = self.app.tasks.get(name)
            limited = bool(adoptable(task) and self.adopted_rules(task).task_limits is not None)
            self._limited_names[name] = limited
        return limited

    def _tracked(self, name: str) -> bool:
        """Whether the calls due now of a plain task of the app go through the store (``redisdelay_track_due_now``
        with ``redisdelay_all_tasks``, where the broker is the store's Redis), unless the task opts out
        (``redisdelay_track = False``, or ``redisdelay_park = False`` for all of it)."""
        tracked = self._tracked_names.get(name)
        if tracked is None:
            task = self.app.tasks.get(name)
            tracked = bool(self.tracks_due_now and adoptable(task) and getattr(task, TRACK_OPTION, True) is not False)
            self._tracked_names[name] = tracked
        return tracked

    @cached_property
    def tracks_due_now(self) -> bool:
        """Whether calls due now are tracked: in the app mode, where the broker is a Redis on the store's server and
        database (the script that stores a call pushes its message too), unless ``redisdelay_track_due_now`` is
        False. Elsewhere they keep Celery's path, with a warning when the setting insists (True)."""
        settings = self.settings
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
        settings = self.settings
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

    def check_size(self, what: str, size: int) -> None:
        """Refuse to store more than ``redisdelay_max_payload_bytes`` for one call (or batch item)."""
        self.depot.check_size(what, size)

    def check_server(self) -> list[str]:
        """Problems of the store's Redis that can lose parked calls; logged loudly when workers and beat start."""
        return checks.server_problems(self.depot)

    def check_config(self) -> list[str]:
        """Settings that make the broker deliver calls we track a second time; logged loudly at start-up."""
        return checks.config_problems(self.depot)

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

    # -- operations ----------------------------------------------------------------------------

    def cancel(self, task_id: str) -> bool:
        """Drop a call that is still parked and record it as Celery records a revoked task: the result
        ``REVOKED`` (``AsyncResult.get()`` raises ``TaskRevokedError``), a ``task-revoked`` event where
        task events are on. False when it was already released, finished or unknown."""
        check_task_id(task_id)
        return bool(self.cancel_many([task_id]))

    def reschedule(self, task_id: str, *, countdown: float | None = None, eta: Any = None) -> bool:
        """Move a parked call to ``countdown`` seconds from now or to ``eta``; False when it is no longer parked."""
        check_task_id(task_id)
        if countdown is None and eta is None:
            raise ScheduleError("reschedule needs countdown or eta")
        due = resolve_due(countdown, eta, timezone=self.app.conf.timezone)
        moved = self.shards.first(
            task_id, lambda store: store.reschedule(task_id, countdown_ms=due.countdown_ms, due_ms=due.at_ms)
        )
        return moved is not None

    def lock(self, name: str, timeout: float = 60.0, blocking_timeout: float | None = None) -> Lock:
        """The lock ``name`` for code outside tasks: ``with rd.lock("order:42", timeout=60): ...``.

        It is the same lock tasks declared with ``lock=`` take, expiring ``timeout`` seconds after it
        is taken; ``with`` waits up to ``blocking_timeout`` seconds (None: as long as it takes) and
        raises :class:`LockTimeout` after that. Releasing it wakes the first call deferred behind it.
        """
        return Lock(self.shards.for_name(name), name, timeout, blocking_timeout)

    def requeue(self, task_id: str) -> bool:
        """Give a dead-lettered call a fresh start, due now; False when it is not dead-lettered."""
        check_task_id(task_id)
        status = self.shards.first(task_id, lambda store: store.requeue(task_id))
        if status < 0:
            raise RedisDelayError(f"call {task_id} has no payload left to run; it stays dead-lettered")
        return status == 1

    def cancel_many(self, task_ids: Sequence[str]) -> list[str]:
        """Drop the calls among ``task_ids`` that are still parked, 1,000 per script call, and record
        each as revoked (see :meth:`cancel`); returns the ids cancelled (the others were not parked)."""
        return revocation.cancel_many(self.depot, task_ids)

    def pause(
        self, task: str | None = None, queue: str | None = None, seconds: float | str | None = None, reason: str = ""
    ) -> dict[str, Any]:
        """Pause a task (by name) or a queue for the whole fleet, until :meth:`resume` or for ``seconds`` (a number,
        or a text like ``10m``): no call of it starts meanwhile; its calls wait in the store and go out, in due
        order, when the pause ends. A call already running finishes. Pausing again keeps the first pause's start
        and sets its end. Bad input raises :class:`~celery_redisdelay.operations.pausing.PauseError` (a
        ``ValueError``) and stores nothing. Returns the pause as :meth:`paused` lists it."""
        return pausing.pause(self.depot, task=task, queue=queue, seconds=seconds, reason=reason)

    def resume(self, task: str | None = None, queue: str | None = None) -> bool:
        """End the pause of a task or a queue: its calls go out with the next releases. Whether it was paused."""
        return pausing.resume(self.depot, task=task, queue=queue)

    def paused(self) -> list[dict[str, Any]]:
        """What is paused: a dict per target with ``kind`` (task or queue), ``name``, ``since``, ``until`` (aware
        datetimes; until None: until resumed), ``reason`` and ``waiting`` (calls waiting on it in the store)."""
        return pausing.paused(self.depot)

    def queues(self) -> dict[str, dict[str, Any]]:
        """Per queue (those tasks route to, and those seen in the store): ``ready`` (in the broker's lists, priority
        lists included), ``oldest_ready_seconds`` (since the oldest became ready: its release, not its due time),
        ``in_flight``, ``paused``, ``held`` (by limits) and ``release_lag_p50_seconds``, ``release_lag_p99_seconds``
        (all queues, the last 15 minutes). See :mod:`celery_redisdelay.operations.queues`."""
        return queue_latency.queues(self.depot)

    def stats(self) -> dict[str, int]:
        """Counts of calls per state: ``delayed``, ``inflight``, ``dead``, plus ``due`` and ``inflight_expired``,
        and the open batch groups (``batch_groups``) and the items waiting in them (``batch_items``)."""
        return self.depot.stats()

    def find(self, task_id: str) -> Entry | None:
        """Where a call is (delayed, inflight or dead) with its metadata, or None."""
        check_task_id(task_id)
        return self.shards.find(task_id)

    def dead_letters(self, limit: int = 100, offset: int = 0) -> list[Entry]:
        """A page of dead-lettered calls, oldest first over all shards; each entry's ``meta['why']`` says why."""
        stores = self.shards.all()
        # One shard starts at its offset; merged shards are read from their starts, a bounded step at a time.
        skip = 0 if len(stores) == 1 else offset
        offsets = [offset] if len(stores) == 1 else [0] * len(stores)
        scanner = Scanner(self.depot, stores, "dead", offsets, chunk=max(1, min(skip + limit, LARGEST_STEP)))
        found = [scanner.next() for _ in range(skip + limit)]
        return [entry for _, entry in filter(None, found)][skip:]

    def tick(self, shards: Sequence[int] | None = None) -> dict[str, int]:
        """Sweep timed-out calls and release due ones (the body of the ``redisdelay.tick`` task): on every
        shard, retired ones included, or on the configured shards of these indexes only."""
        report: TickReport = self.releasers.tick(shards)
        if report.released or report.requeued or report.dead:
            logger.info("redisdelay tick: %s", report.as_dict())
        return report.as_dict()

    def ping(self) -> bool:
        """Check that the store's Redis answers; raises :class:`StoreUnavailableError` when it does not."""
        return self.depot.ping()
