"""The exceptions this package raises: one base class, a few kinds that callers handle differently."""

from __future__ import annotations

from celery.exceptions import Ignore
from kombu.exceptions import EncodeError, OperationalError


class RedisDelayError(Exception):
    """Base class of every error raised by celery-redisdelay."""


class ConfigurationError(RedisDelayError):
    """A ``redisdelay_*`` setting, or a task option, has a value that cannot work."""


class ScheduleError(RedisDelayError, ValueError):
    """A scheduling option of a call that cannot work: a countdown or eta that cannot be turned into a
    due time (NaN, infinite, negative, wrong type), or a unique/debounce key that is not a string."""


class PayloadError(RedisDelayError, EncodeError):  # type: ignore[misc]  # kombu is untyped
    """A call's arguments cannot be serialized, so nothing was stored.

    It is also a :class:`kombu.exceptions.EncodeError`, the error Celery raises for the same problem.
    """


class StoreUnavailableError(RedisDelayError, ConnectionError, OperationalError):  # type: ignore[misc]  # kombu is untyped
    """Redis could not be reached, or refused the command; nothing was changed by the failed call.

    It is also a :class:`kombu.exceptions.OperationalError`, the error Celery raises when a publish cannot reach
    the broker: ``except OperationalError`` around ``delay()`` catches a call the store could not take, as it
    catches one the broker could not. A call (``apply_async``, ``delay``, ``send_task``) tries an unreachable store
    as Celery tries a publish: again under its ``retry_policy`` (over ``task_publish_retry_policy``), or once with
    ``retry=False``.
    """


class NotReplicatedError(RedisDelayError):
    """A call was stored on the master, but fewer replicas than ``redisdelay_wait_replicas`` confirmed it
    within ``redisdelay_wait_timeout``: a failover now could lose it. Parking it again under the same
    task id is safe (it replaces itself)."""


class Abandon(Ignore):  # type: ignore[misc]  # Celery is untyped
    """Raise inside a delayed task to end this delivery without acknowledging it.

    The call stays in flight and the sweep delivers it again once its visibility timeout has passed,
    exactly as if the worker had died. The validation consumer uses it to fail deliveries on purpose.
    """


class Deferred(Ignore):  # type: ignore[misc]  # Celery is untyped
    """Ends a delivery whose lock was busy: the call is back in the delay set, waiting for the lock.

    Raised by celery-redisdelay itself, not by task code; the delivery is not acknowledged and does
    not count as a failed one.
    """


class LockTimeout(RedisDelayError, TimeoutError):
    """``rd.lock(...)`` could not take the lock within its ``blocking_timeout``."""
