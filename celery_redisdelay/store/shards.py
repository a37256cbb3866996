"""Shards: ``redisdelay_shards`` call stores, one hash tag each, so a Redis Cluster spreads them.

A call lives in the shard its id hashes to (CRC-32 of the id, modulo the shard count). Calls that
must sit beside a named key (a unique or debounce key, a lock, a batch group) get an id chosen to
hash to that key's shard, so every script still touches one slot. The tags are picked so that shard
``i`` of ``n`` falls in the ``i``-th ``n``-th of the cluster's slot space: on a cluster whose slots are
split evenly in order (as ``redis-cli --cluster create`` does) the shards land on different masters.

Every tag ever configured is kept in a registry set; releasers and operations go over all of them,
so calls parked before the shard count changed are still released, found and acknowledged.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from ..errors import ConfigurationError, StoreUnavailableError
from .calls import LARGEST_STEP, CallStore, Entry, redis_errors, text
from .keys import Keyspace

T = TypeVar("T")

#: How long the list of retired shards is trusted before it is read again.
REGISTRY_TTL_SECONDS = 30.0
#: More shards than this would not spread any further over a cluster's 16384 slots in practice.
LARGEST_SHARD_COUNT = 1024


def shard_tags(prefix: str, count: int) -> list[str]:
    """The hash tags of ``count`` shards: the prefix itself for one, else ``prefix/j`` tags spread over the slots."""
    if count == 1:
        return [prefix]
    tags: list[str] = []
    candidate = 0
    for index in range(count):
        low = index * REDIS_CLUSTER_HASH_SLOTS // count
        high = (index + 1) * REDIS_CLUSTER_HASH_SLOTS // count
        while not low <= key_slot(f"{prefix}/{candidate}".encode()) < high:
            candidate += 1
        tags.append(f"{prefix}/{candidate}")
        candidate = 0
    return tags


def fresh_ids(count: int) -> list[str]:
    """``count`` random uuid4 strings, in the form of Celery's task ids (``str(uuid.uuid4())``), made from
    one read of the OS's randomness instead of one per id."""
    raw = bytearray(os.urandom(16 * count))
    for at in range(0, 16 * count, 16):
        raw[at + 6] = (raw[at + 6] & 0x0F) | 0x40  # version 4
        raw[at + 8] = (raw[at + 8] & 0x3F) | 0x80  # the RFC 4122 variant
    h = raw.hex()
    return [
        f"{h[a : a + 8]}-{h[a + 8 : a + 12]}-{h[a + 12 : a + 16]}-{h[a + 16 : a + 20]}-{h[a + 20 : a + 32]}"
        for a in range(0, 32 * count, 32)
    ]


def shard_of(name: str, count: int) -> int:
    """The shard of a call id or a key name."""
    return zlib.crc32(name.encode("utf-8", "surrogatepass")) % count


class ShardSet:
    """The call stores of one deployment: the configured shards, plus retired ones still holding calls."""

    def __init__(self, client: Any, prefix: str, count: int, wait_replicas: int = 0, wait_ms: int = 1000) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= LARGEST_SHARD_COUNT:
            raise ConfigurationError(
                f"redisdelay_shards must be an integer from 1 to {LARGEST_SHARD_COUNT}, not {count!r}"
            )
        self.client = client
        self.prefix = prefix
        self.count = count
        self.wait_replicas, self.wait_ms = wait_replicas, wait_ms
        self.stores = [self._store(tag) for tag in shard_tags(prefix, count)]
        self._registry = Keyspace(prefix).shard_registry
        self._retired: list[CallStore] = []
        self._retired_read = -REGISTRY_TTL_SECONDS
        self._registered = count == 1  # one shard is the unsharded layout: nothing to record

    def _store(self, tag: str) -> CallStore:
        return CallStore(self.client, Keyspace(self.prefix, tag), self.wait_replicas, self.wait_ms)

    # -- where things live -----------------------------------------------------------------------

    def home(self, call_id: str) -> CallStore:
        """The shard a call with this id is parked in."""
        self.register()
        return self.stores[shard_of(call_id, self.count)]

    def by_home(self, calls: Iterable[tuple[str, str]]) -> dict[str, tuple[CallStore, list[tuple[str, str]]]]:
        """Calls (id, delivery tag) grouped by their home shard, by its hash tag, in order: what the lease
        scripts take per shard (at most :data:`LARGEST_STEP` a script)."""
        grouped: dict[str, tuple[CallStore, list[tuple[str, str]]]] = {}
        for call in calls:
            store = self.home(call[0])
            grouped.setdefault(store.keys.tag, (store, []))[1].append(call)
        return grouped

    def for_name(self, name: str) -> CallStore:
        """The shard of a lock, a batch group or a unique/debounce key."""
        self.register()
        return self.stores[shard_of(name, self.count)]

    def new_ids(self, count: int, store: CallStore | None = None) -> list[str]:
        """``count`` fresh task ids (:func:`fresh_ids`); with ``store``, ones whose home is that shard."""
        if store is None or self.count == 1:
            return fresh_ids(count)
        wanted = self.stores.index(store)
        found: list[str] = []
        while len(found) < count:
            found.extend(
                call_id for call_id in fresh_ids(count * self.count) if shard_of(call_id, self.count) == wanted
            )
        return found[:count]

    def new_id(self, store: CallStore | None = None) -> str:
        """A fresh task id; with ``store``, one whose home is that shard."""
        return self.new_ids(1, store)[0]

    def pick(self, indexes: Sequence[int] | None = None) -> list[CallStore]:
        """The configured shards of these indexes (0 to ``count`` - 1), in order; all of them for None."""
        if indexes is None:
            return list(self.stores)
        wrong = [index for index in indexes if not 0 <= index < self.count]
        if wrong or not indexes:
            raise ConfigurationError(
                f"shard indexes must be 0 to {self.count - 1} (redisdelay_shards is {self.count}), not {list(indexes)}"
            )
        return [self.stores[index] for index in sorted(set(indexes))]

    # -- all shards ------------------------------------------------------------------------------

    def register(self) -> None:
        """Record the configured tags (with the unsharded one) so a later shard count still finds them.

        Once per process, before its first call is stored: whatever the count becomes later, the
        releasers of that count find the calls parked now.
        """
        if self._registered:
            return
        with redis_errors("record the shards"):
            self.client.sadd(self._registry, self.prefix, *(store.keys.tag for store in self.stores))
        self._registered = True

    def all(self) -> list[CallStore]:
        """The configured shards first, then retired ones that may still hold calls."""
        if time.monotonic() - self._retired_read >= REGISTRY_TTL_SECONDS:
            try:
                self.register()
                with redis_errors("read the shard registry"):
                    found: Any = self.client.smembers(self._registry)
            except StoreUnavailableError:
                return [*self.stores, *self._retired]  # what the store says then comes from its shards
            current = {store.keys.tag for store in self.stores}
            tags = sorted(text(tag) for tag in found if text(tag) not in current)
            known = {store.keys.tag: store for store in self._retired}
            self._retired = [known.get(tag) or self._store(tag) for tag in tags]
            self._retired_read = time.monotonic()
        return [*self.stores, *self._retired]

    def search(self, call_id: str) -> Iterator[CallStore]:
        """The shards to look for a call in: its home, then the others (calls parked under another count)."""
        home = self.home(call_id)
        yield home
        for store in self.all():
            if store is not home:
                yield store

    def first(self, call_id: str, action: Callable[[CallStore], T]) -> T:
        """``action`` on the call's home, then on the other shards until one gives a true result."""
        stores = self.search(call_id)
        result = action(next(stores))  # the home
        if result:
            return result  # the common case: the other shards are not even listed
        for store in stores:
            result = action(store)
            if result:
                break
        return result

    def find(self, call_id: str) -> Entry | None:
        """Where a call is (delayed, inflight or dead) with its metadata, on whichever shard holds it."""
        return self.first(call_id, lambda store: store.find(call_id))

    def total(self, parts: Sequence[dict[str, int]]) -> dict[str, int]:
        """Counts added up over shards."""
        summed: dict[str, int] = {}
        for part in parts:
            for key, value in part.items():
                summed[key] = summed.get(key, 0) + value
        return summed


#: One step on one shard: (ids done, ids found but refused).
Step = Callable[[CallStore, list[str]], tuple[list[str], list[str]]]


def chunks(ids: Sequence[str], size: int = LARGEST_STEP) -> list[list[str]]:
    return [list(ids[start : start + size]) for start in range(0, len(ids), size)]


def on_shards(shards: ShardSet, ids: Sequence[str], step: Step) -> tuple[list[str], list[str]]:
    """Run ``step`` over ``ids``: on each call's home shard, then the ids it did not find there on the
    other shards; every script call takes at most 1,000 ids. Returns (ids done, ids found but refused)."""
    unique = list(dict.fromkeys(ids))
    homes: dict[int, list[str]] = {}
    stores = shards.all()
    for call_id in unique:
        homes.setdefault(stores.index(shards.home(call_id)), []).append(call_id)
    done: list[str] = []
    refused: list[str] = []
    missing: dict[int, list[str]] = {}
    for index, home_ids in homes.items():
        for chunk in chunks(home_ids):
            did, left = step(stores[index], chunk)
            done += did
            refused += left
            seen = set(did) | set(left)
            missing[index] = missing.get(index, []) + [call_id for call_id in chunk if call_id not in seen]
    for index, lost in missing.items():
        for other, store in enumerate(stores):
            if other == index or not lost:
                continue
            found: set[str] = set()
            for chunk in chunks(lost):
                did, left = step(store, chunk)
                done += did
                refused += left
                found |= set(did) | set(left)
            lost = [call_id for call_id in lost if call_id not in found]
    return done, refused
