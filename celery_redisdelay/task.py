"""The task class behind ``@rd.delayed``: ``apply_async`` parks the call in Redis."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from celery import Task
from celery.result import AsyncResult
from celery.utils import uuid
from kombu.exceptions import OperationalError

from .errors import ConfigurationError, StoreUnavailableError
from .schedule import resolve_due, seconds

if TYPE_CHECKING:
    from .extension import RedisDelay

# Per-call options of ``apply_async`` that belong to celery-redisdelay, not to Celery.
CALL_OPTIONS = ("visibility_timeout", "queue_timeout", "max_deliveries")
# Routing given to ``@rd.delayed``: Celery 5.7 deprecates these as task attributes, so the task keeps
# them apart and applies them to each call (below the call's own options, above ``task_routes``).
ROUTING_OPTIONS = ("queue", "routing_key", "exchange", "priority")


class DelayedTask(Task):  # type: ignore[misc]  # Celery's Task is untyped
    """A Celery task whose calls wait in Redis until they are due.

    Class attributes (set them with ``@rd.delayed(...)``):

    - ``default_countdown``: seconds a call waits when ``apply_async`` gives neither countdown nor eta.
    - ``visibility_timeout``: seconds a started call may run before the sweep delivers it again
      (``None``: the ``redisdelay_visibility_timeout`` setting).
    - ``max_deliveries``: deliveries without acknowledgement before the call is dead-lettered
      (``None``: the ``redisdelay_max_deliveries`` setting).
    """

    redisdelay: ClassVar[RedisDelay]
    default_countdown: ClassVar[float] = 0.0
    visibility_timeout: ClassVar[float | None] = None
    queue_timeout: ClassVar[float | None] = None
    max_deliveries: ClassVar[int | None] = None
    routing_options: ClassVar[dict[str, Any]] = {}

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
        limits = self._limits({name: options.pop(name, None) for name in CALL_OPTIONS})
        app = self._get_app()
        if app.conf.task_always_eager:
            # Eager mode runs the call at once, as Celery does for any task.
            return super().apply_async(args, kwargs, task_id, producer, link, link_error, shadow, **options)
        for key, value in self.routing_options.items():
            options.setdefault(key, value)
        due = resolve_due(
            options.pop("countdown", None),
            options.pop("eta", None),
            default_countdown=self.default_countdown,
            timezone=app.conf.timezone,
        )
        task_id = task_id or uuid()
        with self.redisdelay.parking_producer(task_id, due, limits) as parking:
            try:
                return super().apply_async(args, kwargs, task_id, parking, link, link_error, shadow, **options)
            except OperationalError as exc:
                # Celery's send_task wraps connection errors in kombu's; the caller should see ours.
                if isinstance(exc.__cause__, StoreUnavailableError):
                    raise exc.__cause__ from exc.__cause__.__cause__
                raise

    def _limits(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """The per-call limits stored with the call: deliveries and timeouts in ms."""
        settings = self.redisdelay.settings
        run = overrides["visibility_timeout"] or self.visibility_timeout or settings.visibility_timeout
        queue = overrides["queue_timeout"] or self.queue_timeout or settings.queue_timeout
        limit = overrides["max_deliveries"]
        if limit is None:
            limit = self.max_deliveries if self.max_deliveries is not None else settings.max_deliveries
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(f"max_deliveries must be an integer >= 0 (0: no limit), not {limit!r}")
        return {
            "t": self.name,
            "m": limit,
            "r": round(seconds(run, "visibility_timeout") * 1000),
            "q": round(seconds(queue, "queue_timeout") * 1000),
        }

    def touch(self, timeout: float | None = None) -> bool:
        """Extend the running call's deadline to ``timeout`` seconds from now (a heartbeat).

        Call it from a long task before its visibility timeout runs out; returns False when the call
        is no longer tracked (for example, it was already swept and dead-lettered).
        """
        if timeout is None:
            timeout = self.visibility_timeout or self.redisdelay.settings.visibility_timeout
        return self.redisdelay.store.touch(self.request.id, round(seconds(timeout, "timeout") * 1000))
