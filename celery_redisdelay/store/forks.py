"""What a forked child inherits of ours, made safe to use in the child.

A process forks with all its memory but only the thread that called ``fork``: a lock another thread of
the parent held at that moment stays held in the child, and nobody is left to release it. Celery forks
its pool processes (again for each replaced one) while a worker's precise releaser thread runs scripts,
and producers fork too (multiprocessing, gunicorn ``--preload``, a test suite's in-process worker).

* **redis-py's pools** reset themselves in a child (they compare the pid), but under locks they bring
  from the parent: a pool lock held by another thread at the fork makes the child's first command wait
  forever (redis-py 8, whose reset takes the pool's lock) or fail after 5 s (``ChildDeadlockedError``,
  any version, when the parent was itself a child resetting the pool). Every client this package makes
  is registered here (:func:`fork_safe`), and in a child, before anything else runs, the locks of its
  redis-py objects (pools, a cluster's node manager, the client itself) are made new and free, as
  CPython makes its own locks new in a child; each pool then resets itself as redis-py does.
* **A cached attribute** being worked out by another thread at the fork: ``functools.cached_property``
  takes a lock shared by every instance on Python 3.11 (3.12 dropped it), so a child that needs the
  attribute waits forever. :class:`cached_property` here takes none: two threads may both work out a
  value, and the last one is kept, as on Python 3.12.

* **An import under way** in another thread at the fork: Python makes its global import lock new in a child,
  but not the lock of each module being imported, so a child that imports the same module waits forever. A
  client connecting by host name looks up the ``idna`` codec, and the first lookup imports ``encodings.idna``:
  a worker's lease or releaser thread reconnecting (after a Redis restart) while Celery forks a pool process
  left that child blocked at its first connection (seen in the chaos runs, with py-spy). The codec is looked
  up here, once, when the package is imported, before any thread of ours runs.

Connections kept per thread (:mod:`celery_redisdelay.store.evalsha`) check the pid themselves; threads do not
survive a fork, and the precise releaser's belong to the process that started them.
"""

from __future__ import annotations

import collections
import os
import queue
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")
R = TypeVar("R")

_CLIENTS: weakref.WeakSet[Any] = weakref.WeakSet()
_CONTAINERS = (list, tuple, set, frozenset, collections.deque)


def fork_safe(client: T) -> T:
    """Register a redis-py client (``Redis``, ``RedisCluster``, Sentinel's master) so that a forked child
    gets its locks new and free; returns it."""
    _CLIENTS.add(client)
    return client


def _is_redis_object(value: object) -> bool:
    """redis-py's own objects (clients, pools, connections, a cluster's nodes) and the queue a blocking
    pool keeps its connections in: what a walk from a client descends into."""
    module = type(value).__module__ or ""
    return module == "redis" or module.startswith("redis.") or isinstance(value, queue.Queue)


def _locks_of(client: object) -> Iterator[Any]:
    """Every lock (anything with CPython's ``_at_fork_reinit``: locks, RLocks, conditions, events, and
    gevent's patched ones) held by an attribute of ``client`` or of the redis-py objects it reaches."""
    seen: set[int] = set()
    pending: list[object] = [client]
    while pending:
        value = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if callable(getattr(value, "_at_fork_reinit", None)):
            yield value
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, _CONTAINERS):
            pending.extend(value)
        elif _is_redis_object(value):
            pending.extend(getattr(value, "__dict__", {}).values())


def locks_of(client: object) -> list[Any]:
    """The locks a forked child makes new for ``client`` (for tests and diagnostics)."""
    return list(_locks_of(client))


def _after_fork_in_child() -> None:
    # Only this thread exists now: no lock can be taken by anyone else while it is made new.
    for client in list(_CLIENTS):
        for lock in _locks_of(client):
            lock._at_fork_reinit()


os.register_at_fork(after_in_child=_after_fork_in_child)
# The codec socket.getaddrinfo looks up for a host name: imported and cached now, not by a thread at a fork.
"localhost".encode("idna")


class cached_property(Generic[T, R]):
    """``functools.cached_property`` without its lock (as on Python 3.12): the value is worked out on first
    use and kept in the instance; two threads may both work it out, and the last one is kept."""

    def __init__(self, func: Callable[[T], R]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type[T], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type[T] | None = None) -> cached_property[T, R]: ...

    @overload
    def __get__(self, instance: T, owner: type[T] | None = None) -> R: ...

    def __get__(self, instance: T | None, owner: type[T] | None = None) -> cached_property[T, R] | R:
        if instance is None:
            return self
        value = self.func(instance)
        instance.__dict__[self.name] = value
        return value
