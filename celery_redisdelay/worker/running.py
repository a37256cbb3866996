"""The requests a worker is running or holds, as Celery's worker state in its main process knows them.

Both the leases (:mod:`.leases`, which keep renewing a running call on a warm stop) and kombu's unacked
bookkeeping (:mod:`.unacked`, which puts back on close the calls not running) read them here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from celery.worker import state

T = TypeVar("T")


def running_requests() -> list[Any]:
    """The requests this worker is running (Celery's worker state, which the consumer changes meanwhile)."""
    return _read(lambda: list(state.active_requests), [])


def known_ids() -> set[str] | None:
    """The ids of every request this worker knows: reserved, scheduled or running. Not only ``state.requests``'s:
    that dict keeps one request an id, and the end of one drops the id while another request of the same call is
    held (a run deferred behind a lock that ends after the woken delivery was received). None: not read (the
    state kept changing under the read)."""

    def read() -> set[str]:
        ids = set(state.requests)
        # (scheduled_requests: Celery 5.6 and later)
        for requests in (state.active_requests, state.reserved_requests, getattr(state, "scheduled_requests", ())):
            ids.update(request.id for request in list(requests))
        return ids

    return _read(read, None)


def _read(read: Callable[[], T], failed: T) -> T:
    """``read()`` of the worker state, which the consumer's thread changes meanwhile: tried again when a set
    changed while it was read (``failed`` after ten tries)."""
    for _ in range(10):
        try:
            return read()
        except RuntimeError:  # a set or dict changed while it was read
            continue
    return failed
