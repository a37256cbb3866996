"""The producer's own record of what Redis told it was stored, kept outside the Redis under test.

Every park the runner makes (``apply_async`` of a message, or ``add`` of a batch item) is written, the
moment it returned, as a JSON line to a file of the run: the call id, the message number, what kind of
park it was, and the wall clock. After a SIGKILL of the store (or a failover), :meth:`Ledger.lost`
looks for every call acknowledged before the fault in the store and in the validation's record of
processed messages: a call in neither was acknowledged to the producer and is gone. What Redis itself may
lose in such a kill is :data:`chaos.harness.attribution.FSYNC_BOUND_SECONDS` of acknowledged writes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from celery_redisdelay.store.calls import CallStore
from celery_redisdelay.store.shards import shard_of

from .harness.attribution import FSYNC_BOUND_SECONDS as FSYNC_BOUND_SECONDS  # where the tests read it
from .harness.attribution import within_bound

CHUNK = 1000
CALL, UNIQUE, DEBOUNCE, LOCKED, ITEM = "call", "unique", "debounce", "locked", "item"


@dataclass(frozen=True)
class Entry:
    """One acknowledged park."""

    id: str  # the call id; for a batch item, the id of the batch call it completed, or ""
    n: int  # the message number
    kind: str
    t: float  # wall clock when the park returned
    due: float | None = None  # wall clock it was due, when the producer chose it (eta)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Ledger:
    """An append-only file of acknowledged parks, and the same in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[Entry] = []
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, call_id: str, number: int, kind: str, due: float | None = None) -> Entry:
        entry = Entry(call_id, number, kind, round(time.time(), 4), due)
        line = (json.dumps(entry.as_dict(), separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
            self.entries.append(entry)
        return entry

    def close(self) -> None:
        os.close(self._fd)

    def calls_before(self, wall: float) -> list[Entry]:
        """The parks of calls (batch items aside) acknowledged at or before ``wall``, one per call id."""
        with self._lock:
            entries = list(self.entries)
        latest: dict[str, Entry] = {}
        for entry in entries:
            if entry.t <= wall and entry.kind != ITEM:
                latest[entry.id] = entry  # a debounced call's last park
        return list(latest.values())

    def ready(self) -> dict[str, float]:
        """When each call could first run: its due time when the producer chose one, else its park."""
        return {entry.id: entry.due if entry.due is not None else entry.t for entry in self.calls_before(float("inf"))}

    def dues(self) -> dict[str, float]:
        return {entry.id: entry.due for entry in self.calls_before(float("inf")) if entry.due is not None}

    def by_number(self) -> dict[int, Entry]:
        with self._lock:
            return {entry.n: entry for entry in self.entries}

    def lost(self, client: redis.Redis, stores: list[CallStore], processed_key: str, before: float) -> list[Entry]:
        """Calls acknowledged at or before ``before`` that are neither in the store nor processed.

        The store is read first: a call acknowledged by a worker between the two reads was recorded as
        processed before its acknowledgement, so it is found the second time.
        """
        candidates = self.calls_before(before)
        absent = [
            entry for entry, found in zip(candidates, _stored(client, stores, candidates), strict=True) if not found
        ]
        processed = _processed(client, processed_key, [entry.n for entry in absent])
        return [entry for entry, done in zip(absent, processed, strict=True) if not done]


def _stored(client: redis.Redis, stores: list[CallStore], entries: list[Entry]) -> list[bool]:
    """Whether each call has a payload in its home shard (parked, in flight or dead-lettered)."""
    found: list[bool] = []
    for start in range(0, len(entries), CHUNK):
        pipe = client.pipeline(transaction=False)
        for entry in entries[start : start + CHUNK]:
            pipe.hexists(stores[shard_of(entry.id, len(stores))].keys.payloads, entry.id)
        found.extend(bool(value) for value in pipe.execute())
    return found


def _processed(client: redis.Redis, processed_key: str, numbers: Iterable[int]) -> list[bool]:
    numbers = list(numbers)
    found: list[bool] = []
    for start in range(0, len(numbers), CHUNK):
        pipe = client.pipeline(transaction=False)
        for number in numbers[start : start + CHUNK]:
            pipe.hexists(processed_key, number)
        found.extend(bool(value) for value in pipe.execute())
    return found


def exposure(entries: list[Entry], kill_wall: float) -> int:
    """How many of ``entries`` were acknowledged within the bound before the kill: what it could lose."""
    return sum(within_bound(entry.t, kill_wall) for entry in entries)
