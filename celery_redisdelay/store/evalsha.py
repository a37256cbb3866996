"""A store script's EVALSHA written straight on a connection of the client's pool.

A park is one script call, and redis-py's layers around a call (``Script.__call__``, ``execute_command``
with its retry wrapper and telemetry, ``pack_command`` of every argument, the response callbacks) cost
about as much as the round trip itself: ``python -m bench --only park_single`` prints both. Here the
command's head (``EVALSHA``, the script's sha) and the store's own keys are packed once, each call packs
only its own keys and arguments, as redis-py's encoder encodes them, and the command goes out on a
connection of the client's own pool kept for the thread (:class:`Connections`), its reply read by that
connection's parser (errors raised as redis-py raises them).

What this does not handle goes through redis-py: a NOSCRIPT reply (redis-py loads the script and runs it
again), a connection that fails (redis-py's path makes the call again under the client's retry policy:
a call's first attempt is the only one made here), a client pinned to one connection, one with
client-side caching, a cluster client, a pipeline (the store's ``wait_replicas``).
``tests/test_evalsha.py`` proves the bytes sent equal to redis-py's ``pack_command`` of the same call,
and each of those ways through.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import os
import threading
from collections.abc import Sequence
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


def direct_pool(client: Any) -> Any | None:
    """The connection pool a script may be run on directly, or None when the client needs redis-py's
    path: a cluster client (no pool), a client pinned to one connection, client-side caching."""
    if not isinstance(client, redis.Redis) or getattr(client, "connection", None) is not None:
        return None
    pool = getattr(client, "connection_pool", None)
    if pool is None or getattr(pool, "cache", None) is not None:
        return None
    return pool


#: The connections of threads that ended, waiting to go back to their pool. A lease's finalizer runs wherever the
#: garbage collector runs it, possibly in a thread that holds that very pool's lock (inside ``get_connection``), and
#: redis-py 5's lock is not reentrant: giving the connection back there hung the thread and then every other one.
#: The finalizer only notes it; the next :meth:`Connections.get`, in any thread, gives it back.
#: Each with the process that noted it: a forked child inherits the deque, and its parent's connections are not its own.
_ENDED: collections.deque[tuple[int, Any, Any]] = collections.deque()


def give_back_ended() -> None:
    """Give the connections of ended threads back to their pools (outside any pool's lock)."""
    while _ENDED:
        try:
            pid, pool, connection = _ENDED.popleft()
        except IndexError:  # another thread took the last one
            return
        if pid != os.getpid():
            continue
        with contextlib.suppress(Exception):  # at interpreter exit the pool may be gone already
            pool.release(connection)


class _Lease:
    """A connection taken from a pool for one thread; given back once the thread has ended (its locals go)."""

    def __init__(self, pool: Any, connection: Any) -> None:
        self.pool, self.connection, self.pid = pool, connection, os.getpid()

    def __del__(self) -> None:
        if self.pid == os.getpid():  # a copy in a forked child holds its parent's socket: leave it
            _ENDED.append((self.pid, self.pool, self.connection))


class Connections:
    """One connection of ``pool`` per thread (and per process), kept between calls, as redis-py's
    ``single_connection_client`` keeps one: taking one from the pool and giving it back costs more than a
    park's round trip on redis-py 8 (a lock, a poll of the socket, telemetry). A connection that fails is
    disconnected by redis-py and connects again when next used; ``pool.disconnect()`` (a failover, or
    the client closed) reaches it too, since the pool counts it in use."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._local = threading.local()
        # redis-py 5.0 asks which command a connection is for; later versions warn when told.
        first = next(iter(inspect.signature(pool.get_connection).parameters.values()), None)
        asks = first is not None and first.default is inspect.Parameter.empty
        self._args: tuple[str, ...] = ("EVALSHA",) if asks else ()

    def get(self) -> Any:
        if _ENDED:
            give_back_ended()
        lease: _Lease | None = getattr(self._local, "lease", None)
        if lease is None or lease.pid != os.getpid():
            lease = self._local.lease = _Lease(self.pool, self.pool.get_connection(*self._args))
        connection = lease.connection
        if connection._sock is None:
            # Disconnected (a failed call, a failover): connect as the pool's get_connection does, by the
            # connection's own connect(). Sending would connect too, but redis-py 8 then skips a subclass's
            # connect(): a Sentinel-managed connection would go back to the old master, now a replica.
            connection.connect()
        return connection


class DirectScript:
    """``script(keys=[*fixed_keys, *keys], args=args)`` packed by hand and sent on one of ``connections``
    (:func:`direct_pool` says whether the script's client allows it)."""

    def __init__(self, script: Script, connections: Connections, fixed_keys: Sequence[bytes]) -> None:
        self.script = script
        self.connections = connections
        self.encode = connections.pool.get_encoder().encode
        self.head = bulk(b"EVALSHA") + bulk(script.sha.encode())
        self.fixed_keys = list(fixed_keys)
        self.packed_keys = b"".join(bulk(key) for key in fixed_keys)

    def pack(self, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
        """The command as RESP: what redis-py's ``pack_command`` sends for the same call, joined."""
        encode = self.encode
        count = len(self.fixed_keys) + len(keys)
        parts = [b"*%d\r\n" % (3 + count + len(args)), self.head, bulk(b"%d" % count), self.packed_keys]
        parts += [bulk(encode(value)) for value in keys]
        parts += [bulk(encode(value)) for value in args]
        return b"".join(parts)

    def __call__(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        packed = [self.pack(keys, args)]
        connection = self.connections.get()
        try:
            connection.send_packed_command(packed)
            return connection.read_response()
        except NoScriptError:
            pass  # flushed, or a server that never saw it (a restart, a failover): redis-py loads it
        except (redis.ConnectionError, redis.TimeoutError):
            # redis-py has disconnected it (it connects again when next used). A connection the server
            # closed while it sat idle fails like this: redis-py's own path, with the client's retry
            # policy, makes the call again on a connection from the pool, or raises what it raises.
            pass
        finally:
            if getattr(connection, "should_reconnect", None) is not None and connection.should_reconnect():
                connection.disconnect()  # a maintenance notice (redis-py 6+): connect again when next used
        return self.script(keys=[*self.fixed_keys, *keys], args=list(args))
