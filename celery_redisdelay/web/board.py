"""One dashboard's settings, kept on its Flask app, and how a request finds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from flask import current_app

from .security import Guard

if TYPE_CHECKING:
    from ..extension import RedisDelay

#: Seconds one request acting on "everything matching" may work before it stops and says so.
ACTION_BUDGET = 20.0


@dataclass(frozen=True)
class Dashboard:
    """What :func:`celery_redisdelay.web.create_app` was given, in ``app.extensions["redisdelay"]``."""

    rd: RedisDelay
    guard: Guard
    scan: int = 10_000  # entries one filtered list page reads at most, unless the URL asks otherwise
    budget: float = ACTION_BUDGET

    @property
    def read_only(self) -> bool:
        return self.guard.read_only


def dashboard() -> Dashboard:
    """The settings of the dashboard serving the current request."""
    return cast(Dashboard, current_app.extensions["redisdelay"])
