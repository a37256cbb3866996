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

* **OpenSSL's own locks**: a child forked while another thread was setting up a TLS connection (making its
  ``SSLContext``, loading the CA file, the handshake) can find a lock inside OpenSSL held, and its own first TLS
  connection then waits forever in ``SSLContext()`` (seen in CI: a worker's pool processes forked while its lease
  thread connected to a ``rediss://`` store took no task; reproduced, about one child in a hundred). Python cannot
  make those locks new. The connections of every client registered here set up TLS inside a gate instead, which
  a fork waits to find empty (at most :data:`FORK_WAIT_SECONDS`) and keeps shut until it is done.
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
import contextlib
import functools
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, overload

from redis.connection import SSLConnection

T = TypeVar("T")
R = TypeVar("R")

_CLIENTS: weakref.WeakSet[Any] = weakref.WeakSet()
_CONTAINERS = (list, tuple, set, frozenset, collections.deque)


#: How long a fork waits for TLS set-ups under way in other threads to end (a handshake is bounded by the socket
#: timeouts); past it the fork goes ahead, as it would without the gate.
FORK_WAIT_SECONDS = 15.0


def fork_safe(client: T) -> T:
    """Register a redis-py client (``Redis``, ``RedisCluster``, Sentinel's master) so that a forked child
    gets its locks new and free, and set its TLS connections up inside the fork gate; returns it."""
    _hook()
    _CLIENTS.add(client)
    _gate_tls(client)
    return client


class _ForkGate:
    """Counts the TLS set-ups under way; a fork waits until there are none and lets no new one begin until it
    is done (:func:`os.register_at_fork`'s ``before`` and ``after`` hooks)."""

    def __init__(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._inside = 0
        self._held = False

    @contextlib.contextmanager
    def setting_up(self) -> Iterator[None]:
        with self._condition:
            self._inside += 1
        try:
            yield
        finally:
            with self._condition:
                self._inside -= 1
                self._condition.notify_all()

    def before_fork(self) -> None:
        self._held = self._condition.acquire(timeout=FORK_WAIT_SECONDS)
        deadline = time.monotonic() + FORK_WAIT_SECONDS
        while self._held and self._inside and (left := deadline - time.monotonic()) > 0:
            self._condition.wait(left)

    def after_in_parent(self) -> None:
        if self._held:
            self._held = False
            self._condition.release()

    def after_in_child(self) -> None:
        self.__init__()  # type: ignore[misc]  # the parent's threads are gone, and so are their set-ups


GATE = _ForkGate()


class _GatedTLS:
    """Mixed into a client's SSL connection class: the connection (its ``SSLContext``, CA file, handshake) is set
    up inside the fork gate."""

    def _connect(self) -> Any:
        with GATE.setting_up():
            return super()._connect()  # type: ignore[misc]


_GATED: dict[type, type] = {}


def _gated(cls: type) -> type:
    if issubclass(cls, _GatedTLS):
        return cls
    made = _GATED.get(cls)
    if made is None:
        made = _GATED[cls] = type(cls.__name__, (_GatedTLS, cls), {"__module__": cls.__module__})
    return made


def _gate_tls(client: object) -> None:
    """Make the SSL connections ``client`` has or will make set up TLS inside the fork gate: its pools' connection
    class (a cluster's node manager keeps it among the keyword arguments of the nodes it makes), and the
    connections made already."""
    for value in _redis_objects(client):
        if isinstance(value, SSLConnection):
            value.__class__ = _gated(type(value))
        made = value.__dict__.get("connection_class") if hasattr(value, "__dict__") else None
        if isinstance(made, type) and issubclass(made, SSLConnection):
            value.connection_class = _gated(made)
        kwargs = getattr(value, "connection_kwargs", None)
        made = kwargs.get("connection_class") if isinstance(kwargs, dict) else None
        if isinstance(made, type) and issubclass(made, SSLConnection):
            kwargs["connection_class"] = _gated(made)  # type: ignore[index]


def _is_redis_object(value: object) -> bool:
    """redis-py's own objects (clients, pools, connections, a cluster's nodes) and the queue a blocking
    pool keeps its connections in: what a walk from a client descends into."""
    module = type(value).__module__ or ""
    return module == "redis" or module.startswith("redis.") or isinstance(value, queue.Queue)


def _locks_of(client: object) -> Iterator[Any]:
    """Every lock (anything with CPython's ``_at_fork_reinit``: locks, RLocks, conditions, events, and
    gevent's patched ones) held by an attribute of ``client`` or of the redis-py objects it reaches."""
    return (value for value in _redis_objects(client) if callable(getattr(value, "_at_fork_reinit", None)))


def _redis_objects(client: object) -> Iterator[Any]:
    """``client``, the redis-py objects it reaches and what they hold (a walk that stops at locks)."""
    seen: set[int] = set()
    pending: list[object] = [client]
    while pending:
        value = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        yield value
        if callable(getattr(value, "_at_fork_reinit", None)):
            continue
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, _CONTAINERS):
            pending.extend(value)
        elif _is_redis_object(value):
            pending.extend(getattr(value, "__dict__", {}).values())


def locks_of(client: object) -> list[Any]:
    """The locks a forked child makes new for ``client`` (for tests and diagnostics)."""
    return list(_locks_of(client))


def _reinit_locks() -> None:
    # Only this thread exists now: no lock can be taken by anyone else while it is made new.
    for client in list(_CLIENTS):
        for lock in _locks_of(client):
            lock._at_fork_reinit()


def _after_fork_in_child() -> None:
    GATE.after_in_child()
    _reinit_locks()


@functools.cache
def _hook() -> None:
    """Hook the process's forks, once, when the first client is registered (not when the module is imported)."""
    os.register_at_fork(
        before=GATE.before_fork, after_in_parent=GATE.after_in_parent, after_in_child=_after_fork_in_child
    )


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
