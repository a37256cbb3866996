"""Distributed locks with a unique token and an expiry, shared by tasks and by code outside them.

A task declared with ``lock=`` takes its lock on the worker before its body runs; when the lock is
busy the call is deferred in the delay set and the holder's release wakes it (see ``lock_take.lua``).
:class:`Lock` is the same lock for code outside tasks: ``with rd.lock("order:42", timeout=60): ...``.
Waiting blocks on a wake-up list the release pushes to, so a waiter does not poll an idle Redis.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import TYPE_CHECKING

from celery.utils import uuid

from ..errors import LockTimeout
from .schedule import lock_ms, seconds

if TYPE_CHECKING:
    from ..store.calls import CallStore

#: A waiter wakes at least this often to try again, in case another waiter took the wake-up.
LONGEST_WAIT = 1.0


class Lock:
    """A lock named ``name`` that expires ``timeout`` seconds after it is taken (or extended).

    ``blocking_timeout``: how long ``acquire`` (and ``with``) waits for a busy lock; None waits as long
    as it takes. ``with`` raises :class:`LockTimeout` when the wait runs out.
    """

    def __init__(self, store: CallStore, name: str, timeout: float = 60.0, blocking_timeout: float | None = None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"a lock name must be a non-empty string, not {name!r}")
        self.store = store
        self.name = name
        self.timeout = seconds(timeout, "timeout")
        self._ttl_ms = lock_ms(timeout, "timeout")
        self.blocking_timeout = None if blocking_timeout is None else seconds(blocking_timeout, "blocking_timeout")
        self.token: str | None = None

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock; False when it stayed busy (at once when not ``blocking``, else after the wait)."""
        if self.token is not None:
            raise RuntimeError(f"lock {self.name} is already held by this Lock object")
        token = uuid()
        ttl_ms = self._ttl_ms
        deadline = None if self.blocking_timeout is None else time.monotonic() + self.blocking_timeout
        while True:
            status, remaining_ms = self.store.lock_take(self.name, token, ttl_ms)
            if status >= 1:  # 2: taken over from a task whose run was gone
                self.token = token
                return True
            left = LONGEST_WAIT if deadline is None else deadline - time.monotonic()
            if not blocking or left <= 0:
                return False
            wait = min(LONGEST_WAIT, left)
            if remaining_ms >= 0:
                wait = min(wait, (remaining_ms + 1) / 1000)
            self.store.lock_wait(self.name, max(wait, 0.01))

    def release(self) -> bool:
        """Release the lock; False when it had expired meanwhile (and so may be held by another)."""
        if self.token is None:
            raise RuntimeError(f"lock {self.name} is not held by this Lock object")
        token, self.token = self.token, None
        return self.store.lock_release(self.name, token)

    def extend(self, timeout: float | None = None) -> bool:
        """Make the held lock expire ``timeout`` seconds from now (default: its own timeout)."""
        if self.token is None:
            raise RuntimeError(f"lock {self.name} is not held by this Lock object")
        ttl_ms = self._ttl_ms if timeout is None else lock_ms(timeout, "timeout")
        return self.store.lock_extend(self.name, self.token, ttl_ms)

    @property
    def owned(self) -> bool:
        """Whether this object took the lock and has not released it (it may have expired meanwhile)."""
        return self.token is not None

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise LockTimeout(f"lock {self.name} stayed busy for {self.blocking_timeout} s")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()
