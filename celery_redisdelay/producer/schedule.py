"""Turning ``countdown`` / ``eta`` into a due time, following Celery's own rules.

A countdown is measured by the Redis server's clock (inside the park script), so producers whose
clocks disagree still agree on when a call is due; a negative one means now, like an eta in the past.
An eta is an absolute instant: an aware datetime is used as given, a naive one is read the way a
Celery worker reads it (``maybe_make_aware`` with the app's ``timezone``). :func:`celery_eta` is the eta
Celery would have written in the call's message, which the running task sees as ``self.request.eta``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

from celery.utils import time as celery_time
from celery.utils.time import maybe_iso8601, maybe_make_aware

from ..errors import ScheduleError


@dataclass(frozen=True)
class Due:
    """When a call is due: ``countdown_ms`` from now by the Redis clock, or at ``at_ms``."""

    countdown_ms: int | None = None
    at_ms: int | None = None


#: The longest duration accepted anywhere (100 years): beyond it a due time is surely a mistake, and
#: milliseconds stop being exact in a Redis score.
LONGEST_SECONDS = 100 * 365 * 24 * 3600


def seconds(value: object, name: str) -> float:
    """Check a duration given by a caller: a finite number of seconds, 0 to 100 years."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScheduleError(f"{name} must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value < 0 or value > LONGEST_SECONDS:
        raise ScheduleError(f"{name} must be a finite number of seconds from 0 to {LONGEST_SECONDS}, not {value!r}")
    return float(value)


def resolve_due(
    countdown: object = None,
    eta: object = None,
    *,
    default_countdown: float = 0.0,
    timezone: tzinfo | str | None = None,
) -> Due:
    """The due time of a call from the options of ``apply_async``."""
    if countdown is not None and eta is not None:
        raise ScheduleError("give countdown or eta, not both")
    if eta is not None:
        if isinstance(eta, str):
            try:
                eta = maybe_iso8601(eta)
            except ValueError as exc:
                raise ScheduleError(f"eta {eta!r} is not an ISO 8601 date and time") from exc
        if not isinstance(eta, datetime):
            raise ScheduleError(f"eta must be a datetime, not {eta!r}")
        aware = maybe_make_aware(eta, timezone)
        return Due(at_ms=math.floor(aware.timestamp() * 1000))
    if countdown is None:
        countdown = default_countdown
    if isinstance(countdown, (int, float)) and not isinstance(countdown, bool) and -math.inf < countdown < 0:
        # A computed delay that went slightly negative: due now, as Celery treats it (and a past eta).
        countdown = 0
    return Due(countdown_ms=round(seconds(countdown, "countdown") * 1000))


def _add_seconds(moment: datetime, seconds: float) -> datetime:
    """``moment`` plus ``seconds`` as Celery adds a countdown: by its own helper where it has one (Celery 5.7
    adds across a DST change in UTC), else with a timedelta, as Celery did before."""
    add: Callable[[datetime, float], datetime] | None = getattr(celery_time, "add_seconds_to_datetime", None)
    return add(moment, seconds) if add is not None else moment + timedelta(seconds=seconds)


def celery_eta(
    countdown: object,
    eta: object,
    now: Callable[[], datetime],
    timezone: tzinfo | None,
) -> str | None:
    """The ``eta`` header Celery's ``as_task_v2`` writes for a call with these options (checked already by
    :func:`resolve_due`): a countdown other than 0 added to ``now()`` (the app's clock, as Celery reads it
    at the call) and made aware in ``timezone``; an eta datetime as given, in ISO 8601; an eta string
    unchanged; None for neither."""
    if countdown:
        moment: datetime = maybe_make_aware(_add_seconds(now(), float(countdown)), tz=timezone)  # type: ignore[arg-type]
        return moment.isoformat()
    if isinstance(eta, str):
        return eta
    return eta.isoformat() if isinstance(eta, datetime) else None


def lock_ms(value: object, name: str) -> int:
    """A lock's expiry or retry interval in whole ms, at least 1 (Redis refuses an expiry of 0)."""
    duration = seconds(value, name)
    if duration <= 0:
        raise ScheduleError(f"{name} must be more than 0 seconds, not {value!r}")
    return max(1, math.ceil(duration * 1000))
