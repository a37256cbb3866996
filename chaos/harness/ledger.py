"""The ledger both chaos runs keep: what the producer was told was stored, the runs the workers made, the
messages they received; its records, how they are written, and how they are read back.

Every record is a JSON object, written the moment what it records happened, somewhere the faults of the run
cannot reach. Two backends, for two reasons that stand:

* :class:`FileLedger` and :class:`EventLog`, the validation's (``python -m chaos``): it SIGKILLs the store's
  Redis (and with ``--sentinel`` fails it over), and its losses are found by comparing the producer's record
  with what that Redis kept, so the record lives outside any Redis of the run: an append-only file of the
  runner (one :class:`Entry` per acknowledged park, kept in memory too, read mid-run after every kill), and a file
  per worker process of the starts and ends of its runs (:func:`read_events`);
* :class:`RedisLedger`, the battle's (``python -m chaos --battle``): a redis-server of its own that no fault
  touches, written by the producer (its sends, buffered, and cancels) and by every worker process (the start and
  end of every run, what it received, when it was ready), read by the runner while it drains (how many units
  ran) and once at the end (:meth:`RedisLedger.read`).

The records:

* a park or a send (what the producer was told was stored): the validation's :class:`Entry` (call id, message
  number, kind, wall clock, due time); the battle's :func:`send_record` per unit (kind, due time, wall clock,
  call id, path, sent again);
* a run: the validation's start and end events (:class:`EventLog`: call id, message numbers, state, pid, process
  group); the battle's :func:`start_record` and :func:`end_record` (unit, worker, pid, delivery tag, redelivered,
  the due time its message carried);
* a receipt (the battle's, :func:`receipt_record`: a message a worker received, before its run); the validation
  reads its workers' logs for those.

What each run judges from its ledger stays with it (``chaos/outcome.py``, ``chaos/analysis.py``,
``chaos/battle/analysis.py``).
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from celery_redisdelay.store.calls import CallStore
from celery_redisdelay.store.shards import shard_of

from .attribution import within_bound

#: Redis commands batched into one round trip, and a ledger's hash written per command.
CHUNK = 1000


def dumps(record: dict[str, Any]) -> str:
    """A record as the ledger keeps it: compact JSON."""
    return json.dumps(record, separators=(",", ":"))


def _line(record: dict[str, Any]) -> bytes:
    return (dumps(record) + "\n").encode()


# -- the validation's: the producer's record of its parks, a file of the runner -----------------------

#: The kinds of park: a plain call, a unique or debounced one (keyed), one under a lock, a batch item.
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


class FileLedger:
    """An append-only file of acknowledged parks, and the same in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[Entry] = []
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, call_id: str, number: int, kind: str, due: float | None = None) -> Entry:
        entry = Entry(call_id, number, kind, round(time.time(), 4), due)
        line = _line(entry.as_dict())
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


# -- the validation's: the runs, a file per worker process ---------------------------------------------

EVENTS = "events-*.jsonl"


class EventLog:
    """Appends JSON lines to ``events-<pid>.jsonl`` in ``directory``; opened lazily in each process."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._pid = 0

    def write(self, **event: Any) -> None:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:  # a forked pool child gets a file of its own
            path = os.path.join(self.directory, f"events-{pid}.jsonl")
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._pid = pid
        event.update(t=round(time.time(), 4), pid=pid, pg=os.getpgid(0))
        os.write(self._fd, _line(event))


def read_events(directory: Path) -> Iterator[list[dict[str, Any]]]:
    """The events of each worker process's file in ``directory``, in the order it wrote them (a line cut by a
    SIGKILL left out); the files in the order of their names."""
    for path in sorted(directory.glob(EVENTS)):
        events = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a SIGKILL
        yield events


# -- the battle's: a redis-server no fault touches ------------------------------------------------------

#: The battle's keys: sends (hash unit -> JSON), starts and ends of runs (lists of JSON), cancels (hash).
SENT = "sent"
STARTS = "starts"
ENDS = "ends"
CANCELS = "cancels"
RECEIVED = "received"  # list: messages a worker received (prefetched), before their run
DONE = "done"  # set: the units that ended at least once
READY = "ready"  # hash: worker hostname -> wall clock it was ready


def send_record(kind: str, due: float, at: float, call_id: str, path: str, *, again: bool = False) -> dict[str, Any]:
    """A unit's send: its kind, due time, when it was acknowledged, its call id, its path; ``again``: the producer
    sent it again after an error."""
    record: dict[str, Any] = {"k": kind, "d": due, "t": at, "id": call_id, "c": path}
    if again:
        record["r"] = 1
    return record


def start_record(request: Any, unit: str, began: float, due: float | None = None) -> dict[str, Any]:
    """A run's start: its unit, when, its worker and process; ``due``: the due time its own message carried."""
    record = {"u": unit, "t": round(began, 4), "w": str(request.hostname), "p": os.getpid()}
    if due is not None:
        record["d"] = due
    return record


def end_record(request: Any, unit: str, began: float, due: float | None = None) -> dict[str, Any]:
    """A run's end: its unit, its start and end, its worker and process, its delivery (tag, redelivered)."""
    return {
        **({} if due is None else {"d": due}),
        "u": unit,
        "s": round(began, 4),
        "e": round(time.time(), 4),
        "w": str(request.hostname),
        "p": os.getpid(),
        "tag": str(getattr(request, "delivery_tag", None) or ""),
        "rd": bool((request.delivery_info or {}).get("redelivered")),
    }


def receipt_record(unit: str, moment: float, hostname: str) -> str:
    """A message a worker received, before its run (JSON with spaces, as the battle has always written it)."""
    return json.dumps({"u": unit, "t": moment, "w": hostname})


class RedisLedger:
    """The battle's ledger on its own redis-server: the producer's and the workers' writes, the runner's reads."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._pending: list[tuple[str, str]] = []  # sends not yet written
        self._pending_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisLedger:
        return cls(redis.Redis.from_url(url, **options))

    def close(self) -> None:
        self.client.close()

    # -- the producer's writes ------------------------------------------------------------------------

    def send(self, unit: str, record: dict[str, Any]) -> None:
        """A send acknowledged to the producer, written at the next :meth:`flush`."""
        with self._pending_lock:
            self._pending.append((unit, dumps(record)))

    def flush(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        for start in range(0, len(pending), CHUNK):
            self.client.hset(SENT, mapping=dict(pending[start : start + CHUNK]))

    def cancelled(self, unit: str, done: bool) -> None:
        """A cancel made: whether it took the call before it ran."""
        self.client.hset(CANCELS, unit, "1" if done else "0")

    # -- the workers' writes --------------------------------------------------------------------------

    def started(self, request: Any, unit: str) -> float:
        """The start of a run with a body a kill can cut (a sleep): written before the body, on its own."""
        began = time.time()
        self.client.rpush(STARTS, dumps(start_record(request, unit, began)))
        return began

    def ended(self, request: Any, unit: str, began: float) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(ENDS, dumps(end_record(request, unit, began)))
        pipe.sadd(DONE, unit)
        pipe.execute()

    def ran(self, request: Any, units: list[str], due: float | None = None) -> None:
        """The start and the end of runs with no body to be killed in, in one round trip (the ledger's writes
        are most of the battle's work in a worker): a kill before it leaves the run unrecorded, as a kill
        before a separate start record would; a kill after it finds the run ended. ``due``: the due time the
        run's own message carries (a retry's), which the analysis judges it by."""
        if not units:
            return
        began = time.time()
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(STARTS, *(dumps(start_record(request, unit, began, due)) for unit in units))
        pipe.rpush(ENDS, *(dumps(end_record(request, unit, began, due)) for unit in units))
        pipe.sadd(DONE, *units)
        pipe.execute()

    def sent_first(self, unit: str, record: dict[str, Any]) -> None:
        """A send by a worker (a retry): only the first the ledger hears of is kept."""
        self.client.hsetnx(SENT, unit, dumps(record))

    def received(self, units: list[str], moment: float, hostname: str) -> None:
        self.client.rpush(RECEIVED, *(receipt_record(unit, moment, hostname) for unit in units))

    def ready(self, hostname: str, moment: float) -> None:
        self.client.hset(READY, hostname, moment)

    # -- the runner's reads ---------------------------------------------------------------------------

    def done(self) -> int:
        """How many units ended at least once."""
        return int(self.client.scard(DONE))

    def receipts(self) -> int:
        return int(self.client.llen(RECEIVED))

    def expected(self) -> int:
        """The units sent (every send written first) less those a cancel took before they ran."""
        self.flush()
        cancelled = sum(value == b"1" for value in self.client.hvals(CANCELS))
        return int(self.client.hlen(SENT)) - cancelled

    def sent_not_done(self, units: list[str]) -> int:
        """How many of ``units`` were sent and never ended."""
        pipe = self.client.pipeline(transaction=False)
        for unit in units:
            pipe.hexists(SENT, unit)
            pipe.sismember(DONE, unit)
        found = pipe.execute()
        return sum(bool(sent) and not done for sent, done in zip(found[::2], found[1::2], strict=True))

    def read(self) -> tuple[dict[str, Any], list[Any], list[Any], dict[str, bool], list[Any]]:
        """Everything: the sends by unit, the starts, the ends, the cancels by unit, the receipts."""
        sends = {_text(key): json.loads(value) for key, value in self.client.hscan_iter(SENT, count=5000)}
        starts = [json.loads(value) for value in _list(self.client, STARTS)]
        ends = [json.loads(value) for value in _list(self.client, ENDS)]
        cancels = {_text(key): value == b"1" for key, value in self.client.hgetall(CANCELS).items()}
        received = [json.loads(value) for value in _list(self.client, RECEIVED)]
        return sends, starts, ends, cancels, received


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _list(client: redis.Redis, key: str, step: int = 10_000) -> list[Any]:
    found: list[Any] = []
    for start in itertools.count(0, step):
        chunk = client.lrange(key, start, start + step - 1)
        found += chunk
        if len(chunk) < step:
            return found
    return found
