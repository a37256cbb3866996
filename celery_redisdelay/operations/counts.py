"""Counts of calls for the dashboard's overview, over all shards, each read bounded whatever the backlog.

The states are one ``ZCARD`` each per shard; the due-time windows one ``ZCOUNT`` each per shard (logarithmic in the
set's size); the split by task reads the metadata of a sample of at most ``sample`` parked calls taken evenly
across each shard's sorted set (all of them when there are fewer), scaled up to the shard's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..store.calls import LISTS, redis_errors, text
from ..store.census import census
from ..store.census import sizes as census_sizes
from ..store.meta import decode_meta
from ..store.registries import SLICES as SLICES  # slices the sample of a large shard is read in
from .listing import server_ms

if TYPE_CHECKING:
    from ..store.depot import Depot


def state_counts(depot: Depot) -> dict[str, int]:
    """Calls per state (:data:`LISTS`) over all shards."""
    counts = dict.fromkeys(LISTS, 0)
    for store in depot.shards.all():
        with redis_errors("count calls"):
            shard = census(store.registries).lists()
        for state in counts:
            counts[state] += shard[state]
    return counts


def due_counts(depot: Depot, windows: Sequence[tuple[int, int | None]]) -> list[int]:
    """Parked calls over all shards already due, then in each window (ms from now, after its start and up to its end;
    an end of None: no end), each shard by its own Redis clock."""
    counts = [0] * (len(windows) + 1)
    for store in depot.shards.all():
        now = server_ms(depot, store)
        with redis_errors("count parked calls by due time"):
            for index, found in enumerate(store.registries.delayed.due_counts(now, windows)):
                counts[index] += found
    return counts


def parked_by_task(depot: Depot, sample: int) -> tuple[dict[str, float], int, int]:
    """Parked calls per task name, estimated from at most ``sample`` of them (exact where fewer are parked); with
    how many are parked and how many were read."""
    stores = depot.shards.all()
    with redis_errors("count parked calls"):
        sizes = census_sizes([store.registries.delayed for store in stores])
    total = sum(sizes)
    estimated: dict[str, float] = {}
    read = 0
    for store, size in zip(stores, sizes, strict=True):
        if not size:
            continue
        share = max(1, sample * size // total) if total > sample else size
        with redis_errors("sample parked calls"):
            ids = list(dict.fromkeys(text(member) for member in store.registries.delayed.sample(size, share)))
        with redis_errors("read the metadata of parked calls"):
            metas = store.registries.meta.raw(ids)
        read += len(ids)
        scale = size / len(ids) if ids else 0
        for raw in metas:
            task = decode_meta(raw).get("t")
            name = task if isinstance(task, str) else "(unknown)"
            estimated[name] = estimated.get(name, 0.0) + scale
    return estimated, total, read
