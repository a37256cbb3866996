"""What an operator sees and does, over all shards: the logic behind ``celery -A proj redisdelay ...``.

Plain functions taking an app's :class:`~celery_redisdelay.store.depot.Depot` (``rd.depot``), so scripts and tests get
what the command line prints.
Every read is bounded: pages read at most ``limit`` entries per shard and resume from a cursor of
per-shard offsets, and the bulk operations run a script that handles at most 1,000 entries per call.
Only per-key commands and non-transactional pipelines are used, so all of it works on a Redis Cluster.
Times are the Redis server's clock, in ms since the epoch, as the scores are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import RedisDelayError
from ..store.calls import LARGEST_STEP, CallStore, redis_errors
from ..store.census import census
from ..store.meta import named
from .checks import releasing
from .limits import limit_states
from .listing import (
    ORDERS,
    SCORE_MEANING,
    Filter,
    Page,
    entry_dict,
    format_cursor,
    iso,
    list_size,
    page,
    parse_cursor,
    paused_on,
    server_ms,
)
from .payloads import PICKLE, SHOWN_HEADERS, decode_payload, queue_of

if TYPE_CHECKING:
    from ..store.depot import Depot

__all__ = [
    "LARGEST_STEP",
    "ORDERS",
    "PICKLE",
    "SCORE_MEANING",
    "SHOWN_HEADERS",
    "Filter",
    "Page",
    "RequeueReport",
    "dead_count",
    "decode_payload",
    "describe",
    "entry_dict",
    "format_cursor",
    "iso",
    "list_size",
    "page",
    "parse_cursor",
    "purge_dead",
    "requeue_all_dead",
    "server_ms",
    "status",
]

#: How many ids of dead calls without payload a requeue report names (it counts them all).
NAMED_IDS = 100


# -- status ---------------------------------------------------------------------------------------


def status(depot: Depot) -> dict[str, Any]:
    """Counts per state over all shards, the release and sweep backlogs with their oldest call, batch
    groups, and an estimate of the memory our keys use.

    ``shards`` is ``redisdelay_shards``; ``retired_shards`` counts the stores of earlier shard counts
    (the unsharded layout among them), which are read too since they may still hold calls.

    ``due`` counts delayed calls already due (``oldest_overdue``: the one due longest ago);
    ``limited`` counts the delayed calls that are due and wait on their limits; ``limits`` says, per limit,
    what it allows, what waits on it and what it holds (see :mod:`.limits`). ``paused_calls`` counts the calls
    set aside on a pause (``stats()['paused']``): counted among the delayed calls, not among the due ones (no
    releaser is behind with them).
    ``inflight_expired`` counts calls in flight past their deadline (``oldest_expired``), which the next
    sweep delivers again or dead-letters. ``memory_bytes_estimate`` adds up ``MEMORY USAGE`` (which
    samples large keys) of each shard's fixed keys; batch item lists and locks are not counted; None
    when the server refuses ``MEMORY``. ``locks_with_waiters`` counts locks with calls deferred behind
    them (the lock scripts keep the count; lines that started waiting before it was kept are not in it).
    """
    stores = depot.shards.all()
    names = (
        "delayed",
        "due",
        "inflight",
        "inflight_expired",
        "dead",
        "batch_groups",
        "limited",
        "paused_calls",
        "batch_items",
        "locks_with_waiters",
    )
    totals = dict.fromkeys(names, 0)
    memory: int | None = 0
    firsts: dict[str, list[tuple[float, float, str, CallStore]]] = {"delayed": [], "inflight": []}
    for store in stores:
        now = server_ms(depot, store)
        with redis_errors("read the store's counts"):
            counted = census(store.registries, now, detail=True)
        # Calls due and waiting on their limits are parked still, and due; calls set aside on a pause are parked still.
        shard = (
            *(counted.parked, counted.due, counted.inflight, counted.expired, counted.dead, counted.batch_groups),
            *(counted.limited, counted.paused, counted.batch_items, counted.lock_lines),
        )
        for name, count in zip(totals, shard, strict=True):
            totals[name] += count
        for state, first in (("delayed", counted.first_delayed), ("inflight", counted.first_inflight)):
            if first and first[1] <= now:
                firsts[state].append(((now - first[1]) / 1000, first[1], first[0], store))
        memory = None if memory is None or counted.memory is None else memory + counted.memory
    return {
        "shards": depot.shards.count,
        "retired_shards": len(stores) - depot.shards.count,
        **totals,
        "oldest_overdue": _oldest(firsts["delayed"]),
        "oldest_expired": _oldest(firsts["inflight"]),
        "memory_bytes_estimate": memory,
        "workers": worker_leases(depot),
        "limits": [state.as_dict() for state in limit_states(depot).values()],
        "releasing": releasing(depot),
    }


def worker_leases(depot: Depot) -> dict[str, dict[str, Any]]:
    """The workers holding leases on calls, over all shards: how many calls each holds (``leases``), when it
    last renewed them (``renewed_ms``, ``renewed``: the latest over the shards) and how long ago that was
    (``renewed_seconds_ago``, by the store's clock). A worker that holds nothing, or has not renewed for three
    leases, is not listed (see lease.lua)."""
    found: dict[str, dict[str, Any]] = {}
    now = server_ms(depot)
    for store in depot.shards.all():
        with redis_errors("read the workers' leases"):
            entries = store.registries.workers.leases()  # a record that cannot be read is left out
        for worker, (leases, renewed) in entries.items():
            row = found.setdefault(worker, {"leases": 0, "renewed_ms": renewed})
            row["leases"] += leases
            row["renewed_ms"] = max(row["renewed_ms"], renewed)
    for row in found.values():
        row["renewed"] = iso(row["renewed_ms"])
        row["renewed_seconds_ago"] = max(0.0, (now - row["renewed_ms"]) / 1000)
    return dict(sorted(found.items()))


def _oldest(candidates: list[tuple[float, float, str, CallStore]]) -> dict[str, Any] | None:
    """The latest of the shards' first calls (each shard's lateness by its own clock), with its task."""
    if not candidates:
        return None
    late, score, call_id, store = max(candidates, key=lambda candidate: candidate[0])
    with redis_errors(f"read the metadata of call {call_id}"):
        meta = store.registries.meta.get(call_id)
    return {
        "id": call_id,
        "task": meta.get("t"),
        "score_ms": int(score),
        "time": iso(score),
        "late_seconds": late,
    }


# -- one call ---------------------------------------------------------------------------------------


def describe(depot: Depot, call_id: str) -> dict[str, Any] | None:
    """Everything the store holds about one call, its arguments decoded; None when it holds nothing.

    No event log is kept per call (each would cost memory for every parked call): what is known of its
    history is in the metadata, as the deliveries so far, the phase it was last seen in, the deferrals
    behind a busy lock and, for a dead call, why it was dead-lettered.
    """
    entry = depot.shards.find(call_id)
    if entry is None:
        return None
    now = server_ms(depot)
    meta = entry.meta
    payload = None if entry.envelope is None else decode_payload(depot, entry.envelope)
    return {
        "id": entry.id,
        "state": entry.state,
        "score_meaning": SCORE_MEANING[entry.state],
        "score_ms": int(entry.score_ms),
        "time": iso(entry.score_ms),
        "seconds_from_now": (entry.score_ms - now) / 1000,
        **named(meta),
        "paused_on": paused_on(meta) if meta.get("s") == "paused" else None,
        "meta": meta,
        "queue": queue_of(depot, meta, entry.envelope),
        "payload": payload,
        "lock": None if payload is None else lock_of(depot, entry.id, meta.get("t"), payload),
        "now_ms": now,
    }


def lock_of(depot: Depot, call_id: str, task_name: Any, payload: dict[str, Any]) -> dict[str, Any] | None:
    """The lock a call takes when it runs (its task's ``lock`` template filled with its arguments) and
    that lock's state now; None when its task declares no lock or is not registered in this process."""
    task = depot.app.tasks.get(task_name) if isinstance(task_name, str) else None
    if getattr(task, "lock", None) is None or not payload["decoded"]:
        return None
    try:
        name = task.lock_name(payload["args"] or (), payload["kwargs"] or {})  # type: ignore[union-attr]
    except RedisDelayError as exc:
        return {"name": None, "note": str(exc)}
    store = depot.shards.for_name(name)
    with redis_errors(f"read lock {name}"):
        lock = store.registries.locks.state(name, call_id)
    return {
        "name": name,
        "held": lock.expires_ms != -2,  # -2: no such key; -1: held without expiry
        "expires_in_ms": lock.expires_ms if lock.expires_ms >= 0 else None,
        "waiters": lock.waiters,
        "waiting": lock.waiting_since is not None,
        "note": None,
    }


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


def requeue_all_dead(depot: Depot, step: int = LARGEST_STEP) -> RequeueReport:
    """Give every dead-lettered call a fresh start, due now, ``step`` entries per script call.

    A dead entry without payload has nothing to run: it stays dead, is counted, and later steps pass
    over it. Calls dead-lettered while this runs may be requeued too.
    """
    _check_step(step)
    report = RequeueReport()
    for store in depot.shards.all():
        passed = 0
        while True:
            requeued, looked_at, left = store.requeue_dead(step, passed)
            report.requeued += requeued
            passed += len(left)
            report.without_payload += len(left)
            room = max(NAMED_IDS - len(report.without_payload_ids), 0)
            report.without_payload_ids.extend(left[:room])
            if looked_at < step:
                break
    return report


def dead_count(depot: Depot, before_ms: int | None = None) -> int:
    """How many calls are dead-lettered over all shards (with ``before_ms``, dead since then or earlier)."""
    total = 0
    for store in depot.shards.all():
        with redis_errors("count dead-lettered calls"):
            total += store.registries.dead.count_until(before_ms)
    return total


def purge_dead(depot: Depot, step: int = LARGEST_STEP, before_ms: int | None = None) -> int:
    """Delete dead-lettered calls for good, with their payload, metadata and unique-key entry; how many.

    With ``before_ms``, only calls dead-lettered at or before then: what an operator counted and
    confirmed, not what died since. ``step`` entries go per script call.
    """
    _check_step(step)
    bound = "+inf" if before_ms is None else str(before_ms)
    purged = 0
    for store in depot.shards.all():
        while True:
            deleted = store.purge_dead(step, bound)
            purged += deleted
            if deleted < step:
                break
    return purged
