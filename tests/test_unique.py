"""Unique and debounced parking, and reschedule, against a real redis-server (no worker).

A unique call is stored once while a call with its key is parked; a debounced call replaces the
parked one (same id, new arguments, new due time). Keys are free again once their call leaves the
delay set.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from kombu.serialization import loads

from celery_redisdelay import RedisDelay, ScheduleError
from celery_redisdelay.message.stored import decode_stored
from celery_redisdelay.store.keys import group_id

MakeApp = Callable[..., tuple[Celery, RedisDelay]]


def redis_now_ms(rd: RedisDelay) -> int:
    seconds, micros = rd.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def notify(rd: RedisDelay) -> Any:
    @rd.delayed(name="tests.notify")
    def notify(user: str, text: str) -> str:
        return text

    return notify


def parked_args(rd: RedisDelay, call_id: str) -> list[Any]:
    entry = rd.find(call_id)
    assert entry is not None
    assert entry.state == "delayed"
    assert entry.envelope is not None
    envelope = decode_stored(entry.envelope)
    assert envelope.headers["id"] == call_id
    args, _, _ = loads(envelope.body, envelope.content_type, envelope.content_encoding)
    return list(args)


def test_unique_call_is_stored_once_and_the_first_arguments_win(rd: RedisDelay) -> None:
    task = notify(rd)
    results = [task.apply_async(("ann", f"text {n}"), countdown=60, unique_key="user:42") for n in range(10)]
    assert len({result.id for result in results}) == 1
    assert rd.stats()["delayed"] == 1
    assert parked_args(rd, results[0].id) == ["ann", "text 0"]


def test_unique_key_is_free_again_after_cancel_and_after_release(rd: RedisDelay) -> None:
    task = notify(rd)
    first = task.apply_async(("ann", "a"), countdown=60, unique_key="k")
    assert rd.cancel(first.id)
    second = task.apply_async(("ann", "b"), countdown=0, unique_key="k")
    assert second.id != first.id
    assert rd.tick()["released"] == 1
    third = task.apply_async(("ann", "c"), countdown=60, unique_key="k")
    assert third.id != second.id
    assert parked_args(rd, third.id) == ["ann", "c"]


def test_a_released_call_back_from_a_failed_publish_takes_its_key_again(rd: RedisDelay) -> None:
    task = notify(rd)
    first = task.apply_async(("ann", "a"), countdown=0, unique_key="k")
    [claimed] = rd.store.claim(10, 30_000)
    assert rd.store.holder(group_id("tests.notify", "k")) is None  # released: the key is free
    assert rd.store.unclaim([claimed.id]) == 1
    again = task.apply_async(("ann", "b"), countdown=60, unique_key="k")
    assert again.id == first.id


def test_unique_keys_are_per_task(rd: RedisDelay) -> None:
    task = notify(rd)

    @rd.delayed(name="tests.other")
    def other(user: str, text: str) -> None: ...

    a = task.apply_async(("ann", "a"), countdown=60, unique_key="k")
    b = other.apply_async(("ann", "b"), countdown=60, unique_key="k")
    assert a.id != b.id
    assert rd.stats()["delayed"] == 2


def test_debounce_replaces_the_arguments_and_pushes_the_due_time_keeping_the_id(rd: RedisDelay) -> None:
    task = notify(rd)
    first = task.apply_async(("ann", "text 0"), countdown=5, debounce_key="user:42")
    first_due = rd.find(first.id).score_ms  # type: ignore[union-attr]
    before = redis_now_ms(rd)
    results = [task.apply_async(("ann", f"text {n}"), countdown=30, debounce_key="user:42") for n in range(1, 10)]
    assert {result.id for result in results} == {first.id}
    assert rd.stats()["delayed"] == 1
    assert parked_args(rd, first.id) == ["ann", "text 9"]
    due = rd.find(first.id).score_ms  # type: ignore[union-attr]
    assert due > first_due
    assert before + 30_000 <= due <= redis_now_ms(rd) + 30_000


def test_debounce_after_release_parks_a_new_call(rd: RedisDelay) -> None:
    task = notify(rd)
    first = task.apply_async(("ann", "a"), countdown=0, debounce_key="k")
    assert rd.tick()["released"] == 1
    second = task.apply_async(("ann", "b"), countdown=60, debounce_key="k")
    assert second.id != first.id
    assert rd.find(first.id).state == "inflight"  # type: ignore[union-attr]  # untouched by the new call
    assert parked_args(rd, second.id) == ["ann", "b"]


def test_debounce_with_a_task_id_that_was_used_before_gets_a_fresh_id(rd: RedisDelay) -> None:
    task = notify(rd)
    used = task.apply_async(("ann", "a"), countdown=0)
    assert rd.tick()["released"] == 1
    result = task.apply_async(("ann", "b"), countdown=60, debounce_key="k", task_id=used.id)
    assert result.id != used.id
    assert rd.find(used.id).state == "inflight"  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["unique_key", "debounce_key"])
def test_concurrent_keyed_calls_park_exactly_one(make_app: MakeApp, mode: str) -> None:
    _, rd = make_app()
    task = notify(rd)
    ids: list[str] = []
    lock = threading.Lock()

    def produce(thread: int) -> None:
        for n in range(10):
            result = task.apply_async(("ann", f"{thread}-{n}"), countdown=60, **{mode: "hot"})
            with lock:
                ids.append(result.id)

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(ids) == 80
    assert len(set(ids)) == 1
    assert rd.stats()["delayed"] == 1


@pytest.mark.parametrize("key", ["{braces}", "with space", "ключ", "a:b:c", '"quoted"', "\n", "x" * 1000])
def test_keys_with_odd_characters(rd: RedisDelay, key: str) -> None:
    task = notify(rd)
    a = task.apply_async(("ann", "a"), countdown=60, unique_key=key)
    b = task.apply_async(("ann", "b"), countdown=60, unique_key=key)
    c = task.apply_async(("ann", "c"), countdown=60, debounce_key=key + "!")
    d = task.apply_async(("ann", "d"), countdown=60, debounce_key=key + "!")
    assert a.id == b.id
    assert c.id == d.id != a.id
    assert parked_args(rd, c.id) == ["ann", "d"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unique_key": "a", "debounce_key": "b"}, "not both"),
        ({"unique_key": ""}, "non-empty string"),
        ({"unique_key": 42}, "non-empty string"),
        ({"debounce_key": b"bytes"}, "non-empty string"),
    ],
)
def test_bad_keys_are_refused_at_the_call(rd: RedisDelay, options: dict[str, Any], message: str) -> None:
    task = notify(rd)
    with pytest.raises(ScheduleError, match=message):
        task.apply_async(("ann", "a"), countdown=60, **options)
    assert rd.stats()["delayed"] == 0


def test_reschedule_moves_a_parked_call_earlier_and_later(rd: RedisDelay) -> None:
    task = notify(rd)
    result = task.apply_async(("ann", "a"), countdown=3600)
    before = redis_now_ms(rd)
    assert rd.reschedule(result.id, countdown=5) is True
    assert before + 5000 <= rd.find(result.id).score_ms <= redis_now_ms(rd) + 5000  # type: ignore[union-attr]
    eta = datetime.now(UTC) + timedelta(days=2)
    assert rd.reschedule(result.id, eta=eta) is True
    assert rd.find(result.id).score_ms == int(eta.timestamp() * 1000)  # type: ignore[union-attr]
    assert parked_args(rd, result.id) == ["ann", "a"]


def test_reschedule_keeps_the_unique_key(rd: RedisDelay) -> None:
    task = notify(rd)
    first = task.apply_async(("ann", "a"), countdown=3600, unique_key="k")
    assert rd.reschedule(first.id, countdown=60)
    assert task.apply_async(("ann", "b"), countdown=1, unique_key="k").id == first.id


def test_reschedule_of_a_call_that_is_no_longer_parked(rd: RedisDelay) -> None:
    task = notify(rd)
    released = task.apply_async(("ann", "a"), countdown=0)
    assert rd.tick()["released"] == 1
    assert rd.reschedule(released.id, countdown=10) is False
    assert rd.find(released.id).state == "inflight"  # type: ignore[union-attr]
    assert rd.reschedule("no-such-id", countdown=10) is False


@pytest.mark.parametrize(
    "options", [{}, {"countdown": -math.inf}, {"countdown": float("nan")}, {"countdown": 1, "eta": datetime.now(UTC)}]
)
def test_reschedule_refuses_a_bad_due_time(rd: RedisDelay, options: dict[str, Any]) -> None:
    task = notify(rd)
    result = task.apply_async(("ann", "a"), countdown=60)
    due = rd.find(result.id).score_ms  # type: ignore[union-attr]
    with pytest.raises(ScheduleError):
        rd.reschedule(result.id, **options)
    assert rd.find(result.id).score_ms == due  # type: ignore[union-attr]
