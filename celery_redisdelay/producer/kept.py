"""The templates kept for single calls (``apply_async``): which calls may be rendered from one, and the
bounded cache of them. See :mod:`celery_redisdelay.producer.templates` for what a template is.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

from celery import Task, signals
from celery.app.routes import MapRoute
from celery.backends.base import BaseBackend
from kombu.utils import json as kombu_json

from ..store.meta import CallMeta, Limits, meta_json
from .templates import CallTemplate

#: Options a kept template can carry (each one fixed for the template); any other takes Celery's path.
KEPT_OPTIONS = frozenset(
    {
        "queue",
        "routing_key",
        "exchange",
        "priority",
        "serializer",
        "time_limit",
        "soft_time_limit",
        "ignore_result",
        "argsrepr",
        "kwargsrepr",
        "shadow",
        "headers",
        "delivery_mode",
    }
)
#: Options a template does not carry that Celery's ``Task.apply_async`` hands ``send_task`` as None when the call
#: does not give them (as a call by name leaves them out): None is Celery's default for each.
DEFAULTED_OPTIONS = frozenset({"compression", "immediate", "mandatory", "expires", "link", "link_error"})
_SCALARS = (str, int, float, bool, type(None))


class TemplateKey(NamedTuple):
    """What calls sharing a template have in common."""

    task: str
    via: str
    options: tuple[tuple[str, Any], ...]
    limits: tuple[tuple[str, Any], ...]
    eta: bool = False  # whether the calls have an eta (from a countdown or an eta): a slot of the template


def template_key(task: Any, via: str, options: dict[str, Any], limits: Limits, eta: bool = False) -> TemplateKey | None:
    """The key under which a single call's template is kept, or None when Celery must build this call.
    ``via`` names the call that builds the message (``apply_async`` and ``send_task`` build different
    ones) and ``options`` holds every option of the call, ``shadow`` and ``link`` among them. None
    when someone listens to the publish signals or task-sent events (they get Celery's own arguments),
    in a task (the parent ids and inherited priority change per call), with a router that may look at
    the arguments, a result backend whose ``on_task_call`` is needed at the call, a task with a shadow
    name or argument conversion of its own, or an option a template does not carry."""
    app = task._get_app()
    if (
        signals.before_task_publish.receivers
        or signals.after_task_publish.receivers
        or app.current_worker_task is not None
        or not _task_allows(task, app.amqp.router, task.backend)
        or app.conf.task_send_sent_event
    ):
        return None
    fixed = []
    for name, value in options.items():
        if name not in KEPT_OPTIONS:
            if value is None and name in DEFAULTED_OPTIONS:
                continue  # Celery's Task.apply_async passes them to send_task, None: as if not given
            return None
        if name == "headers":
            try:
                value = kombu_json.dumps(value, sort_keys=True)
            except (TypeError, ValueError):
                return None
        elif not isinstance(value, _SCALARS):
            return None
        fixed.append((name, value))
    return TemplateKey(task.name, via, tuple(sorted(fixed)), tuple(sorted(limits.items())), eta)


#: task -> (its router, its backend, whether they allow a kept template), by weak reference: a cache that held
#: them would keep apps that are done with, their result backends and those backends' sockets alive.
_ALLOWS: weakref.WeakKeyDictionary[Any, tuple[weakref.ref[Any], weakref.ref[Any], bool]] = weakref.WeakKeyDictionary()


def _task_allows(task: Any, router: Any, backend: Any) -> bool:
    """:func:`_allows`, remembered per task for as long as the task, its router and its backend live."""
    known = _ALLOWS.get(task)
    if known is not None and known[0]() is router and known[1]() is backend:
        return known[2]
    allows = _allows(task, router, backend)
    _ALLOWS[task] = (weakref.ref(router), weakref.ref(backend), allows)
    return allows


def _allows(task: Any, router: Any, backend: Any) -> bool:
    """What of a task, its app's router and its result backend allows a kept template: no shadow name or
    argument conversion of the task's own; routers that route by the task's name alone (mappings, not
    functions that may look at the arguments); a backend whose ``on_task_call`` does nothing, or is the
    Redis backend's subscription to the result, which the park of a rendered call makes as Celery does."""
    if (
        type(task).shadow_name is not Task.shadow_name
        or getattr(task, "__v2_compat__", False)
        or getattr(task, "_dump_pydantic_arguments", None) is not None
        or not all(isinstance(route, MapRoute) for route in router.routes)
    ):
        return False
    if type(backend).on_task_call is BaseBackend.on_task_call:
        return True
    from celery.backends.redis import RedisBackend

    return isinstance(backend, RedisBackend)


class TemplateCache:
    """Templates of single calls (``apply_async``), by :func:`template_key`; at most :attr:`LIMIT`.

    A key gets a template the second time it is seen, so calls whose options differ every time (a
    header with a trace id, say) never pay for making one; a key whose template could not be made is
    not tried again.
    """

    LIMIT = 256

    def __init__(self) -> None:
        self._made: dict[TemplateKey, Kept] = {}
        self._seen: set[TemplateKey] = set()
        self._refused: set[TemplateKey] = set()

    def get(self, key: TemplateKey | None) -> Kept | None:
        """The template of ``key`` and the metadata its calls are stored with, if made."""
        return None if key is None else self._made.get(key)

    def wanted(self, key: TemplateKey | None) -> bool:
        """Whether the call being built should leave a template for ``key`` (seen before, not refused)."""
        if key is None or key in self._refused or key in self._made:
            return False
        if key in self._seen:
            return True
        if len(self._seen) >= self.LIMIT:
            self._seen.clear()
        self._seen.add(key)
        return False

    def keep(self, key: TemplateKey, template: CallTemplate | None, meta: Limits | CallMeta) -> None:
        """Keep the template made for ``key`` (None: it could not be made), with its calls' metadata."""
        if template is None:
            if len(self._refused) < self.LIMIT:
                self._refused.add(key)
            return
        if len(self._made) >= self.LIMIT:
            self._made.clear()
        self._made[key] = Kept(template, meta, meta_json(meta))


class Kept(NamedTuple):
    """A kept template, the metadata its calls are parked with, and that metadata's stored form (keyless)."""

    template: CallTemplate
    meta: Limits | CallMeta
    stored_meta: str
