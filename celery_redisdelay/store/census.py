"""Reads that span several of a shard's structures (:mod:`.registries`) in one round trip: its counts per state (the
one place they are counted), the totals with the last release, a window of its history, the limits' figures, the
samples of its sets and where a handful of calls are.

Each is one pipeline of per-key commands (a Redis Cluster takes them); errors are redis-py's, for the caller to name
with :func:`.base.redis_errors`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import text
from .registries import Held, Registries, SortedSet, limit_released, spread


@dataclass(frozen=True)
class Census:
    """One shard's counts: the size of each set, the batch items and the locks with waiters (``counters``); with a
    time, the calls due by then and those in flight past their deadline; in detail, the first call of the delay set
    and of flight (id, score) and the memory of the store's fixed keys (None: the server refused ``MEMORY``)."""

    delayed: int  # in the delay set: not due yet, or due and not released yet
    limited: int  # due, waiting in their gates on their limits (parked still)
    paused: int  # set aside on a pause (parked still)
    inflight: int
    dead: int
    batch_groups: int
    batch_items: int
    lock_lines: int
    overdue: int = 0  # of the delay set, due by the time asked
    expired: int = 0  # in flight past their deadline by then
    first_delayed: tuple[str, float] | None = None
    first_inflight: tuple[str, float] | None = None
    memory: int | None = None

    @property
    def parked(self) -> int:
        """Every call parked here, as an operator counts the delayed ones: the delay set, and the calls due and
        waiting on their limits or set aside on a pause."""
        return self.delayed + self.limited + self.paused

    def lists(self) -> dict[str, int]:
        """The size of each list of calls an operator reads (``store.reading.LISTS``), as its set holds it: the
        delay set alone for ``delayed``."""
        return {
            "delayed": self.delayed,
            "limited": self.limited,
            "paused": self.paused,
            "inflight": self.inflight,
            "dead": self.dead,
        }

    @property
    def due(self) -> int:
        """The calls due and not released: of the delay set, and those waiting on their limits (a call set aside on
        a pause is not counted: no releaser is behind with it)."""
        return self.overdue + self.limited


def census(registries: Registries, now_ms: int | None = None, *, detail: bool = False) -> Census:
    """One shard's :class:`Census` in one pipeline: with ``now_ms``, what is due and expired by then; with ``detail``,
    the first calls and the memory of the fixed keys too."""
    r = registries
    pipe = r.client.pipeline(transaction=False)
    for one in (r.delayed, r.gated, r.paused, r.inflight, r.dead, r.batches):
        pipe.zcard(one.key)
    pipe.hmget(r.counters.key, ["batch_items", "lock_lines"])
    if now_ms is not None:
        pipe.zcount(r.delayed.key, "-inf", now_ms)
        pipe.zcount(r.inflight.key, "-inf", now_ms)
    if not detail:
        replies = pipe.execute()
    else:
        pipe.zrange(r.delayed.key, 0, 0, withscores=True)
        pipe.zrange(r.inflight.key, 0, 0, withscores=True)
        for key in r.keys.store_keys:
            pipe.memory_usage(key)
        replies = pipe.execute(raise_on_error=False)
        for reply in replies[: -len(r.keys.store_keys)]:
            if isinstance(reply, Exception):
                raise reply
    delayed, limited, paused, inflight, dead, groups, (items, lines), *rest = replies
    overdue, expired = (int(rest.pop(0)), int(rest.pop(0))) if now_ms is not None else (0, 0)
    firsts: list[tuple[str, float] | None] = [None, None]
    memory = None
    if detail:
        firsts = [(text(found[0][0]), float(found[0][1])) if found else None for found in rest[:2]]
        usage = [0 if size is None else size for size in rest[2:]]  # None: the key does not exist
        memory = sum(usage) if all(isinstance(size, int) for size in usage) else None
    return Census(
        delayed=int(delayed),
        limited=int(limited),
        paused=int(paused),
        inflight=int(inflight),
        dead=int(dead),
        batch_groups=int(groups),
        batch_items=int(items or 0),
        lock_lines=int(lines or 0),
        overdue=overdue,
        expired=expired,
        first_delayed=firsts[0],
        first_inflight=firsts[1],
        memory=memory,
    )


def sizes(sets: Sequence[SortedSet]) -> list[int]:
    """The size of each set, in one pipeline on the first one's client (the shards share it)."""
    pipe = sets[0].client.pipeline(transaction=False)
    for one in sets:
        pipe.zcard(one.key)
    return [int(size) for size in pipe.execute()]


def samples(sets: Sequence[SortedSet], most: int) -> list[tuple[int, list[bytes]]]:
    """Each set's size and about ``most`` of its members as stored (all of them when it holds no more, else runs
    spread evenly over it: :meth:`.registries.SortedSet.sample`), in two pipelines whatever the sets."""
    found = sizes(sets)
    pipe = sets[0].client.pipeline(transaction=False)
    runs = []
    for one, size in zip(sets, found, strict=True):
        ranges = [] if not size else [(0, -1)] if size <= most else spread(size, most)
        runs.append(len(ranges))
        for start, stop in ranges:
            pipe.zrange(one.key, start, stop)
    read = iter(pipe.execute())
    return [
        (size, [member for _ in range(count) for member in next(read)]) for size, count in zip(found, runs, strict=True)
    ]


def totals(registries: Registries) -> tuple[dict[str, int], int | None]:
    """The running totals (``counters``) and when a releaser last ran (ms; None: never), in one pipeline."""
    pipe = registries.client.pipeline(transaction=False)
    pipe.hgetall(registries.counters.key)
    pipe.hget(registries.history.key, "released_at")
    counters, released_at = pipe.execute()
    summed: dict[str, int] = {}
    for key, value in counters.items():
        name = text(key)
        summed[name] = summed.get(name, 0) + int(value)
    return summed, None if released_at is None else int(released_at)


def history_window(registries: Registries, fields: Sequence[str], per_read: int) -> tuple[list[int | None], int | None]:
    """The counts of ``fields`` of the history (``per_read`` fields an HMGET) and when a releaser last ran (ms; None:
    never), in one pipeline."""
    pipe = registries.client.pipeline(transaction=False)
    for start in range(0, len(fields), per_read):
        pipe.hmget(registries.history.key, list(fields[start : start + per_read]))
    pipe.hget(registries.history.key, "released_at")
    *slices, released_at = pipe.execute()
    values = [None if value is None else int(value) for part in slices for value in part]
    return values, None if released_at is None else int(released_at)


def gates_waiting(registries: Registries, most: int) -> list[tuple[bytes, float, int]]:
    """Up to ``most`` gates with calls waiting on their limits, the soonest first: each gate as stored, when its first
    call may be looked at again (ms), and how many calls wait in it (one ZLEXCOUNT of the gated set each, in one
    pipeline)."""
    gates = registries.gates.firsts(most)
    if not gates:
        return []
    pipe = registries.client.pipeline(transaction=False)
    for gate, _ in gates:
        pipe.zlexcount(registries.gated.key, b"[" + gate + b"\0", b"(" + gate + b"\1")
    return [(gate, score, int(count)) for (gate, score), count in zip(gates, pipe.execute(), strict=True)]


def limit_holdings(registries: Registries, names: Sequence[str]) -> list[tuple[int, int]]:
    """Per limit: the calls in flight holding its slots (``held``, and the slot holders earlier releases kept in
    ``slots`` until the sweep has moved them all) and the calls it let go, ever (``counters``); one pipeline."""
    if not names:
        return []
    pipe = registries.client.pipeline(transaction=False)
    for name in names:
        pipe.hget(registries.held.key, Held.of_limit(name))
    for name in names:
        prefix = f"{name}\t".encode()
        pipe.zlexcount(registries.slots.key, b"[" + prefix, b"[" + prefix + b"\xff")
    for name in names:
        pipe.hget(registries.counters.key, limit_released(name))
    replies = pipe.execute()
    count = len(names)
    return [
        (int(replies[index] or 0) + int(replies[count + index]), int(replies[2 * count + index] or 0))
        for index in range(count)
    ]


def in_flight_with_meta(registries: Registries, call_ids: Sequence[str]) -> list[tuple[float | None, Any]]:
    """Each call's in-flight deadline (None: not in flight) and stored metadata, in one pipeline."""
    pipe = registries.client.pipeline(transaction=False)
    pipe.zmscore(registries.inflight.key, list(call_ids))
    pipe.hmget(registries.meta.key, list(call_ids))
    deadlines, metas = pipe.execute()
    return list(zip(deadlines, metas, strict=True))


def pending(registries: Registries, call_ids: Sequence[str]) -> bool:
    """Whether any of the calls is delayed or in flight here, in one pipeline."""
    pipe = registries.client.pipeline(transaction=False)
    pipe.zmscore(registries.delayed.key, list(call_ids))
    pipe.zmscore(registries.inflight.key, list(call_ids))
    return any(score is not None for scores in pipe.execute() for score in scores)
