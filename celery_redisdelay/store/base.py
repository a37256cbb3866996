"""What every part of the call store stands on: its client, keys and scripts, and one round trip to them.

:class:`~celery_redisdelay.store.calls.CallStore` is made of one class per Redis structure it changes (the delay
set, the in-flight set, the dead letters, pauses, batches, locks...), each a :class:`StoreBase`: this holds what
they share, the running of a script (:meth:`StoreBase._run`, which waits for replicas where asked and survives a
failover) and the helpers that turn redis-py's errors and replies into the store's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from redis.cluster import RedisCluster

from ..errors import NotReplicatedError, StoreUnavailableError
from .keys import Keyspace
from .scripts import Scripts

#: The most ids one bulk script call takes (scripts block Redis while they run).
LARGEST_STEP = 1000
#: What a command to Redis raises (redis-py's base error), for the layers above that tell Redis failing from their
#: own errors without reaching for redis-py: they reach Redis only through the store.
RedisError = redis.RedisError


@contextmanager
def redis_errors(action: str) -> Iterator[None]:
    """Turn redis-py's errors into :class:`StoreUnavailableError` naming what failed."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise StoreUnavailableError(f"celery-redisdelay could not {action}: Redis is unreachable ({exc})") from exc
    except redis.RedisError as exc:
        raise StoreUnavailableError(f"celery-redisdelay could not {action}: Redis refused it ({exc})") from exc


def server_ms(client: Any, key: str) -> int:
    """The clock of the server holding ``key``, in ms: the clock the scripts use for that key's shard."""
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        seconds, micros = client.time(target_nodes=node)
    else:
        seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def texts(values: Sequence[bytes | str]) -> list[str]:
    return [text(value) for value in values]


def which(call_ids: Sequence[str]) -> str:
    """The calls an action names in its error: ``call <id>`` for one."""
    return f"call {call_ids[0]}" if len(call_ids) == 1 else f"{len(call_ids)} calls"


def step_ids(call_ids: Sequence[str]) -> list[str]:
    """The ids of one bulk script call, checked: 1 to :data:`LARGEST_STEP`."""
    if not 1 <= len(call_ids) <= LARGEST_STEP:
        raise ValueError(f"a bulk script takes 1 to {LARGEST_STEP} ids, not {len(call_ids)}")
    return list(call_ids)


class StoreBase:
    """One shard's client, keys and scripts, and how a script is run there; each part of the store is one."""

    def __init__(self, client: redis.Redis, keys: Keyspace, wait_replicas: int = 0, wait_ms: int = 1000) -> None:
        self.client = client
        self.keys = keys
        self.wait_replicas = wait_replicas
        self.wait_ms = wait_ms
        self._scripts = Scripts(client, [key.encode() for key in keys.store_keys])

    @property
    def tag(self) -> str:
        """The store's hash tag: its name among the shards (``{tag}`` begins each of its keys)."""
        return self.keys.tag

    def _run(
        self,
        name: str,
        args: Sequence[Any],
        action: str,
        extra_keys: Sequence[str] = (),
        *,
        replicated: bool = False,
    ) -> Any:
        """Run a store script; with ``replicated`` (parks), wait for ``wait_replicas`` replicas to have it."""
        with redis_errors(action):
            try:
                return self._call(name, extra_keys, args, action, replicated)
            except redis.ResponseError as exc:
                if "READONLY" not in str(exc) or not hasattr(self.client, "connection_pool"):
                    raise
                # A failover made our server a replica. Redis 6.2 reports that inside a script as a
                # script error, so redis-py keeps the connection: drop the pool's connections (a
                # Sentinel pool then asks for the new master) and try once more. A replica refuses
                # the first write, so the failed attempt changed nothing.
                self.client.connection_pool.disconnect()
                return self._call(name, extra_keys, args, action, replicated)

    def _call(self, name: str, keys: Sequence[str], args: Sequence[Any], action: str, replicated: bool) -> Any:
        if not (replicated and self.wait_replicas):
            return self._scripts.run(name, keys, args)
        # WAIT counts the replicas that have this connection's writes: script and WAIT share a pipeline.
        pipe = self.client.pipeline(transaction=False)
        self._scripts.pipelined(name, keys, args, pipe)
        pipe.wait(self.wait_replicas, self.wait_ms)
        result, confirmed = pipe.execute()
        if int(confirmed) < self.wait_replicas:
            raise NotReplicatedError(
                f"celery-redisdelay could not {action} durably: {confirmed} of {self.wait_replicas} replicas "
                f"confirmed it within {self.wait_ms} ms (redisdelay_wait_replicas). It is stored on the master, "
                "and a failover now could lose it"
            )
        return result
