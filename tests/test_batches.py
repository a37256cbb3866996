"""Keyed batches against a real redis-server: ``task.add(key, item)`` gathers items per key and the group
runs as one call ``task(key, items)`` when it is full (at the add) or its first item has waited ``max_wait``
(at the tick). Flushed batches are read back from the broker queue as kombu messages. Nothing here sleeps
hoping a deadline has passed: short waits are polled with ``wait_for`` around ``rd.tick()``.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.utils import json as kombu_json

from celery_redisdelay import ConfigurationError, PayloadError, RedisDelay, ScheduleError
from celery_redisdelay.message.stored import BatchCall, decode_stored
from celery_redisdelay.producer.batch import BatchedTask
from celery_redisdelay.store.keys import group_id
from celery_redisdelay.testing import wait_for
from tests.test_chaos import LosingReplies, losing_replies

MakeApp = Callable[..., tuple[Celery, RedisDelay]]
WAIT = 10.0
EMPTY = {
    "delayed": 0,
    "limited": 0,
    "paused": 0,
    "inflight": 0,
    "dead": 0,
    "due": 0,
    "inflight_expired": 0,
    "batch_groups": 0,
    "batch_items": 0,
}


def report(**counts: int) -> dict[str, int]:
    return {"released": 0, "requeued": 0, "dead": 0, "batches": 0, **counts}


def redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def released(client: redis.Redis, queue: str) -> list[tuple[str, str, list[Any]]]:
    """(id, task name, args) of each message in a broker queue, oldest first (kombu LPUSHes)."""
    out = []
    for raw in reversed(client.lrange(queue, 0, -1)):
        message = json.loads(raw)
        assert message["properties"]["body_encoding"] == "base64"
        args, kwargs, _embed = kombu_json.loads(base64.b64decode(message["body"]))
        assert kwargs == {}
        out.append((message["headers"]["id"], message["headers"]["task"], args))
    return out


def batched(rd: RedisDelay, name: str = "", **options: Any) -> BatchedTask:
    @rd.batched(name=name or f"tests.batch.{uuid.uuid4().hex[:8]}", **options)
    def bind_truck(key: str, items: list[Any]) -> int:
        return len(items)

    return bind_truck


def tick_until(rd: RedisDelay, done: Callable[[dict[str, int]], bool], what: str) -> dict[str, int]:
    """Tick until ``done(summed reports)`` holds after a tick; the summed reports of those ticks."""
    total = report()

    def ticked() -> bool:
        for name, count in rd.tick().items():
            total[name] += count
        return done(total)

    wait_for(ticked, WAIT, what)
    return total


@pytest.fixture
def queue(rd: RedisDelay, client: redis.Redis) -> Iterator[str]:
    """The default (unconsumed) queue of ``rd``, emptied at the end."""
    name: str = rd.app.conf.task_default_queue
    yield name
    client.delete(name)


# -- flushing ----------------------------------------------------------------------------------------


def test_size_flush_parks_exactly_those_items_due_now(rd: RedisDelay, client: redis.Redis, queue: str) -> None:
    task = batched(rd, size=10, max_wait=240, timeout=30)
    items = [{"parcel": n} for n in range(10)]
    for item in items[:9]:
        assert task.add("area-7", item) is None
    assert rd.stats() == {**EMPTY, "batch_groups": 1, "batch_items": 9}, "nothing parked before the group is full"

    result = task.add("area-7", items[9])
    assert result is not None
    assert rd.stats() == {**EMPTY, "delayed": 1, "due": 1}
    parked = rd.find(result.id)
    assert parked is not None and parked.envelope is not None
    assert parked.state == "delayed" and parked.score_ms <= redis_ms(client), "due now"
    assert (parked.meta["t"], parked.meta["s"], parked.meta["d"], parked.meta["r"]) == (task.name, "delayed", 0, 30_000)
    assert decode_stored(parked.envelope) == BatchCall(task.name, "area-7", items)

    assert rd.tick() == report(released=1)
    assert released(client, queue) == [(result.id, task.name, ["area-7", items])]
    assert rd.stats() == {**EMPTY, "inflight": 1}
    assert task.add("area-7", {"parcel": 10}) is None, "the next add starts a new group"
    assert rd.stats() == {**EMPTY, "inflight": 1, "batch_groups": 1, "batch_items": 1}


@pytest.mark.parametrize("fills", [False, True], ids=["while-the-group-waits", "that-filled-the-group"])
def test_an_add_whose_reply_was_lost_is_added_once(make_app: MakeApp, client: redis.Redis, fills: bool) -> None:
    """The add lands, its reply is dropped (a CLIENT KILL mid-call), redis-py sends it again: the item is in its
    group once, and the answer is the first attempt's (the battle saw such an item run twice)."""
    _, rd = make_app(redisdelay_connection_options=losing_replies())
    task = batched(rd, size=3, max_wait=240)
    before = ["a", "b"] if fills else ["a"]
    for item in before:
        assert task.add("k", item) is None
    unlucky = f"item-{uuid.uuid4()}"
    LosingReplies.armed[unlucky] = 1
    try:
        result = task.add("k", unlucky)
        assert LosingReplies.dropped.count(unlucky) == 1, "the add's reply was lost"
    finally:
        LosingReplies.armed.pop(unlucky, None)
    waiting = client.lrange(rd.keys.batch_items(group_id(task.name, "k")), 0, -1)
    if fills:
        assert result is not None, "answered as the add that filled the group"
        parked = rd.find(result.id)
        assert parked is not None and parked.envelope is not None
        assert decode_stored(parked.envelope) == BatchCall(task.name, "k", [*before, unlucky])
        assert waiting == [] and rd.stats()["batch_items"] == 0
    else:
        assert result is None
        assert waiting == [json.dumps(item).encode() for item in [*before, unlucky]]
        assert rd.stats()["batch_items"] == 2


def test_time_flush_after_max_wait(rd: RedisDelay, client: redis.Redis, queue: str) -> None:
    task = batched(rd, size=100, max_wait=0.3)
    for n in range(3):
        assert task.add("area-7", n) is None
    assert rd.tick() == report()
    assert rd.stats() == {**EMPTY, "batch_groups": 1, "batch_items": 3}

    assert tick_until(rd, lambda total: total["batches"] > 0, "a flush by time") == report(released=1, batches=1)
    [(call_id, name, args)] = released(client, queue)
    assert (name, args) == (task.name, ["area-7", [0, 1, 2]])
    assert rd.find(call_id) is not None and rd.stats() == {**EMPTY, "inflight": 1}
    assert rd.tick()["batches"] == 0, "a flushed group is not flushed again"


def test_groups_are_independent_per_key_and_per_task(rd: RedisDelay, client: redis.Redis, queue: str) -> None:
    other_queue = f"queue-other-{uuid.uuid4().hex[:8]}"
    first = batched(rd, size=3, max_wait=240)
    second = batched(rd, size=3, max_wait=240, queue=other_queue)
    adds = [(first, "k", "a1"), (second, "k", "b1"), (first, "k2", "c1"), (second, "k", "b2"), (first, "k", "a2")]
    assert [task.add(key, item) for task, key, item in adds] == [None] * 5
    assert rd.stats() == {**EMPTY, "batch_groups": 3, "batch_items": 5}
    full = second.add("k", "b3")
    assert full is not None
    assert rd.stats() == {**EMPTY, "delayed": 1, "due": 1, "batch_groups": 2, "batch_items": 3}

    assert rd.tick()["released"] == 1
    assert released(client, other_queue) == [(full.id, second.name, ["k", ["b1", "b2", "b3"]])]
    assert released(client, queue) == [], "the other task's group and the other key are untouched"
    last = first.add("k", "a3")
    assert last is not None
    assert rd.tick()["released"] == 1
    assert released(client, queue) == [(last.id, first.name, ["k", ["a1", "a2", "a3"]])]
    assert rd.stats() == {**EMPTY, "inflight": 2, "batch_groups": 1, "batch_items": 1}


def test_concurrent_adds_and_ticks_release_every_item_exactly_once(
    rd: RedisDelay, make_app: MakeApp, client: redis.Redis, queue: str
) -> None:
    size, adders, total, keys = 7, 8, 1000, ("north", "south", "east")
    task = batched(rd, size=size, max_wait=0.005)
    other_app, other = make_app()  # a second releaser on the same store and queue, knowing the same task
    other_app.conf.update(redisdelay_key_prefix=rd.keys.prefix, task_default_queue=queue)
    batched(other, name=task.name, size=size, max_wait=0.005)
    key_of = {n: keys[n % len(keys)] for n in range(total)}
    start, stop = threading.Barrier(adders + 2), threading.Event()

    def add_all(thread: int) -> list[str]:
        start.wait(WAIT)
        return [result.id for n in range(thread, total, adders) if (result := task.add(key_of[n], n)) is not None]

    def tick_loop(extension: RedisDelay) -> int:
        start.wait(WAIT)
        flushed = 0
        while not stop.is_set():
            flushed += extension.tick()["batches"]
        return flushed

    with ThreadPoolExecutor(adders + 2) as pool:
        tickers = [pool.submit(tick_loop, extension) for extension in (rd, other)]
        adding = [pool.submit(add_all, thread) for thread in range(adders)]
        by_size = {call_id for future in adding for call_id in future.result(timeout=60)}
        stop.set()
        by_time = sum(future.result(timeout=60) for future in tickers)
    drained = tick_until(rd, lambda _: rd.stats()["batch_groups"] == rd.stats()["due"] == 0, "the last groups")
    by_time += drained["batches"]

    messages = released(client, queue)
    assert len({call_id for call_id, _, _ in messages}) == len(messages) == len(by_size) + by_time
    seen: list[int] = []
    for call_id, name, (key, items) in messages:
        assert name == task.name
        assert all(key_of[n] == key for n in items), f"items of another key in the batch of {key}"
        for thread in range(adders):
            mine = [n for n in items if n % adders == thread]
            assert mine == sorted(mine), "items of one adder must keep their arrival order"
        assert len(items) == size if call_id in by_size else 1 <= len(items) < size
        seen.extend(items)
    assert len(seen) == len(set(seen)), "an item was released twice"
    assert set(seen) == set(range(total)), "an item was lost"
    assert rd.stats() == {**EMPTY, "inflight": len(messages)}


# -- keys and items ----------------------------------------------------------------------------------

ODD_KEYS = ["{", "}", "a{b}c", "{tag}", "with space ", "ünïcødé 🚚", "a:b:c", "quote\" and 'single'", "", "\\", "null"]
ODD_KEYS += ['["t","k"]', "\n\t\x00", "\ud800"]


def test_odd_keys_are_kept_apart_and_round_trip(rd: RedisDelay, client: redis.Redis, queue: str) -> None:
    task = batched(rd, size=2, max_wait=240)
    assert [task.add(key, [n, key]) for n, key in enumerate(ODD_KEYS)] == [None] * len(ODD_KEYS), "keys share a group"
    full = [task.add(key, {"n": n}) for n, key in enumerate(ODD_KEYS)]
    pairs = enumerate(zip(ODD_KEYS, full, strict=True))
    expected = {result.id: [key, [[n, key], {"n": n}]] for n, (key, result) in pairs if result}
    assert len(expected) == len(ODD_KEYS), "a key shares a group with another"
    assert rd.tick()["released"] == len(ODD_KEYS)
    assert {call_id: args for call_id, _, args in released(client, queue)} == expected
    assert rd.stats() == {**EMPTY, "inflight": len(ODD_KEYS)}


def test_items_of_celerys_json_types_round_trip(rd: RedisDelay, client: redis.Redis, queue: str) -> None:
    items = [datetime(2024, 5, 1, 12, 30, tzinfo=UTC), date(2024, 5, 1), Decimal("1.10"), uuid.UUID(int=7), b"raw"]
    task = batched(rd, size=len(items), max_wait=240)
    results = [task.add("k", item) for item in items]
    assert results[:-1] == [None] * (len(items) - 1) and results[-1] is not None
    assert rd.tick()["released"] == 1
    assert released(client, queue) == [(results[-1].id, task.name, ["k", items])]


class Opaque:
    """Something no serializer takes, with the same test id in every process (pytest-xdist compares them)."""

    def __repr__(self) -> str:
        return "Opaque()"


BAD_ADDS = [(None, 1), (5, 1), (b"area-7", 1), (("area", 7), 1), ("k", Opaque()), ("k", {1, 2}), ("k", [1, Opaque()])]


@pytest.mark.parametrize(("key", "item"), BAD_ADDS, ids=repr)
def test_bad_key_or_item_stores_nothing(rd: RedisDelay, key: Any, item: Any) -> None:
    task = batched(rd, size=2, max_wait=240)
    assert task.add("k", "first") is None
    before = rd.stats()
    error, match = (PayloadError, "nothing was stored") if isinstance(key, str) else (ScheduleError, "must be a string")
    with pytest.raises(error, match=match):
        task.add(key, item)
    assert rd.stats() == before == {**EMPTY, "batch_groups": 1, "batch_items": 1}


BAD_OPTIONS = [{"size": size} for size in (0, -3, "x", 2.0, True, None)]
BAD_OPTIONS += [{"max_wait": wait} for wait in (-1, float("nan"), float("inf"), "60", None)]


@pytest.mark.parametrize("options", BAD_OPTIONS, ids=repr)
def test_bad_batch_options_are_refused_at_decoration(rd: RedisDelay, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match=r"size|max_wait"):
        batched(rd, **options)


# Huge but finite options must be refused at decoration or work. Both once passed the check and then failed
# later: size >= 1e17 made flush_group hand LRANGE a float ('1e+17') so every tick raised; max_wait=1e306 made
# every add raise OverflowError (round(inf)).
HUGE = [{"size": sys.maxsize, "max_wait": 0}, {"size": 10**17, "max_wait": 0}, {"size": 1, "max_wait": 1e306}]


@pytest.mark.parametrize("options", HUGE, ids=repr)
def test_huge_finite_options_are_refused_at_decoration_or_work(
    rd: RedisDelay, client: redis.Redis, queue: str, options: dict[str, Any]
) -> None:
    try:
        task = batched(rd, **options)
    except ConfigurationError:
        return  # refused at decoration: the promise is kept
    other = batched(rd, size=1, max_wait=240).add("k", "another task's call")
    result = task.add("k", 1)
    assert other is not None
    assert rd.tick() == report(released=2, batches=int(result is None))
    assert other.id in {call_id for call_id, _, _ in released(client, queue)}


# -- a flushed batch is an ordinary call -------------------------------------------------------------


def test_batch_call_is_in_flight_until_acknowledged(rd: RedisDelay, client: redis.Redis, queue: str) -> None:
    task = batched(rd, size=2, max_wait=240)
    assert task.add("k", 1) is None
    result = task.add("k", 2)
    assert result is not None
    assert rd.tick()["released"] == 1
    found = rd.find(result.id)
    assert found is not None and (found.state, found.meta["s"], found.meta["d"]) == ("inflight", "queued", 1)
    assert rd.store.ack(result.id)
    assert rd.find(result.id) is None
    assert rd.stats() == EMPTY
    assert released(client, queue) == [(result.id, task.name, ["k", [1, 2]])]


def test_unacknowledged_batch_is_swept_and_released_again(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_queue_timeout=0.1, redisdelay_max_deliveries=2)
    queue = rd.app.conf.task_default_queue
    task = batched(rd, size=1, max_wait=240)
    result = task.add("k", "only")
    assert result is not None
    assert rd.tick()["released"] == 1
    wait_for(lambda: rd.stats()["inflight_expired"] == 1, WAIT, "the queue deadline to pass")
    assert rd.tick() == report(released=1, requeued=1)
    assert released(client, queue) == [(result.id, task.name, ["k", ["only"]])] * 2
    wait_for(lambda: rd.stats()["inflight_expired"] == 1, WAIT, "the queue deadline to pass again")
    assert rd.tick() == report(dead=1)
    [dead] = rd.dead_letters()
    assert dead.id == result.id and "not acknowledged after 2 deliveries" in dead.meta["why"]


def test_batch_of_a_task_unknown_to_the_releaser_is_dead_lettered(
    rd: RedisDelay, make_app: MakeApp, client: redis.Redis, queue: str
) -> None:
    """One unknown batch flushed by size before a good call (released after it), one flushed by the tick."""
    group, parcels, meta = group_id("no.such.task", "k"), [{"parcel": 1}, {"parcel": 2}], {"t": "no.such.task"}
    assert rd.store.batch_add(group, json.dumps(parcels[0]), 2, 240_000, "0-unused", meta) == (1, None)
    assert rd.store.batch_add(group, json.dumps(parcels[1]), 2, 240_000, "0-unknown", meta) == (0, "0-unknown")
    good = batched(rd, size=1, max_wait=240).add("k", "good")
    assert good is not None
    assert client.zrange(rd.keys.delayed, 0, -1) == [b"0-unknown", good.id.encode()], "the bad call comes first"
    assert rd.store.batch_add(group_id("no.such.task", "j"), "3", 100, 0, "unused", {}) == (1, None)

    assert rd.tick() == report(released=1, dead=2, batches=1)
    assert [call_id for call_id, _, _ in released(client, queue)] == [good.id]
    dead = rd.dead_letters()
    assert {entry.meta["t"] for entry in dead} == {"no.such.task"}
    assert all("batched task 'no.such.task' is not registered" in entry.meta["why"] for entry in dead)
    kept = rd.find("0-unknown")
    assert kept is not None and kept.state == "dead" and kept.envelope is not None
    assert decode_stored(kept.envelope) == BatchCall("no.such.task", "k", parcels)
    assert rd.stats() == {**EMPTY, "inflight": 1, "dead": 2}

    # A releaser that knows the task runs it once the call is requeued, as the reason says.
    knowing_app, knowing = make_app()
    knowing_app.conf.update(redisdelay_key_prefix=rd.keys.prefix, task_default_queue=queue)
    batched(knowing, name="no.such.task", size=100, max_wait=240)
    assert knowing.requeue("0-unknown")
    assert knowing.tick() == report(released=1)
    assert released(client, queue)[-1] == ("0-unknown", "no.such.task", ["k", parcels])


GARBAGE_TAILS = [b"", b"}", b',"group":["t"],"items":[]}', b',"group":5,"items":[]}', b',"group":["t",5],"items":[]}']
GARBAGE_TAILS += [b',"group":["TASK","k"],"items":{}}', b',"group":["TASK","k"]}', b',"group":["TASK","\xff"]}']
GARBAGE_TAILS += [b',"group":["TASK","k"],"items":[1]} trailing', b',"group":["TASK","k"],"items":' + b"[" * 100_000]
GARBAGE_TAILS += [b',"group":["TASK","k"],"items":[{"__type__":"%s","__value__":5}]}' % t for t in (b"nope", b"bytes")]


@pytest.mark.parametrize("tail", GARBAGE_TAILS, ids=lambda raw: repr(raw[:40]))
def test_malformed_batch_is_dead_lettered_and_the_tick_goes_on(
    rd: RedisDelay, client: redis.Redis, queue: str, tail: bytes
) -> None:
    task = batched(rd, size=1, max_wait=240)
    garbage = b'{"redisdelay":"batch"' + tail.replace(b"TASK", task.name.encode())
    rd.store.park("garbage", garbage, {"t": task.name}, due_ms=redis_ms(client) - 2_000)
    good = task.add("k", "fine")
    assert good is not None

    assert rd.tick() == report(released=1, dead=1)
    assert released(client, queue) == [(good.id, task.name, ["k", ["fine"]])]
    dead = rd.find("garbage")
    assert dead is not None and dead.state == "dead"
    why = dead.meta["why"]
    assert "malformed celery-redisdelay batch" in why or why.startswith("cannot publish: "), why
    assert dead.envelope == garbage, "the bytes are kept for inspection"
    assert rd.tick() == report()


def test_a_producer_broken_by_a_lost_connection_does_not_dead_letter_the_batch(
    rd: RedisDelay, client: redis.Redis, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a worker that releases, the consumer's reconnection can leave the pooled producer's kombu channel broken: its
    publish raises ``AttributeError("'NoneType' object has no attribute 'client'")`` from inside kombu (the 28-minute
    battle of 0.6.0 lost a batch of 11 items so). The call is published again on a connection of its own, not
    dead-lettered; an error the call itself causes still dead-letters it."""
    task = batched(rd, size=1, max_wait=240)
    releaser = rd.releaser
    pooled = releaser.send_task
    broken: list[Any] = []

    def send_task(*args: Any, producer: Any = None, **kwargs: Any) -> Any:
        if not broken:  # the pooled producer, the first time
            broken.append(producer)
            raise AttributeError("'NoneType' object has no attribute 'client'")
        return pooled(*args, producer=producer, **kwargs)

    monkeypatch.setattr(releaser, "send_task", send_task)
    good = task.add("k", "fine")
    assert good is not None
    assert rd.tick() == report(released=1)
    assert released(client, queue) == [(good.id, task.name, ["k", ["fine"]])]
    assert broken and rd.dead_letters() == []
