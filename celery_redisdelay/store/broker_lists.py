"""The broker's queue lists, where the broker is a Redis: the one structure read and written here that the store does
not own.

kombu's Redis transport keeps a queue in one list per priority step (``queue``, ``queue\\x06\\x163``, ... under
``global_keyprefix``): it ``LPUSH``-es a message and ``BRPOP``-s the next, so a list's oldest message is at index -1.
``operations/queues.py`` reads their lengths and oldest messages, ``operations/waiting.py`` (``adopt``) reads them a
step at a time and takes messages out, and the releaser's wire path pushes stored messages onto them. The lists are
reached through kombu's own connection pool (its TLS and Sentinel settings) but not its client: with
``global_keyprefix`` that one prefixes every key, and the list names here are whole already. Where the broker is the
store's Redis, the store's client reaches them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import redis

from .. import broker_redis
from .base import redis_errors

if TYPE_CHECKING:
    from .depot import Depot


class BrokerLists:
    """The broker's lists through ``client``: None when the broker is not a Redis (``transport`` names it then).
    ``in_store``: they are in the store's Redis (a script can take a message and park its call in one step)."""

    def __init__(self, client: Any, in_store: bool, transport: Any = "redis") -> None:
        self.client = client
        self.in_store = in_store
        self.transport = transport

    @property
    def redis(self) -> bool:
        """Whether the broker is a Redis, whose lists are read here."""
        return self.client is not None

    def length(self, key: str) -> int:
        return int(self.client.llen(key))

    def read(self, key: str, start: int, stop: int) -> list[bytes]:
        """The messages of a list from index ``start`` to ``stop`` (its head first), as bytes."""
        found: Any = self.client.lrange(key, start, stop)
        return list(found)

    def remove(self, key: str, message: bytes) -> None:
        """Take one copy of ``message`` out of a list."""
        self.client.lrem(key, 1, message)

    def lengths(self, keys: Sequence[str]) -> list[Any]:
        """Each list's length, in one pipeline; a key of another type answers with its error, not raised."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key)
        return list(pipe.execute(raise_on_error=False))

    def oldest(self, keys: Sequence[str]) -> list[Any]:
        """Each list's oldest message (``LRANGE key -1 -1``: a list of it, empty when the list emptied meanwhile), in
        one pipeline; errors are answered, not raised."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.lrange(key, -1, -1)
        return list(pipe.execute(raise_on_error=False))


@contextlib.contextmanager
def broker_lists(depot: Depot) -> Iterator[BrokerLists]:
    """The broker's lists of ``depot``'s app, for the time of the ``with``: through the store's client where the broker
    is the store's Redis, else through kombu's pool (a connection of it), else none (not a Redis broker)."""
    if depot.fast_release:
        yield BrokerLists(depot.client, True)
        return
    with depot.app.connection_for_write() as connection:
        if not broker_redis.is_redis_transport(connection):
            yield BrokerLists(None, False, connection.transport_cls)
            return
        with redis_errors("reach the broker"):
            yield BrokerLists(redis.Redis(connection_pool=connection.default_channel.client.connection_pool), False)


def push(connection_pool: Any, messages: Sequence[tuple[str, bytes]]) -> list[Any]:
    """``LPUSH`` each message onto its list, in one pipeline over kombu's ``connection_pool``; the replies, a refusal
    (say, the broker out of memory part-way through) answered as its error, not raised."""
    pipe = redis.Redis(connection_pool=connection_pool).pipeline(transaction=False)
    for key, message in messages:
        pipe.lpush(key, message)
    return list(pipe.execute(raise_on_error=False))
