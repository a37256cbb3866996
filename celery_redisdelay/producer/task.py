"""The task class behind ``@rd.delayed``: ``apply_async`` parks the call in Redis."""

from __future__ import annotations

import inspect
import logging
import string
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from celery import Task
from celery.result import AsyncResult
from celery.utils import uuid
from kombu.exceptions import OperationalError

from ..errors import Abandon, ConfigurationError, Deferred, RedisDelayError, ScheduleError, StoreUnavailableError
from ..store.calls import CONFLICT
from ..store.forks import cached_property
from ..store.keys import group_id
from ..store.meta import Limits
from .kept import template_key
from .locks import Lock
from .parking import park_from, parking_producer
from .schedule import lock_ms, resolve_due, seconds

if TYPE_CHECKING:
    from ..store.depot import Depot
    from .kept import TemplateCache

logger = logging.getLogger(__name__)

# Per-call options of ``apply_async`` that belong to celery-redisdelay, not to Celery.
CALL_OPTIONS = ("visibility_timeout", "queue_timeout", "max_deliveries")
NO_OVERRIDES: dict[str, Any] = dict.fromkeys(CALL_OPTIONS)
KEY_OPTIONS = ("unique_key", "debounce_key")
# A debounced park that keeps losing the race for its key (each loss means another producer parked
# or released a call under it in between) gives up after this many attempts.
DEBOUNCE_ATTEMPTS = 8
# Routing given to ``@rd.delayed``: Celery 5.7 deprecates these as task attributes, so the task keeps
# them apart and applies them to each call (below the call's own options, above ``task_routes``).
ROUTING_OPTIONS = ("queue", "routing_key", "exchange", "priority")


def check_lock_options(function: Any, options: dict[str, Any]) -> None:
    """Refuse, at decoration, lock options that cannot work: a template naming something that is
    not an argument of the task, a malformed template, a timeout that is not a duration."""
    template = options.get("lock")
    if template is None:
        return
    name = options.get("name") or getattr(function, "__name__", "?")
    if not isinstance(template, str) or not template:
        raise ConfigurationError(f"lock of {name} must be a non-empty string template, not {template!r}")
    for option in ("lock_timeout", "lock_retry"):
        if option in options:
            try:
                lock_ms(options[option], option)
            except ScheduleError as exc:
                raise ConfigurationError(f"{name}: {exc}") from exc
    parameters = list(inspect.signature(function).parameters)
    if options.get("bind"):
        parameters = parameters[1:]
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as exc:
        raise ConfigurationError(f"lock template {template!r} of {name} is malformed: {exc}") from exc
    for field in fields:
        root = field.split(".", 1)[0].split("[", 1)[0]
        if root not in parameters:
            raise ConfigurationError(
                f"lock template {template!r} of {name} refers to {{{field}}}, which is not an argument of "
                f"the task (arguments: {', '.join(parameters) or 'none'}); name arguments, as in 'order:{{order_id}}'"
            )
    # Format once with stand-ins that accept any attribute, index and format spec: what still fails
    # (a bad conversion, an empty attribute, a nested field naming no argument) would fail every call.
    try:
        template.format(**dict.fromkeys(parameters, _StandIn()))
    except (KeyError, IndexError, AttributeError, ValueError, TypeError) as exc:
        raise ConfigurationError(f"lock template {template!r} of {name} cannot be filled by any call: {exc!r}") from exc


class CallOptions(NamedTuple):
    """A call's options of this package: the limits stored with it, its unique/debounce mode and key
    (``""`` for none), the name of the lock it holds (None for none)."""

    limits: Limits
    mode: str
    key: str
    lock_name: str | None


class _StandIn:
    """An argument value for checking a lock template: every attribute, item and format spec fits."""

    def __getattr__(self, name: str) -> _StandIn:
        return self

    def __getitem__(self, key: object) -> _StandIn:
        return self

    def __format__(self, spec: str) -> str:
        return ""


class DelayedTask(Task):  # type: ignore[misc]  # Celery's Task is untyped
    """A Celery task whose calls wait in Redis until they are due.

    The extension makes the class a task derives from (``rd.Task``), with the ``depot`` its calls are parked
    in and the ``templates`` kept for them. Class attributes (set them with ``@rd.delayed(...)``):

    - ``default_countdown``: seconds a call waits when ``apply_async`` gives neither countdown nor eta.
    - ``visibility_timeout``: seconds a started call may run before the sweep delivers it again
      (``None``: the ``redisdelay_visibility_timeout`` setting).
    - ``max_deliveries``: deliveries without acknowledgement before the call is dead-lettered
      (``None``: the ``redisdelay_max_deliveries`` setting).
    - ``lock``: a template formatted with the call's arguments (``"order:{order_id}"``) naming a lock
      the call holds while it runs; ``lock_timeout`` is the lock's expiry and ``lock_retry`` the
      longest a deferred call waits before trying again (the holder's release wakes it sooner).
    """

    depot: ClassVar[Depot]
    templates: ClassVar[TemplateCache]
    default_countdown: ClassVar[float] = 0.0
    visibility_timeout: ClassVar[float | None] = None
    queue_timeout: ClassVar[float | None] = None
    max_deliveries: ClassVar[int | None] = None
    routing_options: ClassVar[dict[str, Any]] = {}
    lock: ClassVar[str | None] = None
    lock_timeout: ClassVar[float] = 60.0
    lock_retry: ClassVar[float] = 5.0
    _own_limits: tuple[tuple[Any, ...], Any, Limits] | None = None  # see call_limits

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Park the call in Redis until it is due (Celery's ``apply_async``, with the same options)."""

        def build(call_id: str, parking: Any, rest: dict[str, Any]) -> None:
            super(DelayedTask, self).apply_async(args, kwargs, call_id, parking, link, link_error, shadow, **rest)

        if self._get_app().conf.task_always_eager:
            self._call_options(args, kwargs, options)  # checked as when parking, then dropped
            # Eager mode runs the call at once, as Celery does for any task.
            return super().apply_async(args, kwargs, task_id, producer, link, link_error, shadow, **options)
        # The options apply_async takes by name count for its template as much as the others.
        named = {"link": link, "link_error": link_error, "shadow": shadow}
        named = {name: value for name, value in named.items() if value is not None}
        ignore_result = bool(options.get("ignore_result", self.ignore_result))
        return self.park(args, kwargs, task_id, options, build, ignore_result, ("apply_async", named))

    def park(
        self,
        args: Any,
        kwargs: Any,
        task_id: str | None,
        options: dict[str, Any],
        build: Callable[[str, Any, dict[str, Any]], None],
        ignore_result: bool,
        built_by: tuple[str, dict[str, Any]],
    ) -> AsyncResult:
        """Park a call: ``build(call_id, producer, options)`` makes Celery build and publish its message
        through the parking producer (``apply_async`` and ``app.send_task`` each pass their own). The
        result is marked ``ignored`` as Celery marks it (``get()`` then returns None at once).
        ``built_by`` names the call behind ``build`` and the options it takes by name besides
        ``options``: calls alike in all of it share a template."""
        capture = options.pop("_redisdelay_capture", None)  # park_many: build the message, do not park it
        limits, mode, key, lock_name = self._call_options(args, kwargs, options)
        app = self._get_app()
        for name, value in self.routing_options.items():
            options.setdefault(name, value)
        eta = options.pop("eta", None)
        due = resolve_due(
            options.pop("countdown", None),
            eta,
            default_countdown=self.default_countdown,
            timezone=app.conf.timezone if eta is not None else None,  # only an eta needs it
        )

        depot, templates = self.depot, self.templates
        # Calls like one Celery built before are rendered from its template (templates.py).
        via, named = built_by
        kept_key = template_key(self, via, {**options, **named}, limits) if capture is None else None

        def send(call_id: str) -> tuple[int, str]:
            kept = templates.get(kept_key)
            if kept is not None:
                return park_from(depot, kept, self, call_id, args, kwargs, due, mode, key)
            learn = kept_key if templates.wanted(kept_key) else None
            given = (args, kwargs) if learn is not None else None
            with parking_producer(depot, templates, call_id, due, limits, mode, key, capture, learn, given) as parking:
                try:
                    build(call_id, parking, dict(options))
                except OperationalError as exc:
                    # Celery's send_task wraps connection errors in kombu's; the caller should see ours.
                    if isinstance(exc.__cause__, StoreUnavailableError):
                        raise exc.__cause__ from exc.__cause__.__cause__
                    raise
                return parking.outcome

        # A keyed call lives beside its key, a locked call beside its lock: both are one script then.
        shards = depot.shards
        beside = key or lock_name
        store = shards.for_name(beside) if beside is not None else None

        def fresh() -> str:
            return shards.new_id(store)

        if mode and task_id is not None and shards.home(task_id) is not shards.for_name(key):
            raise ScheduleError(
                f"task_id {task_id!r} cannot be given with {mode}_key when redisdelay_shards > 1: the call must be "
                "stored on its key's shard, so celery-redisdelay chooses its id; nothing was stored"
            )
        if mode == "unique":
            holder = shards.for_name(key).holder(key)
            if holder is None:
                holder = send(task_id or fresh())[1]
            return self._result(holder, ignore_result)
        if mode == "debounce":
            # The replacing call takes the id of the call it replaces, so its message is built with it.
            candidate = shards.for_name(key).holder(key) or task_id or fresh()
            for _ in range(DEBOUNCE_ATTEMPTS):
                status, holder = send(candidate)
                if status != CONFLICT:
                    return self._result(holder, ignore_result)
                candidate = holder or fresh()
            raise RedisDelayError(
                f"could not park {self.name} under debounce key {key!r}: other producers kept changing it "
                f"({DEBOUNCE_ATTEMPTS} attempts); nothing was stored"
            )
        return self._result(send(task_id or fresh())[1], ignore_result)

    def _result(self, call_id: str, ignored: bool) -> AsyncResult:
        result = self.AsyncResult(call_id)
        result.ignored = ignored
        return result

    def park_sent(self, given: dict[str, Any], send_task: Callable[..., Any]) -> AsyncResult:
        """Park a call made by name, ``app.send_task(self.name, ...)``: ``given`` are the arguments of
        that call as bound to ``send_task``'s signature, ``send_task`` is Celery's own."""
        given = dict(given)
        options = dict(given.pop("options", None) or {})
        for ours in ("name", "producer", "publisher", "connection", "task_type"):
            given.pop(ours, None)  # the parking producer replaces any producer or connection given
        args, kwargs = given.pop("args", None), given.pop("kwargs", None)
        task_id, result_cls = given.pop("task_id", None), given.pop("result_cls", None)
        options.update(given)

        def build(call_id: str, parking: Any, rest: dict[str, Any]) -> None:
            send_task(self.name, args, kwargs, task_id=call_id, producer=parking, **rest)

        ignore_result = bool(options.get("ignore_result"))
        parked = self.park(args, kwargs, task_id, options, build, ignore_result, ("send_task", {}))
        if result_cls is not None:
            parked, ignored = result_cls(parked.id), parked.ignored
            parked.ignored = ignored
        return parked

    def _call_options(self, args: Any, kwargs: Any, options: dict[str, Any]) -> CallOptions:
        """Take this package's own options out of a call's ``options`` and check them with the call."""
        given = {name: options.pop(name, None) for name in CALL_OPTIONS}
        limits = self.call_limits() if given == NO_OVERRIDES else self._limits(given)
        mode, key = self._key_option({name: options.pop(name, None) for name in KEY_OPTIONS})
        # A template the arguments cannot fill fails here.
        lock_name = self.lock_name(args or (), kwargs or {}) if self.lock is not None else None
        return CallOptions(limits, mode, key, lock_name)

    def park_many(self, calls: Iterable[Sequence[Any]], kwargs: Any = None, **options: Any) -> list[AsyncResult]:
        """Park one call per item of ``calls`` (each an args tuple, as for ``starmap``), all with the same
        ``kwargs`` and options (``countdown``/``eta``, routing, ...): many times faster than calling
        ``apply_async`` for each. Returns their results in order. Calls with ``unique_key`` or
        ``debounce_key``, compressed calls and eager mode are parked one by one."""
        from .bulk import park_many

        return park_many(self, calls, kwargs, options)

    def _key_option(self, given: dict[str, Any]) -> tuple[str, str]:
        """(mode, index key) of a call's ``unique_key`` / ``debounce_key``; ('', '') for neither."""
        chosen = [(name, value) for name, value in given.items() if value is not None]
        if not chosen:
            return "", ""
        if len(chosen) > 1:
            raise ScheduleError("give unique_key or debounce_key, not both")
        [(name, value)] = chosen
        if not isinstance(value, str) or not value:
            raise ScheduleError(f"{name} must be a non-empty string, not {value!r}")
        return name.removesuffix("_key"), group_id(self.name, value)

    def _limits(self, overrides: dict[str, Any]) -> Limits:
        """The per-call limits stored with the call: deliveries and timeouts in ms."""
        settings = self.depot.settings
        run = overrides["visibility_timeout"] or self.visibility_timeout or settings.visibility_timeout
        queue = overrides["queue_timeout"] or self.queue_timeout or settings.queue_timeout
        limit = overrides["max_deliveries"]
        if limit is None:
            limit = self.max_deliveries if self.max_deliveries is not None else settings.max_deliveries
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(f"max_deliveries must be an integer >= 0 (0: no limit), not {limit!r}")
        return Limits(
            t=self.name,
            m=limit,
            r=round(seconds(run, "visibility_timeout") * 1000),
            q=round(seconds(queue, "queue_timeout") * 1000),
        )

    # -- the lock a call holds while it runs ---------------------------------------------------------

    @cached_property
    def _run_signature(self) -> inspect.Signature:
        return inspect.signature(self.run)

    def lock_name(self, args: Any, kwargs: Any) -> str:
        """The name of the lock this call holds: the ``lock`` template filled with the call's arguments."""
        assert self.lock is not None
        try:
            bound = self._run_signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}() called with arguments that do not fit its signature: {exc}") from exc
        bound.apply_defaults()
        try:
            return self.lock.format(**bound.arguments)
        except (KeyError, IndexError, AttributeError, ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"lock template {self.lock!r} of {self.name} cannot be filled from the call's arguments: {exc!r}"
            ) from exc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.lock is None:
            return super().__call__(*args, **kwargs)
        shards = self.depot.shards
        name = self.lock_name(args, kwargs)
        ttl = lock_ms(self.lock_timeout, "lock_timeout")
        request = self.request
        if request.id is None or request.is_eager or request.called_directly:
            # Outside a worker delivery there is nothing to defer: wait for the lock instead.
            with Lock(shards.for_name(name), name, timeout=self.lock_timeout):
                return super().__call__(*args, **kwargs)
        token = uuid()
        retry_ms = lock_ms(self.lock_retry, "lock_retry")
        try:
            store = shards.for_name(name)
            status, _ = store.lock_take(name, token, ttl, request.id, retry_ms)
        except StoreUnavailableError as exc:
            raise Abandon(f"cannot take lock {name}: {exc}") from exc  # the sweep delivers it again
        if status == 0:
            raise Deferred(f"lock {name} is busy; the call waits for it in the delay set")
        if status < 0:
            # Not a call of our store (sent by name, or already acknowledged): retry through the delay store.
            raise self.retry(countdown=self.lock_retry, max_retries=None)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            try:
                released = store.lock_release(name, token)
            except StoreUnavailableError as exc:
                logger.warning("redisdelay: could not release lock %s (it expires by itself): %s", name, exc)
            else:
                if not released:
                    logger.warning(
                        "redisdelay: lock %s expired while %s[%s] ran; raise lock_timeout above the task's run time",
                        name,
                        self.name,
                        request.id,
                    )

    def call_limits(self) -> Limits:
        """The task's own limits, as stored with a call that gives none of its own (worked out once for
        the task's attributes and settings as they stand)."""
        settings = self.depot.settings
        stands = (self.visibility_timeout, self.queue_timeout, self.max_deliveries)
        known = self._own_limits
        if known is None or known[0] != stands or known[1] is not settings:
            known = self._own_limits = (stands, settings, self._limits(dict(NO_OVERRIDES)))
        return Limits(**known[2])  # a copy: callers may add to it

    def touch(self, timeout: float | None = None) -> bool:
        """Extend the running call's deadline to ``timeout`` seconds from now (a heartbeat).

        Call it from a long task before its visibility timeout runs out; returns False when the call
        is no longer tracked (for example, it was already swept and dead-lettered).
        """
        if timeout is None:
            timeout = self.visibility_timeout or self.depot.settings.visibility_timeout
        call_id, timeout_ms = self.request.id, round(seconds(timeout, "timeout") * 1000)
        return self.depot.shards.first(call_id, lambda store: store.touch(call_id, timeout_ms))


def combined_base(ours: type[DelayedTask], given: Any) -> type[DelayedTask]:
    """The class a decorated task derives from: ours, or a task class of the user's over ours (so
    ``@rd.delayed(base=MyTask)`` keeps MyTask's hooks, as ``@app.task(base=MyTask)`` would)."""
    if given is None or (isinstance(given, type) and issubclass(ours, given)):
        return ours  # no base, or one ours derives from already (celery.Task, app.Task)
    if not (isinstance(given, type) and issubclass(given, Task)):
        raise ConfigurationError(f"base={given!r} must be a Celery task class")
    if issubclass(given, ours):
        return given
    if issubclass(given, DelayedTask):
        raise ConfigurationError(f"base={given!r} is a task class of another kind or another RedisDelay")
    try:
        return type(given.__name__, (given, ours), {"__module__": given.__module__})
    except TypeError as exc:
        raise ConfigurationError(f"base={given!r} cannot be combined with {ours.__name__}: {exc}") from exc
