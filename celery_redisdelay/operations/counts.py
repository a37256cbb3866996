"""Counts of calls for the dashboard's overview, over all shards, each read bounded whatever the backlog.

The states are one ``ZCARD`` each per shard; the due-time windows one ``ZCOUNT`` each per shard (logarithmic in the
set's size); the split by task reads the metadata of a sample of at most ``sample`` parked calls taken evenly
across each shard's sorted set (all of them when there are fewer), scaled up to the shard's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..store.calls import LISTS, redis_errors, text
from ..store.meta import decode_meta
from .listing import server_ms, state_key

if TYPE_CHECKING:
    from ..store.calls import CallStore
    from ..store.depot import Depot

#: Slices the sample of a large shard is read in, spread evenly over its sorted set.
SLICES = 20


def state_counts(depot: Depot) -> dict[str, int]:
    """Calls per state (:data:`LISTS`) over all shards."""
    counts = dict.fromkeys(LISTS, 0)
    for store in depot.shards.all():
        with redis_errors("count calls"):
            pipe = store.client.pipeline(transaction=False)
            for state in counts:
                pipe.zcard(state_key(store, state))
            for state, count in zip(counts, pipe.execute(), strict=True):
                counts[state] += int(count)
    return counts


def due_counts(depot: Depot, windows: Sequence[tuple[int, int | None]]) -> list[int]:
    """Parked calls over all shards already due, then in each window (ms from now, after its start and up to its end;
    an end of None: no end), each shard by its own Redis clock."""
    counts = [0] * (len(windows) + 1)
    for store in depot.shards.all():
        now = server_ms(depot, store)
        with redis_errors("count parked calls by due time"):
            pipe = store.client.pipeline(transaction=False)
            pipe.zcount(store.keys.delayed, "-inf", now)
            for start, end in windows:
                pipe.zcount(store.keys.delayed, f"({now + start}", "+inf" if end is None else now + end)
            for index, found in enumerate(pipe.execute()):
                counts[index] += int(found)
    return counts


def parked_by_task(depot: Depot, sample: int) -> tuple[dict[str, float], int, int]:
    """Parked calls per task name, estimated from at most ``sample`` of them (exact where fewer are parked); with
    how many are parked and how many were read."""
    stores = depot.shards.all()
    with redis_errors("count parked calls"):
        pipe = depot.client.pipeline(transaction=False)
        for store in stores:
            pipe.zcard(store.keys.delayed)
        sizes = [int(size) for size in pipe.execute()]
    total = sum(sizes)
    estimated: dict[str, float] = {}
    read = 0
    for store, size in zip(stores, sizes, strict=True):
        if not size:
            continue
        share = max(1, sample * size // total) if total > sample else size
        ids = _spread_ids(store, size, share)
        with redis_errors("read the metadata of parked calls"):
            metas: Any = store.client.hmget(store.keys.meta, ids) if ids else []
        read += len(ids)
        scale = size / len(ids) if ids else 0
        for raw in metas:
            task = decode_meta(raw).get("t")
            name = task if isinstance(task, str) else "(unknown)"
            estimated[name] = estimated.get(name, 0.0) + scale
    return estimated, total, read


def _spread_ids(store: CallStore, size: int, wanted: int) -> list[str]:
    """About ``wanted`` ids of a shard's delay set: all of them, or ``SLICES`` runs spread evenly over it."""
    with redis_errors("sample parked calls"):
        if size <= wanted:
            members: Any = store.client.zrange(store.keys.delayed, 0, -1)
            return [text(member) for member in members]
        slices = min(SLICES, wanted)
        run = max(1, wanted // slices)
        pipe = store.client.pipeline(transaction=False)
        for index in range(slices):
            start = index * (size - run) // max(1, slices - 1)
            pipe.zrange(store.keys.delayed, start, start + run - 1)
        return list(dict.fromkeys(text(member) for found in pipe.execute() for member in found))
