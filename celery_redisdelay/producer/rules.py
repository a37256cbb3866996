"""How a task's calls are parked: their limits, their unique or debounce key, the lock they hold, their
routing. :class:`CallRules` holds these rules; a delayed task is its own rules (its class attributes, set with
``@rd.delayed(...)``), and a plain task of an app with ``redisdelay_all_tasks`` gets the rules of
:mod:`celery_redisdelay.producer.adoption`.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from ..errors import ConfigurationError, ScheduleError
from ..store.forks import cached_property
from ..store.keys import group_id
from ..store.limits import LIMIT_OPTIONS, Gate, TaskLimits
from ..store.meta import Limits
from .schedule import lock_ms, seconds

if TYPE_CHECKING:
    from ..store.depot import Depot
    from .kept import TemplateCache

# Per-call options of ``apply_async`` that belong to celery-redisdelay, not to Celery.
CALL_OPTIONS = ("visibility_timeout", "queue_timeout", "max_deliveries")
NO_OVERRIDES: dict[str, Any] = dict.fromkeys(CALL_OPTIONS)
KEY_OPTIONS = ("unique_key", "debounce_key")


def check_lock_options(function: Any, options: dict[str, Any]) -> None:
    """Refuse, at decoration, lock options that cannot work: a template naming something that is
    not an argument of the task, a malformed template, a timeout that is not a duration."""
    template = options.get("lock")
    if template is None:
        return
    name = options.get("name") or getattr(function, "__name__", "?")
    for option in ("lock_timeout", "lock_retry"):
        if option in options:
            try:
                lock_ms(options[option], option)
            except ScheduleError as exc:
                raise ConfigurationError(f"{name}: {exc}") from exc
    check_template(function, options, "lock")


def check_limit_options(function: Any, options: dict[str, Any]) -> None:
    """Refuse, at decoration, limits that cannot work: a rate Celery's syntax does not give, a concurrency
    below 1, a ``limit_key`` naming something that is not an argument of the task."""
    name = str(options.get("name") or getattr(function, "__name__", "?"))
    TaskLimits.declared(name, options)
    if options.get("limit_key") is not None:
        check_template(function, options, "limit_key")


def check_template(function: Any, options: dict[str, Any], option: str) -> None:
    """Refuse a template option (``lock``, ``limit_key``) that no call of the task could fill."""
    template = options[option]
    name = options.get("name") or getattr(function, "__name__", "?")
    if not isinstance(template, str) or not template:
        raise ConfigurationError(f"{option} of {name} must be a non-empty string template, not {template!r}")
    parameters = list(inspect.signature(function).parameters)
    if options.get("bind"):
        parameters = parameters[1:]
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as exc:
        raise ConfigurationError(f"{option} template {template!r} of {name} is malformed: {exc}") from exc
    for field in fields:
        root = field.split(".", 1)[0].split("[", 1)[0]
        if root not in parameters:
            raise ConfigurationError(
                f"{option} template {template!r} of {name} refers to {{{field}}}, which is not an argument of "
                f"the task (arguments: {', '.join(parameters) or 'none'}); name arguments, as in 'order:{{order_id}}'"
            )
    # Format once with stand-ins that accept any attribute, index and format spec: what still fails
    # (a bad conversion, an empty attribute, a nested field naming no argument) would fail every call.
    try:
        template.format(**dict.fromkeys(parameters, _StandIn()))
    except (KeyError, IndexError, AttributeError, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"{option} template {template!r} of {name} cannot be filled by any call: {exc!r}"
        ) from exc


class CallOptions(NamedTuple):
    """A call's options of this package: the limits stored with it, its unique/debounce mode and key
    (``""`` for none), the name of the lock it holds (None for none), the gate of the limits it is under
    (None for none)."""

    limits: Limits
    mode: str
    key: str
    lock_name: str | None
    gate: Gate | None = None


class _StandIn:
    """An argument value for checking a lock template: every attribute, item and format spec fits."""

    def __getattr__(self, name: str) -> _StandIn:
        return self

    def __getitem__(self, key: object) -> _StandIn:
        return self

    def __format__(self, spec: str) -> str:
        return ""


class CallRules:
    """The rules a task's calls are parked by (see the module's docstring). A subclass sets ``name``, the
    ``depot`` the calls go to and the ``templates`` kept for them; the attributes below are the defaults
    (a delayed task's class attributes)."""

    name: str
    depot: Depot
    templates: TemplateCache
    run: Callable[..., Any]  # a task's body: the lock template names its arguments
    default_countdown: ClassVar[float] = 0.0
    visibility_timeout: ClassVar[float | None] = None
    queue_timeout: ClassVar[float | None] = None
    max_deliveries: ClassVar[int | None] = None
    routing_options: ClassVar[dict[str, Any]] = {}
    lock: ClassVar[str | None] = None
    lock_timeout: ClassVar[float] = 60.0
    lock_retry: ClassVar[float] = 5.0
    limit_rate: ClassVar[Any] = None
    limit_concurrency: ClassVar[int | None] = None
    limit_key: ClassVar[str | None] = None
    limit_quota: ClassVar[Any] = None
    _own_limits: tuple[tuple[Any, ...], Any, Limits] | None = None  # see call_limits

    def call_options(self, args: Any, kwargs: Any, options: dict[str, Any]) -> CallOptions:
        """Take this package's own options out of a call's ``options`` and check them with the call."""
        given = {name: options.pop(name, None) for name in CALL_OPTIONS}
        limits = self.call_limits() if given == NO_OVERRIDES else self._limits(given)
        mode, key = self._key_option({name: options.pop(name, None) for name in KEY_OPTIONS})
        # A template the arguments cannot fill fails here.
        lock_name = self.lock_name(args or (), kwargs or {}) if self.lock is not None else None
        declared = self.task_limits
        gate = None
        if declared is not None:
            limit_key = self.fill("limit_key", self.limit_key, args or (), kwargs or {}) if self.limit_key else ""
            gate = declared.gate(limit_key, self.depot.quotas)
        return CallOptions(limits, mode, key, lock_name, gate)

    @cached_property
    def task_limits(self) -> TaskLimits | None:
        """The limits the task's calls are under (see :mod:`~celery_redisdelay.store.limits`)."""
        return TaskLimits.declared(self.name, {name: getattr(self, name) for name in LIMIT_OPTIONS})

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
        limits = Limits(
            t=self.name,
            m=limit,
            r=round(seconds(run, "visibility_timeout") * 1000),
            q=round(seconds(queue, "queue_timeout") * 1000),
        )
        if overrides["visibility_timeout"] or self.visibility_timeout:
            limits["o"] = 1  # the task's own run timeout: a hard end of its run, which no lease renewal passes
        return limits

    # -- the lock a call holds while it runs ---------------------------------------------------------

    @cached_property
    def _run_signature(self) -> inspect.Signature:
        return inspect.signature(self.run)

    def lock_name(self, args: Any, kwargs: Any) -> str:
        """The name of the lock this call holds: the ``lock`` template filled with the call's arguments."""
        assert self.lock is not None
        return self.fill("lock", self.lock, args, kwargs)

    def fill(self, option: str, template: str, args: Any, kwargs: Any) -> str:
        """A template option (``lock``, ``limit_key``) filled with a call's arguments."""
        try:
            bound = self._run_signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}() called with arguments that do not fit its signature: {exc}") from exc
        bound.apply_defaults()
        try:
            return template.format(**bound.arguments)
        except (KeyError, IndexError, AttributeError, ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"{option} template {template!r} of {self.name} cannot be filled from the call's arguments: {exc!r}"
            ) from exc

    def call_limits(self) -> Limits:
        """The task's own limits, as stored with a call that gives none of its own (worked out once for
        the task's attributes and settings as they stand)."""
        settings = self.depot.settings
        stands = (self.visibility_timeout, self.queue_timeout, self.max_deliveries)
        known = self._own_limits
        if known is None or known[0] != stands or known[1] is not settings:
            known = self._own_limits = (stands, settings, self._limits(dict(NO_OVERRIDES)))
        return Limits(**known[2])  # a copy: callers may add to it
