"""Delayed Celery calls kept in Redis sorted sets: parked, released on time, tracked until done."""

from .errors import (
    Abandon,
    ConfigurationError,
    LockTimeout,
    NotReplicatedError,
    PayloadError,
    RedisDelayError,
    ScheduleError,
    StoreUnavailableError,
)
from .extension import RedisDelay
from .operations.validation import ValidationReport, run_validation
from .producer.batch import BatchedTask
from .producer.locks import Lock
from .producer.task import DelayedTask

# The one place of the version: pyproject.toml and docs/conf.py read it, CHANGELOG.rst has an entry for it.
__version__ = "0.6.0"

__all__ = [
    "Abandon",
    "BatchedTask",
    "ConfigurationError",
    "DelayedTask",
    "Lock",
    "LockTimeout",
    "NotReplicatedError",
    "PayloadError",
    "RedisDelay",
    "RedisDelayError",
    "ScheduleError",
    "StoreUnavailableError",
    "ValidationReport",
    "__version__",
    "run_validation",
]
