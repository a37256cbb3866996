"""The requests a worker is running, as Celery's worker state in its main process knows them.

Both the leases (:mod:`.leases`, which keep renewing a running call on a warm stop) and kombu's unacked
bookkeeping (:mod:`.unacked`, which puts back on close the calls not running) read them here.
"""

from __future__ import annotations

from typing import Any

from celery.worker import state


def running_requests() -> list[Any]:
    """The requests this worker is running (Celery's worker state, which the consumer changes meanwhile)."""
    for _ in range(10):
        try:
            return list(state.active_requests)
        except RuntimeError:  # the set changed while it was read
            continue
    return []
