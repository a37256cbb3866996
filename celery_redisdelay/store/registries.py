"""The store's Redis structures, one class each: its key, what its scores or fields mean, and the reads and writes
the layers above need, typed.

The scripts change these structures (:mod:`.layout` lists the keys they receive); what reads them outside a script
(``operations/``, the releasers) goes through a registry here, so no key name and no Redis command is spelled out
above ``store/``. :class:`Registries` holds one of each for a shard (``store.registries``); the reads that span
several structures in one round trip are in :mod:`.census`. Each read is one command, or one pipeline of per-key
commands (a Redis Cluster takes them); errors are redis-py's, for the caller to name with :func:`.base.redis_errors`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import server_ms, text
from .connection import is_cluster
from .keys import Keyspace
from .limits import Limit
from .meta import CallMeta, decode_meta

#: Runs a sample of a large sorted set is read in, spread evenly over it (see :meth:`SortedSet.sample`).
SLICES = 20


class Registry:
    """One structure of a store: the client that reaches it and its key."""

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.key = key

    def server_ms(self) -> int:
        """The clock of the server holding this key, in ms since the epoch: the clock its scripts use."""
        return server_ms(self.client, self.key)


class SortedSet(Registry):
    """A sorted set of calls (or of groups), each member's score a time in ms by the server's clock."""

    def size(self) -> int:
        return int(self.client.zcard(self.key))

    def count(self, low: float | str, high: float | str) -> int:
        """How many members score between ``low`` and ``high`` (ZCOUNT's bounds: ``-inf``, ``(5``, ...)."""
        return int(self.client.zcount(self.key, low, high))

    def first(self) -> tuple[str, float] | None:
        """The member with the lowest score and its score; None when the set is empty."""
        found: Any = self.client.zrange(self.key, 0, 0, withscores=True)
        return (text(found[0][0]), float(found[0][1])) if found else None

    def scores(self, members: Sequence[str]) -> list[float | None]:
        """The score of each member (None: not in the set), in one ZMSCORE."""
        found: Any = self.client.zmscore(self.key, list(members))
        return list(found)

    def sample(self, size: int, wanted: int) -> list[bytes]:
        """About ``wanted`` members of the set (of ``size``): all of them when it holds no more, else
        :data:`SLICES` runs spread evenly over it, in one pipeline; as stored (a lex-ordered set's member holds
        more than the id)."""
        if size <= wanted:
            found: Any = self.client.zrange(self.key, 0, -1)
            return list(found)
        pipe = self.client.pipeline(transaction=False)
        for start, stop in spread(size, wanted):
            pipe.zrange(self.key, start, stop)
        return [member for run in pipe.execute() for member in run]


def spread(size: int, wanted: int) -> list[tuple[int, int]]:
    """The ranks (start, stop) of the runs a sample of about ``wanted`` members of a set of ``size`` (larger) reads:
    ``min(SLICES, wanted)`` runs spread evenly from its first member to its last."""
    runs = min(SLICES, wanted)
    run = max(1, wanted // runs)
    starts = [index * (size - run) // max(1, runs - 1) for index in range(runs)]
    return [(start, start + run - 1) for start in starts]


class DelaySet(SortedSet):
    """The delay set (``{tag}:delayed``): the parked calls, id -> due time (ms)."""

    def due_counts(self, now_ms: int, windows: Sequence[tuple[int, int | None]]) -> list[int]:
        """Calls already due at ``now_ms``, then in each window (ms from now, after its start and up to its end; an
        end of None: no end), in one pipeline."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcount(self.key, "-inf", now_ms)
        for start, end in windows:
            pipe.zcount(self.key, f"({now_ms + start}", "+inf" if end is None else now_ms + end)
        return [int(found) for found in pipe.execute()]

    def first_and_clock(self) -> tuple[tuple[str, float] | None, int]:
        """The first call due (id, due ms; None: none parked) and the server's clock (ms), in one round trip where
        the server allows (a cluster pipeline refuses TIME: two there)."""
        if is_cluster(self.client):
            return self.first(), self.server_ms()
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(self.key, 0, 0, withscores=True)
        pipe.time()
        first, (seconds, micros) = pipe.execute()
        return (text(first[0][0]), float(first[0][1])) if first else None, int(seconds) * 1000 + int(micros) // 1000


class InFlightSet(SortedSet):
    """The calls in flight (``{tag}:inflight``): id -> deadline (ms), when the sweep delivers it again."""


class DeadSet(SortedSet):
    """The dead letters (``{tag}:dead``): id -> when the call was dead-lettered (ms)."""

    def count_until(self, before_ms: int | None = None) -> int:
        """How many calls are dead-lettered (with ``before_ms``, at or before then)."""
        return self.count("-inf", "+inf" if before_ms is None else before_ms)


class LexSet(SortedSet):
    """A lex-ordered set (every score 0) whose members begin with a name and a separator: the calls waiting in their
    gates (``gated``: gate NUL due NUL id), on a pause (``paused``: target NUL due NUL id), the slot holders of
    earlier releases (``slots``: limit instance NUL id). Counted by name with ZLEXCOUNT (:mod:`.census`)."""


class Gates(SortedSet):
    """The gates with calls waiting on their limits (``{tag}:gates``): gate -> when its first waiting call may be
    looked at again (ms)."""

    def firsts(self, most: int) -> list[tuple[bytes, float]]:
        """Up to ``most`` gates, the soonest first, each with its score; the gate as stored (its limit instances,
        one per line)."""
        found: Any = self.client.zrange(self.key, 0, most - 1, withscores=True)
        return [(gate, float(score)) for gate, score in found]


class Metadata(Registry):
    """The calls' metadata (``{tag}:meta``): id -> a small JSON object, whose fields :mod:`.meta` lists."""

    def get(self, call_id: str) -> CallMeta:
        """A call's metadata (empty when missing or damaged)."""
        raw: Any = self.client.hget(self.key, call_id)
        return decode_meta(raw)

    def raw(self, call_ids: Sequence[str]) -> list[bytes | None]:
        """The stored metadata of each call, as stored (None: none), in one HMGET; nothing is asked for no ids."""
        found: Any = self.client.hmget(self.key, list(call_ids)) if call_ids else []
        return list(found)


class Payloads(Registry):
    """The calls' payloads (``{tag}:payloads``): id -> the stored message (or a batch stub)."""

    def raw(self, call_ids: Sequence[str]) -> list[bytes | None]:
        """The payload of each call (None: none), in one HMGET; nothing is asked for no ids."""
        found: Any = self.client.hmget(self.key, list(call_ids)) if call_ids else []
        return list(found)


class Counters(Registry):
    """The running totals (``{tag}:counters``): field -> count, kept by the scripts in the step they count (the
    totals of ``operations/metrics.py``, the lateness buckets ``late_le_<ms>``, ``limit_released:<limit>``), and
    ``batch_items`` and ``lock_lines``."""

    def all(self) -> dict[str, int]:
        found: Any = self.client.hgetall(self.key)
        return {text(name): int(value) for name, value in found.items()}


def limit_released(name: str) -> str:
    """The counter of the calls a limit let go."""
    return f"limit_released:{name}"


class HistoryCounts(Registry):
    """The totals per minute of the last day (``{tag}:history``): ``<minute>:<name>`` -> count (the minute: ms since
    the epoch // 60000, by the Redis clock), and ``released_at``, when a releaser last ran (ms)."""

    def released_at(self) -> int | None:
        found: Any = self.client.hget(self.key, "released_at")
        return None if found is None else int(found)

    def counts(self, fields: Sequence[str]) -> list[int | None]:
        """The count of each field (None: none kept), in one HMGET."""
        found: Any = self.client.hmget(self.key, list(fields))
        return [None if value is None else int(value) for value in found]


class Workers(Registry):
    """The workers holding leases on calls here (``{tag}:workers``): worker -> ``{"n": calls held, "at": when it
    last renewed them (ms)}`` (see lease.lua)."""

    def leases(self) -> dict[str, tuple[int, int]]:
        """Each worker's (calls held, last renewal in ms); a record that cannot be read is left out (the next
        renewal forgets it)."""
        found: Any = self.client.hgetall(self.key)
        leases: dict[str, tuple[int, int]] = {}
        for worker, raw in found.items():
            try:
                seen = json.loads(raw)
                leases[text(worker)] = (int(seen["n"]), int(seen["at"]))
            except (ValueError, TypeError, KeyError):
                continue
        return leases


@dataclass(frozen=True)
class LimitRecord:
    """One field of the limits hash: ``code`` (as a park wrote the code's) or ``set`` (by an operator), the limit's
    name, and the limit (None: damaged, which the scripts read as no limit)."""

    kind: str
    name: str
    limit: Limit | None


class LimitTable(Registry):
    """The limits (``{tag}:limits``): ``code:<limit>`` as the code declares it, ``set:<limit>`` as an operator set
    it, each :meth:`~.limits.Limit.to_json`."""

    def records(self) -> list[LimitRecord]:
        found: Any = self.client.hgetall(self.key)
        records = []
        for field, raw in found.items():
            kind, _, name = text(field).partition(":")
            try:
                limit: Limit | None = Limit.from_json(raw)
            except (ValueError, TypeError, KeyError, AttributeError):
                limit = None
            records.append(LimitRecord(kind, name, limit))
        return records

    def set(self, name: str, limit: Limit | None) -> None:
        """Set an operator's limit over the code's; None resets it to the code's."""
        if limit is None:
            self.client.hdel(self.key, f"set:{name}")
        else:
            self.client.hset(self.key, f"set:{name}", limit.to_json())


class Held(Registry):
    """The concurrency slots held by calls in flight (``{tag}:held``): limit instance -> slots, and ``NUL <limit>``
    -> the same over the limit's instances."""

    @staticmethod
    def of_limit(name: str) -> str:
        """The field of a limit's slots over all its instances."""
        return f"\0{name}"


class Pauses(Registry):
    """The pauses (``{tag}:pauses``): ``task:<name>`` or ``queue:<name>`` -> the pause's record (JSON, written by
    pause.lua; :func:`.pauses.decode_pause` reads one). The calls waiting on them are in the paused set."""

    def records_and_clock(self) -> tuple[int, dict[Any, Any]]:
        """This server's time (ms) and the hash as it is, in one round trip (two on a cluster, whose pipeline refuses
        TIME: it goes to the key's node)."""
        if is_cluster(self.client):
            found: Any = self.client.hgetall(self.key)
            return self.server_ms(), found
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.key)
        pipe.time()
        records, (seconds, micros) = pipe.execute()
        return int(seconds) * 1000 + int(micros) // 1000, records


@dataclass(frozen=True)
class LockState:
    """A lock as it stands: ms until it expires (-1 held without expiry, -2 free), the calls deferred behind it, and
    when the call asked about first found it busy (ms; None: it does not wait)."""

    expires_ms: int
    waiters: int
    waiting_since: float | None


class Locks:
    """The locks of a store: per lock, its key (the holder's token, with a TTL) and its waiters (``lock-waiters``:
    id -> when the call first found it busy)."""

    def __init__(self, client: Any, keys: Keyspace) -> None:
        self.client = client
        self.keys = keys

    def state(self, name: str, call_id: str) -> LockState:
        """Lock ``name`` and whether ``call_id`` waits behind it, in one pipeline."""
        pipe = self.client.pipeline(transaction=False)
        pipe.pttl(self.keys.lock(name))
        pipe.zcard(self.keys.lock_waiters(name))
        pipe.zscore(self.keys.lock_waiters(name), call_id)
        expires_ms, waiters, waiting_since = pipe.execute()
        return LockState(int(expires_ms), int(waiters), waiting_since)


class Wake(Registry):
    """The precise releasers' markers (``{tag}:wake``): a call parked earlier than every other (wake.lua), or a
    releaser being stopped."""

    def wait(self, timeout: float) -> None:
        """Block until a marker comes (taking it) or ``timeout`` seconds pass."""
        self.client.bzpopmin([self.key], timeout=timeout)

    def mark(self, member: str) -> None:
        """Add a marker: one releaser blocked in :meth:`wait` wakes."""
        self.client.zadd(self.key, {member: 0})


class Registries:
    """One shard's structures, each a registry over ``client`` (the store's, or a connection of a releaser's own)."""

    def __init__(self, client: Any, keys: Keyspace) -> None:
        self.client = client
        self.keys = keys
        self.delayed = DelaySet(client, keys.delayed)
        self.inflight = InFlightSet(client, keys.inflight)
        self.dead = DeadSet(client, keys.dead)
        self.gated = LexSet(client, keys.gated)
        self.paused = LexSet(client, keys.paused)
        self.pauses = Pauses(client, keys.pauses)
        self.slots = LexSet(client, keys.slots)
        self.gates = Gates(client, keys.gates)
        self.batches = SortedSet(client, keys.batches)
        self.meta = Metadata(client, keys.meta)
        self.payloads = Payloads(client, keys.payloads)
        self.counters = Counters(client, keys.counters)
        self.history = HistoryCounts(client, keys.history)
        self.workers = Workers(client, keys.workers)
        self.limits = LimitTable(client, keys.limits)
        self.held = Held(client, keys.held)
        self.locks = Locks(client, keys)
        self.wake = Wake(client, keys.wake)

    def on(self, client: Any) -> Registries:
        """The same structures reached through another client (a releaser's own connection)."""
        return Registries(client, self.keys)

    def list_of(self, state: str) -> SortedSet:
        """The set of one list of calls (``store.reading.LISTS``): the calls held by their limits wait in the gated
        set, those set aside on a pause in the paused set."""
        lists: dict[str, SortedSet] = {
            "delayed": self.delayed,
            "limited": self.gated,
            "paused": self.paused,
            "inflight": self.inflight,
            "dead": self.dead,
        }
        return lists[state]

    def heartbeat_key(self, worker: str) -> str:
        """The key of a worker's heartbeat, as an operator is told where it was looked for (``worker/probe.py``
        reads and writes it)."""
        return self.keys.probe(worker)

    def time_ms(self) -> int:
        """The server's clock (ms), asked with a plain TIME (on a cluster, of the node redis-py picks)."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000
