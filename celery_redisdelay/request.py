"""The request class of delayed tasks on a worker (Celery's ``Task.Request`` hook).

A run killed by its hard time limit is finished as Celery sees it: the worker's main process marks
it failed (``TimeLimitExceeded``) and does not run it again. Celery 5.7 also sends ``task_failure``
then; older versions send nothing a handler could hear, so the call is acknowledged here, or the
sweep would deliver it again after its visibility timeout.
"""

from __future__ import annotations

from typing import Any

from celery.worker import state
from celery.worker.request import Request

from .tracking import acknowledge


class TrackedRequest(Request):  # type: ignore[misc]  # Celery is untyped
    """Celery's request, acknowledging the call when its hard time limit ends the run."""

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        # During a cold shutdown Celery leaves the call unfinished: it is delivered again.
        if not soft and not state.should_terminate:
            rd: Any = getattr(self.task, "redisdelay", None)
            if rd is not None:
                acknowledge(rd, self.id)
