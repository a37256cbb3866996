"""``task.park_many``: each call is stored as ``apply_async`` would store it, in one go."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redisdelay import ConfigurationError, PayloadError, RedisDelay
from celery_redisdelay.message.marks import RELEASED_HEADER
from celery_redisdelay.message.stored import decode_stored

MakeApp = Callable[..., tuple[Celery, RedisDelay]]


def task_on(rd: RedisDelay) -> Any:
    @rd.delayed(name="tests.bulk.add")
    def add(x: Any, y: Any, scale: int = 1) -> Any:
        return (x + y) * scale

    return add


def released_messages(rd: RedisDelay, client: redis.Redis) -> dict[str, dict[str, Any]]:
    while rd.tick()["released"]:
        pass
    raws = [raw for key in rd.broker_layout.list_keys(rd.app) for raw in client.lrange(key, 0, -1)]
    return {m["headers"]["id"]: m for m in (json.loads(raw) for raw in raws)}


def normalized(message: dict[str, Any]) -> dict[str, Any]:
    """A broker message without what differs from call to call: ids, delivery tag, expiry instant, release time."""
    headers = {k: v for k, v in message["headers"].items() if k not in ("id", "root_id", RELEASED_HEADER)}
    skip = ("delivery_tag", "correlation_id")
    properties = {k: v for k, v in message["properties"].items() if k not in skip}
    return {**message, "headers": headers, "properties": properties}


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "kombu path"])
def test_each_call_is_stored_as_apply_async_would(make_app: MakeApp, client: redis.Redis, fast: bool) -> None:
    _, rd = make_app(redisdelay_fast_release=None if fast else False)
    add = task_on(rd)
    results = add.park_many([(n, n + 1) for n in range(2500)], {"scale": 3}, countdown=0, priority=5)
    single = add.apply_async((7, 8), {"scale": 3}, countdown=0, priority=5)
    assert len({result.id for result in results}) == 2500
    assert rd.stats()["delayed"] == 2501
    envelope = decode_stored(rd.find(results[7].id).envelope)  # type: ignore[union-attr,arg-type]
    assert envelope.headers["id"] == envelope.headers["root_id"] == results[7].id
    assert envelope.headers["argsrepr"] == "(7, 8)"
    messages = released_messages(rd, client)
    assert set(messages) == {result.id for result in results} | {single.id}
    assert normalized(messages[results[7].id]) == normalized(messages[single.id])
    for n, result in enumerate(results):
        body = json.loads(base64.b64decode(messages[result.id]["body"]))
        assert body[:2] == [[n, n + 1], {"scale": 3}]


def test_bad_arguments_store_nothing(rd: RedisDelay) -> None:
    add = task_on(rd)
    with pytest.raises(PayloadError, match="none of the calls was parked"):
        add.park_many([(1, 2), (3, object()), (5, 6)], countdown=60)
    with pytest.raises(TypeError):
        add.park_many([(1, 2), (3,)], countdown=60)
    assert rd.stats()["delayed"] == 0


def test_a_call_whose_lock_its_arguments_cannot_name_stores_nothing_as_in_apply_async(rd: RedisDelay) -> None:
    @rd.delayed(name="tests.bulk.locked", lock="order:{items[0]}")
    def locked(items: list[int]) -> None: ...

    with pytest.raises(ConfigurationError, match="cannot be filled"):
        locked.apply_async(([],), countdown=60)
    with pytest.raises(ConfigurationError, match="cannot be filled"):
        locked.park_many([([1],), ([],), ([3],)], countdown=60)
    assert rd.stats()["delayed"] == 0


def test_keyed_calls_are_parked_one_by_one(rd: RedisDelay) -> None:
    add = task_on(rd)
    results = add.park_many([(1, 2), (3, 4)], countdown=60, unique_key="k")
    assert results[0].id == results[1].id
    assert rd.stats()["delayed"] == 1
    assert add.park_many([], countdown=60) == []


def test_eager_mode_runs_each_call(make_app: MakeApp) -> None:
    _, rd = make_app(task_always_eager=True)
    add = task_on(rd)
    assert [result.get() for result in add.park_many([(1, 2), (3, 4)])] == [3, 7]
