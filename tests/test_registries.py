"""The store's registries (one class per Redis structure) and the reads that span several (census), against a real
redis-server: what each read gives is what the Redis commands it stands for give."""

from __future__ import annotations

import json

import pytest
import redis

from celery_redisdelay import RedisDelay
from celery_redisdelay.store.calls import LISTS
from celery_redisdelay.store.census import census, history_window, limit_holdings, samples, totals
from celery_redisdelay.store.limits import Limit
from celery_redisdelay.store.meta import NAMED_FIELDS, named
from celery_redisdelay.store.registries import SLICES, spread

ENVELOPE = b'{"opaque": "to the store"}'
LONG_MS = 60_000


def test_the_census_counts_as_the_sets_and_counters_say(rd: RedisDelay, client: redis.Redis) -> None:
    store = rd.store
    for index in range(3):
        store.park(f"later-{index}", ENVELOPE, {}, countdown_ms=LONG_MS)
    store.park("due", ENVELOPE, {}, countdown_ms=0)
    keys = store.keys
    client.hset(keys.counters, mapping={"batch_items": 4, "lock_lines": 2})
    now = store.registries.delayed.server_ms()

    counted = census(store.registries, now, detail=True)

    assert (counted.delayed, counted.inflight, counted.dead) == (4, 0, 0)
    assert counted.overdue == client.zcount(keys.delayed, "-inf", now) == 1
    assert (counted.batch_items, counted.lock_lines) == (4, 2)
    assert counted.first_delayed == ("due", client.zscore(keys.delayed, "due"))
    assert counted.first_inflight is None
    assert counted.memory is None or counted.memory > 0
    assert counted.parked == 4 and counted.due == 1
    plain = census(store.registries)
    assert (plain.overdue, plain.first_delayed, plain.memory) == (0, None, None), "asked without a time or detail"
    assert store.stats()["delayed"] == counted.parked and store.stats()["due"] == counted.due


@pytest.mark.parametrize(("size", "wanted"), [(100, 7), (5000, 1000), (21, 20), (2, 1)])
def test_a_spread_sample_reads_runs_from_the_first_member_to_the_last(size: int, wanted: int) -> None:
    runs = spread(size, wanted)
    assert len(runs) == min(SLICES, wanted)
    assert runs[0][0] == 0 and runs[-1][1] <= size - 1
    assert all(stop - start + 1 == max(1, wanted // len(runs)) for start, stop in runs)


def test_samples_read_whole_sets_or_runs_over_them(rd: RedisDelay, client: redis.Redis) -> None:
    registries = rd.store.registries
    client.zadd(registries.delayed.key, {f"id-{index:03}": index for index in range(50)})
    [(small, all_of_it)] = samples([registries.delayed], 50)
    (large, some), (empty, none) = samples([registries.delayed, registries.dead], 10)
    assert (small, len(all_of_it)) == (50, 50)
    assert large == 50 and 0 < len(some) <= 10 and some[0] == b"id-000"
    assert (empty, none) == (0, [])
    assert registries.delayed.sample(50, 10) == some


def test_the_workers_leases_leave_out_what_cannot_be_read(rd: RedisDelay, client: redis.Redis) -> None:
    workers = rd.store.registries.workers
    client.hset(workers.key, "w1", json.dumps({"n": 3, "at": 1000}))
    client.hset(workers.key, "w2", "not json")
    client.hset(workers.key, "w3", json.dumps({"n": 1}))
    assert workers.leases() == {"w1": (3, 1000)}


def test_limits_are_set_reset_and_read_back_damaged_ones_as_none(rd: RedisDelay, client: redis.Redis) -> None:
    registries = rd.store.registries
    registries.limits.set("task:t", Limit(((5.0, 1000),), 2))
    client.hset(registries.limits.key, "code:quota:q", "{damaged")
    records = {(record.kind, record.name): record.limit for record in registries.limits.records()}
    assert records == {("set", "task:t"): Limit(((5.0, 1000),), 2), ("code", "quota:q"): None}
    registries.limits.set("task:t", None)
    assert not client.hexists(registries.limits.key, "set:task:t")
    client.hset(registries.held.key, "\0task:t", 2)
    client.hset(registries.counters.key, "limit_released:task:t", 7)
    client.zadd(registries.slots.key, {b"task:t\tkey\0id-1": 0})
    assert limit_holdings(registries, ["task:t", "quota:q"]) == [(3, 7), (0, 0)]


def test_totals_and_the_history_window_read_what_the_hashes_hold(rd: RedisDelay, client: redis.Redis) -> None:
    registries = rd.store.registries
    assert totals(registries) == ({}, None)
    client.hset(registries.counters.key, mapping={"parked": 5, "released": 2})
    client.hset(registries.history.key, mapping={"released_at": 1234, "9:parked": 3})
    assert totals(registries) == ({"parked": 5, "released": 2}, 1234)
    assert history_window(registries, ["8:parked", "9:parked", "9:released"], 2) == ([None, 3, None], 1234)
    assert registries.history.counts(["9:parked"]) == [3]


def test_the_metadata_gets_its_names_in_one_place() -> None:
    assert named({"t": "task", "d": 2, "why": "because"}) == {
        **{name: missing for name, (_, missing) in NAMED_FIELDS.items()},
        "task": "task",
        "deliveries": 2,
        "why": "because",
    }
    assert named({})["deliveries"] == 0 and named({})["deferrals"] == 0


def test_the_census_sizes_each_list_an_operator_reads(rd: RedisDelay) -> None:
    rd.store.park("one", ENVELOPE, {}, countdown_ms=LONG_MS)
    assert list(census(rd.store.registries).lists()) == list(LISTS)
    assert census(rd.store.registries).lists()["delayed"] == 1
