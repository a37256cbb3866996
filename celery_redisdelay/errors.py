"""The exceptions this package raises: one base class, a few kinds that callers handle differently."""

from __future__ import annotations

from celery.exceptions import Ignore
from kombu.exceptions import EncodeError


class RedisDelayError(Exception):
    """Base class of every error raised by celery-redisdelay."""


class ConfigurationError(RedisDelayError):
    """A ``redisdelay_*`` setting, or a task option, has a value that cannot work."""


class ScheduleError(RedisDelayError, ValueError):
    """A countdown or eta that cannot be turned into a due time (NaN, infinite, negative, wrong type)."""


class PayloadError(RedisDelayError, EncodeError):  # type: ignore[misc]  # kombu is untyped
    """A call's arguments cannot be serialized, so nothing was stored.

    It is also a :class:`kombu.exceptions.EncodeError`, the error Celery raises for the same problem.
    """


class StoreUnavailableError(RedisDelayError, ConnectionError):
    """Redis could not be reached, or refused the command; nothing was changed by the failed call."""


class Abandon(Ignore):  # type: ignore[misc]  # Celery is untyped
    """Raise inside a delayed task to end this delivery without acknowledging it.

    The call stays in flight and the sweep delivers it again once its visibility timeout has passed,
    exactly as if the worker had died. The validation consumer uses it to fail deliveries on purpose.
    """
