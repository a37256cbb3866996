"""What an operator sees and does, over all shards: the logic behind ``celery -A proj redisdelay ...``.

Plain functions taking a :class:`RedisDelay`, so scripts and tests get what the command line prints.
Every read is bounded: pages read at most ``limit`` entries per shard and resume from a cursor of
per-shard offsets, and the bulk operations run a script that handles at most 1,000 entries per call.
Only per-key commands and non-transactional pipelines are used, so all of it works on a Redis Cluster.
Times are the Redis server's clock, in ms since the epoch, as the scores are.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kombu.exceptions import KombuError
from kombu.serialization import loads

from .batch import BatchCall
from .envelope import Envelope, EnvelopeError
from .errors import RedisDelayError
from .store import STATES, CallStore, Entry, decode_meta, redis_errors, text
from .store import server_ms as clock_of
from .wire import PREFIX as BROKER_MESSAGE_PREFIX

if TYPE_CHECKING:
    from .extension import RedisDelay

#: The most entries one ``requeue_dead`` or ``purge_dead`` script call handles: scripts block Redis.
LARGEST_STEP = 1000
#: What the score of each state means.
SCORE_MEANING = {"delayed": "due", "inflight": "deadline", "dead": "dead since"}
PICKLE = "application/x-python-serialize"
#: How many ids of dead calls without payload a requeue report names (it counts them all).
NAMED_IDS = 100
#: Header fields of a stored message worth showing to an operator.
SHOWN_HEADERS = (
    "task",
    "retries",
    "expires",
    "root_id",
    "parent_id",
    "group",
    "shadow",
    "timelimit",
    "argsrepr",
    "kwargsrepr",
    "origin",
)


def server_ms(rd: RedisDelay, store: CallStore | None = None) -> int:
    """The clock of the Redis server holding a shard (the first by default), in ms since the epoch: the
    clock the shard's scores were set by."""
    store = store or rd.store
    with redis_errors("read the Redis clock"):
        return clock_of(store.client, store.keys.delayed)


def iso(ms: float) -> str:
    """A score as an ISO 8601 time in UTC, to the ms (``2025-01-31T12:00:00.250Z``)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _state_key(store: CallStore, state: str) -> str:
    if state not in STATES:
        raise RedisDelayError(f"unknown state {state!r}; expected one of {', '.join(STATES)}")
    key: str = getattr(store.keys, state)
    return key


# -- status ---------------------------------------------------------------------------------------


def status(rd: RedisDelay) -> dict[str, Any]:
    """Counts per state over all shards, the release and sweep backlogs with their oldest call, batch
    groups, and an estimate of the memory our keys use.

    ``shards`` is ``redisdelay_shards``; ``retired_shards`` counts the stores of earlier shard counts
    (the unsharded layout among them), which are read too since they may still hold calls.

    ``due`` counts delayed calls already due (``oldest_overdue``: the one due longest ago);
    ``inflight_expired`` counts calls in flight past their deadline (``oldest_expired``), which the next
    sweep delivers again or dead-letters. ``memory_bytes_estimate`` adds up ``MEMORY USAGE`` (which
    samples large keys) of each shard's nine fixed keys; batch item lists and locks are not counted; None
    when the server refuses ``MEMORY``.
    """
    stores = rd.shards.all()
    totals = dict.fromkeys(("delayed", "due", "inflight", "inflight_expired", "dead", "batch_groups", "batch_items"), 0)
    memory: int | None = 0
    firsts: dict[str, list[tuple[float, float, str, CallStore]]] = {"delayed": [], "inflight": []}
    for store in stores:
        keys = store.keys
        now = server_ms(rd, store)
        with redis_errors("read the store's counts"):
            pipe = store.client.pipeline(transaction=False)
            pipe.zcard(keys.delayed)
            pipe.zcount(keys.delayed, "-inf", now)
            pipe.zcard(keys.inflight)
            pipe.zcount(keys.inflight, "-inf", now)
            pipe.zcard(keys.dead)
            pipe.zcard(keys.batches)
            pipe.hget(keys.counters, "batch_items")
            pipe.zrange(keys.delayed, 0, 0, withscores=True)
            pipe.zrange(keys.inflight, 0, 0, withscores=True)
            for key in keys.store_keys:
                pipe.memory_usage(key)
            replies = pipe.execute(raise_on_error=False)
            counted = replies[:9]
            for reply in counted:
                if isinstance(reply, Exception):
                    raise reply
        *counts, items, first_delayed, first_inflight = counted
        for name, count in zip(totals, [*counts, int(items or 0)], strict=True):
            totals[name] += int(count)
        for state, first in (("delayed", first_delayed), ("inflight", first_inflight)):
            if first and first[0][1] <= now:
                firsts[state].append(((now - first[0][1]) / 1000, first[0][1], text(first[0][0]), store))
        usage = [0 if size is None else size for size in replies[9:]]  # None: the key does not exist
        if memory is None or not all(isinstance(size, int) for size in usage):
            memory = None
        else:
            memory += sum(usage)
    return {
        "shards": rd.shards.count,
        "retired_shards": len(stores) - rd.shards.count,
        **totals,
        "oldest_overdue": _oldest(firsts["delayed"]),
        "oldest_expired": _oldest(firsts["inflight"]),
        "memory_bytes_estimate": memory,
    }


def _oldest(candidates: list[tuple[float, float, str, CallStore]]) -> dict[str, Any] | None:
    """The latest of the shards' first calls (each shard's lateness by its own clock), with its task."""
    if not candidates:
        return None
    late, score, call_id, store = max(candidates, key=lambda candidate: candidate[0])
    with redis_errors(f"read the metadata of call {call_id}"):
        raw: Any = store.client.hget(store.keys.meta, call_id)
    meta = decode_meta(raw)
    return {
        "id": call_id,
        "task": meta.get("t"),
        "score_ms": int(score),
        "time": iso(score),
        "late_seconds": late,
    }


# -- pages ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """A page of calls in one state, oldest score first over all shards, and where the next one starts.

    ``next_cursor`` is None on the last page. ``scanned`` entries were read past to fill it: with a task
    filter, ``scan_stopped`` says the page ended at the ``scan`` bound before it was full.
    """

    state: str
    calls: list[Entry]
    now_ms: int
    next_cursor: str | None
    scanned: int
    scan_stopped: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "calls": [entry_dict(entry, self.now_ms) for entry in self.calls],
            "next_cursor": self.next_cursor,
            "scanned": self.scanned,
            "scan_stopped": self.scan_stopped,
            "now_ms": self.now_ms,
        }


def entry_dict(entry: Entry, now_ms: int) -> dict[str, Any]:
    """One listed call as plain data: its score as ms, ISO time and seconds from now (negative: past)."""
    meta = entry.meta
    return {
        "id": entry.id,
        "state": entry.state,
        "task": meta.get("t"),
        "score_ms": int(entry.score_ms),
        "time": iso(entry.score_ms),
        "seconds_from_now": (entry.score_ms - now_ms) / 1000,
        "deliveries": meta.get("d", 0),
        "max_deliveries": meta.get("m"),
        "phase": meta.get("s"),
        "why": meta.get("why"),
    }


def parse_cursor(cursor: str | None, shards: int) -> list[int]:
    """The per-shard offsets of a cursor (``"12.0.7"``, one per store of ``rd.shards.all()``); all zero
    without one."""
    if not cursor:
        return [0] * shards
    try:
        offsets = [int(part) for part in cursor.split(".")]
    except ValueError:
        offsets = []
    if not offsets or any(offset < 0 for offset in offsets):
        raise RedisDelayError(f"cursor {cursor!r} is not one that list printed (offsets joined by dots, like 12.0.7)")
    if len(offsets) != shards:
        raise RedisDelayError(
            f"cursor {cursor!r} has {len(offsets)} offsets but there are {shards} shards to read now; "
            "start again without --cursor"
        )
    return offsets


def format_cursor(offsets: list[int]) -> str:
    return ".".join(str(offset) for offset in offsets)


def _read(store: CallStore, state: str, offset: int, count: int) -> tuple[list[Entry], int]:
    """Up to ``count`` entries of one shard from ``offset`` on, with their metadata, and the set's size."""
    key = _state_key(store, state)
    with redis_errors(f"list {state} calls"):
        pipe = store.client.pipeline(transaction=False)
        pipe.zrange(key, offset, offset + count - 1, withscores=True)
        pipe.zcard(key)
        members, size = pipe.execute()
        ids = [text(member) for member, _ in members]
        metas: Any = store.client.hmget(store.keys.meta, ids) if ids else []
    entries = [
        Entry(call_id, state, score, decode_meta(meta), None)
        for call_id, (_, score), meta in zip(ids, members, metas, strict=True)
    ]
    return entries, int(size)


def page(
    rd: RedisDelay,
    state: str,
    *,
    limit: int = 50,
    cursor: str | None = None,
    task: str | None = None,
    scan: int = 10_000,
) -> Page:
    """A page of up to ``limit`` calls in ``state``, by score (then id) over all shards, from ``cursor`` on.

    The shards' entries are merged as they are read, ``limit`` at a time per shard: without a filter each
    shard is read once per page. With ``task``, only calls of that task are kept and reading goes on past
    the others, but stops once ``scan`` entries were read; the next cursor resumes there. Offsets move as
    calls come and go, so a page of a set that changes meanwhile may skip or repeat a call.
    """
    if limit < 1 or scan < 1:
        raise RedisDelayError(f"limit and scan must be at least 1, not {limit} and {scan}")
    stores = rd.shards.all()
    _state_key(stores[0], state)
    offsets = parse_cursor(cursor, len(stores))
    now = server_ms(rd)
    buffers: list[deque[Entry]] = [deque() for _ in stores]
    sizes = [0] * len(stores)
    heads: list[tuple[float, str, int]] = []  # (score, id, shard) of each buffer's first entry
    unread = list(range(len(stores)))  # shards whose buffer is empty and that may hold more
    calls: list[Entry] = []
    scanned = 0
    while len(calls) < limit and (task is None or scanned < scan):
        for shard in unread:
            entries, sizes[shard] = _read(stores[shard], state, offsets[shard], limit)
            if entries:
                buffers[shard].extend(entries)
                heapq.heappush(heads, (entries[0].score_ms, entries[0].id, shard))
        unread = []
        if not heads:
            break
        _, _, shard = heapq.heappop(heads)
        entry = buffers[shard].popleft()
        offsets[shard] += 1
        scanned += 1
        if task is None or entry.meta.get("t") == task:
            calls.append(entry)
        if buffers[shard]:
            heapq.heappush(heads, (buffers[shard][0].score_ms, buffers[shard][0].id, shard))
        elif offsets[shard] < sizes[shard]:
            unread.append(shard)
    more = bool(heads or unread)
    return Page(
        state,
        calls,
        now,
        format_cursor(offsets) if more else None,
        scanned,
        scan_stopped=task is not None and more and len(calls) < limit,
    )


# -- one call ---------------------------------------------------------------------------------------


def describe(rd: RedisDelay, call_id: str) -> dict[str, Any] | None:
    """Everything the store holds about one call, its arguments decoded; None when it holds nothing.

    No event log is kept per call (each would cost memory for every parked call): what is known of its
    history is in the metadata, as the deliveries so far, the phase it was last seen in, the deferrals
    behind a busy lock and, for a dead call, why it was dead-lettered.
    """
    entry = rd.find(call_id)
    if entry is None:
        return None
    now = server_ms(rd)
    meta = entry.meta
    return {
        "id": entry.id,
        "state": entry.state,
        "score_meaning": SCORE_MEANING[entry.state],
        "score_ms": int(entry.score_ms),
        "time": iso(entry.score_ms),
        "seconds_from_now": (entry.score_ms - now) / 1000,
        "task": meta.get("t"),
        "phase": meta.get("s"),
        "deliveries": meta.get("d", 0),
        "max_deliveries": meta.get("m"),
        "run_timeout_ms": meta.get("r"),
        "queue_timeout_ms": meta.get("q"),
        "deferrals": meta.get("w", 0),
        "key": meta.get("k"),
        "broker_list": meta.get("l"),
        "why": meta.get("why"),
        "meta": meta,
        "payload": None if entry.envelope is None else decode_payload(rd, entry.envelope),
        "now_ms": now,
    }


def decode_payload(rd: RedisDelay, raw: bytes) -> dict[str, Any]:
    """A stored payload made readable: which format, where it goes, and its arguments.

    The formats: ``envelope`` (Celery's message as the kombu path stores it), ``broker message`` (the
    message kombu's Redis transport pushes, stored by the fast path) and ``batch`` (a flushed batch).
    Arguments are decoded with kombu, honouring the content type; a pickled body only when the app's
    ``accept_content`` allows pickle, since unpickling runs code of the message's choosing.
    """
    described: dict[str, Any] = {"format": None, "bytes": len(raw), "decoded": False, "note": None}
    try:
        batch = BatchCall.decode(raw)
        if batch is not None:
            described.update(format="batch", task=batch.task, batch_key=batch.key, items=len(batch.items))
            described.update(args=[batch.key, batch.items], kwargs={}, decoded=True)
            return described
        envelope = Envelope.decode(raw)
    except EnvelopeError as exc:
        described["note"] = str(exc)
        return described
    described.update(
        format="broker message" if raw.startswith(BROKER_MESSAGE_PREFIX) else "envelope",
        task=envelope.task,
        exchange=envelope.exchange,
        routing_key=envelope.routing_key,
        priority=envelope.properties.get("priority"),
        content_type=envelope.content_type,
        content_encoding=envelope.content_encoding,
        headers={name: envelope.headers[name] for name in SHOWN_HEADERS if envelope.headers.get(name) is not None},
    )
    accepted = rd.accepted_content_types
    if envelope.content_type == PICKLE and accepted is not None and PICKLE not in accepted:
        described["note"] = "(pickle; not decoded)"
        return described
    try:
        body = loads(envelope.body, envelope.content_type, envelope.content_encoding, accept={envelope.content_type})
    except (KombuError, ValueError, TypeError) as exc:
        described["note"] = f"(undecodable {envelope.content_type} body: {exc})"
        return described
    if isinstance(body, list | tuple) and len(body) == 3:  # protocol 2: (args, kwargs, embed)
        described.update(args=body[0], kwargs=body[1], decoded=True)
    elif isinstance(body, dict):  # protocol 1
        described.update(args=body.get("args"), kwargs=body.get("kwargs"), decoded=True)
    else:
        described["note"] = f"(a body of {type(body).__name__}, not a Celery task message)"
    return described


# -- bulk operations --------------------------------------------------------------------------------


@dataclass
class RequeueReport:
    """What ``requeue --all-dead`` did: calls requeued, and dead calls left because they have no payload."""

    requeued: int = 0
    without_payload: int = 0
    without_payload_ids: list[str] = field(default_factory=list)  # the first NAMED_IDS of them

    def as_dict(self) -> dict[str, Any]:
        return {
            "requeued": self.requeued,
            "without_payload": self.without_payload,
            "without_payload_ids": self.without_payload_ids,
        }


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= LARGEST_STEP:
        raise RedisDelayError(f"step must be an integer from 1 to {LARGEST_STEP}, not {step!r}")


def requeue_all_dead(rd: RedisDelay, step: int = LARGEST_STEP) -> RequeueReport:
    """Give every dead-lettered call a fresh start, due now, ``step`` entries per script call.

    A dead entry without payload has nothing to run: it stays dead, is counted, and later steps pass
    over it. Calls dead-lettered while this runs may be requeued too.
    """
    _check_step(step)
    report = RequeueReport()
    for store in rd.shards.all():
        passed = 0
        while True:
            requeued, looked_at, *left = store._run("requeue_dead", [step, passed], "requeue dead-lettered calls")
            report.requeued += int(requeued)
            passed += len(left)
            report.without_payload += len(left)
            room = max(NAMED_IDS - len(report.without_payload_ids), 0)
            report.without_payload_ids.extend(text(call_id) for call_id in left[:room])
            if int(looked_at) < step:
                break
    return report


def dead_count(rd: RedisDelay, before_ms: int | None = None) -> int:
    """How many calls are dead-lettered over all shards (with ``before_ms``, dead since then or earlier)."""
    total = 0
    for store in rd.shards.all():
        with redis_errors("count dead-lettered calls"):
            total += int(store.client.zcount(store.keys.dead, "-inf", "+inf" if before_ms is None else before_ms))
    return total


def purge_dead(rd: RedisDelay, step: int = LARGEST_STEP, before_ms: int | None = None) -> int:
    """Delete dead-lettered calls for good, with their payload, metadata and unique-key entry; how many.

    With ``before_ms``, only calls dead-lettered at or before then: what an operator counted and
    confirmed, not what died since. ``step`` entries go per script call.
    """
    _check_step(step)
    bound = "+inf" if before_ms is None else str(before_ms)
    purged = 0
    for store in rd.shards.all():
        while True:
            deleted = int(store._run("purge_dead", [step, bound], "purge dead-lettered calls"))
            purged += deleted
            if deleted < step:
                break
    return purged
