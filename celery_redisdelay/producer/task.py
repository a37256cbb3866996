"""The task class behind ``@rd.delayed``: ``apply_async`` parks the call in Redis."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from celery import Task
from celery.result import AsyncResult
from celery.utils import uuid

from ..errors import Abandon, ConfigurationError, Deferred, StoreUnavailableError
from ..message.marks import request_delivery
from .locks import Lock
from .parking import CallRequest, park_call, park_sent
from .rules import CallRules
from .schedule import lock_ms, seconds

if TYPE_CHECKING:
    from ..store.calls import CallStore

logger = logging.getLogger(__name__)

# Routing given to ``@rd.delayed``: Celery 5.7 deprecates these as task attributes, so the task keeps
# them apart and applies them to each call (below the call's own options, above ``task_routes``).
ROUTING_OPTIONS = ("queue", "routing_key", "exchange", "priority")


class DelayedTask(CallRules, Task):  # type: ignore[misc]  # Celery's Task is untyped
    """A Celery task whose calls wait in Redis until they are due; it is its own :class:`CallRules`.

    The extension makes the class a task derives from (``rd.Task``), with the ``depot`` its calls are parked
    in and the ``templates`` kept for them. Class attributes (set them with ``@rd.delayed(...)``):

    - ``default_countdown``: seconds a call waits when ``apply_async`` gives neither countdown nor eta.
    - ``visibility_timeout``: seconds a started call may run before the sweep delivers it again
      (``None``: the ``redisdelay_visibility_timeout`` setting).
    - ``max_deliveries``: deliveries without acknowledgement before the call is dead-lettered
      (``None``: the ``redisdelay_max_deliveries`` setting).
    - ``lock``: a template formatted with the call's arguments (``"order:{order_id}"``) naming a lock
      the call holds while it runs; ``lock_timeout`` is the lock's expiry and ``lock_retry`` the
      longest the first deferred call in line waits before trying again (the holder's release wakes it
      sooner, and each release the next in line).
    """

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

        def build(call_id: str, parking: Any, rest: dict[str, Any]) -> AsyncResult:
            return super(DelayedTask, self).apply_async(
                args, kwargs, call_id, parking, link, link_error, shadow, **rest
            )

        if self._get_app().conf.task_always_eager:
            self.call_options(args, kwargs, options)  # checked as when parking, then dropped
            # Eager mode runs the call at once, as Celery does for any task.
            return super().apply_async(args, kwargs, task_id, producer, link, link_error, shadow, **options)
        # The options apply_async takes by name count for its template as much as the others.
        named = {"link": link, "link_error": link_error, "shadow": shadow}
        named = {name: value for name, value in named.items() if value is not None}
        if producer is not None:
            options["producer"] = producer  # the task-sent event goes through it (park_call)
        ignore_result = bool(options.get("ignore_result", self.ignore_result))
        built_by = ("apply_async", named)
        return park_call(CallRequest(self, self, args, kwargs, task_id, options, build, ignore_result, built_by))

    def park(
        self,
        args: Any,
        kwargs: Any,
        task_id: str | None,
        options: dict[str, Any],
        build: Callable[[str, Any, dict[str, Any]], Any],
        ignore_result: bool,
        built_by: tuple[str, dict[str, Any]],
    ) -> AsyncResult:
        """Park a call by this task's own rules (see :func:`~celery_redisdelay.producer.parking.park_call`)."""
        return park_call(CallRequest(self, self, args, kwargs, task_id, options, build, ignore_result, built_by))

    def park_sent(self, given: dict[str, Any], send_task: Callable[..., Any]) -> AsyncResult:
        """Park a call made by name, ``app.send_task(self.name, ...)`` (see
        :func:`~celery_redisdelay.producer.parking.park_sent`)."""
        return park_sent(self, self, given, send_task)

    def park_many(self, calls: Iterable[Sequence[Any]], kwargs: Any = None, **options: Any) -> list[AsyncResult]:
        """Park one call per item of ``calls`` (each an args tuple, as for ``starmap``), all with the same
        ``kwargs`` and options (``countdown``/``eta``, routing, ...): many times faster than calling
        ``apply_async`` for each. Returns their results in order. Calls with ``unique_key`` or
        ``debounce_key``, compressed calls and eager mode are parked one by one."""
        from .bulk import park_many

        return park_many(self, calls, kwargs, options)

    # -- the lock a call holds while it runs ---------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.lock is None:
            return super().__call__(*args, **kwargs)
        name = self.lock_name(args, kwargs)
        request = self.request
        if request.id is None or request.is_eager or request.called_directly:
            # Outside a worker delivery there is nothing to defer: wait for the lock instead.
            with Lock(self.depot.shards.for_name(name), name, timeout=self.lock_timeout):
                return super().__call__(*args, **kwargs)
        token = uuid()
        store = self._take_lock(name, token)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self._release_lock(store, name, token)

    def _take_lock(self, name: str, token: str) -> CallStore:
        """Take the lock ``name`` for this delivery's run (the store that holds it), or end the run: deferred behind
        a busy lock, abandoned (the store cannot be reached, or a later delivery runs the call), retried (a call
        not of our store)."""
        request = self.request
        ttl, retry_ms = lock_ms(self.lock_timeout, "lock_timeout"), lock_ms(self.lock_retry, "lock_retry")
        try:
            store = self.depot.shards.for_name(name)
            status, _ = store.lock_take(name, token, ttl, request.id, retry_ms, request_delivery(request) or 0)
        except StoreUnavailableError as exc:
            raise Abandon(f"cannot take lock {name}: {exc}") from exc  # the sweep delivers it again
        if status == -2:
            # The sweep delivered the call again after this delivery was received: the later one runs it.
            raise Abandon(f"delivery of {request.id} is not the call's current one; a later delivery runs it")
        if status == 0:
            raise Deferred(f"lock {name} is busy; the call waits for it in the delay set")
        if status < 0:
            # Not a call of our store (sent by name, or already acknowledged): retry through the delay store.
            raise self.retry(countdown=self.lock_retry, max_retries=None)
        if status == 2:
            logger.warning(
                "redisdelay: %s[%s] took lock %s over from a call whose run was gone (its worker died)",
                self.name,
                request.id,
                name,
            )
        return store

    def _release_lock(self, store: CallStore, name: str, token: str) -> None:
        try:
            released = store.lock_release(name, token)
        except StoreUnavailableError as exc:
            logger.warning("redisdelay: could not release lock %s (it expires by itself): %s", name, exc)
            return
        if not released:
            logger.warning(
                "redisdelay: lock %s expired while %s[%s] ran; raise lock_timeout above the task's run time",
                name,
                self.name,
                self.request.id,
            )

    def touch(self, timeout: float | None = None) -> bool:
        """Extend the running call's deadline to ``timeout`` seconds from now (a heartbeat).

        Call it from a long task before its visibility timeout runs out; returns False when the call
        is no longer tracked (for example, it was already swept and dead-lettered).
        """
        if timeout is None:
            timeout = self.visibility_timeout or self.depot.settings.visibility_timeout
        call_id, timeout_ms = self.request.id, round(seconds(timeout, "timeout") * 1000)
        self.depot.outbox.flush()  # the run's start first: it would set the deadline again
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
