"""``redisdelay_shards`` on one redis-server: calls spread over shards, and everything still finds them.

The same code runs on a Redis Cluster (``test_cluster.py``); here every shard is on one server, so the
tests can look at every key directly.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery
from redis.crc import key_slot

from celery_redisdelay import ConfigurationError, RedisDelay, ScheduleError
from celery_redisdelay.release.precise import PreciseReleasers
from celery_redisdelay.store.shards import shard_of, shard_tags
from celery_redisdelay.testing import wait_for

MakeApp = Callable[..., tuple[Celery, RedisDelay]]


def queued_ids(client: redis.Redis, rd: RedisDelay) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(rd.app.conf.task_default_queue, 0, -1)]


def echo_on(rd: RedisDelay) -> Any:
    @rd.delayed(name=f"tests.shards.echo.{uuid.uuid4().hex[:6]}")
    def echo(n: int) -> int:
        return n

    return echo


def held_by(rd: RedisDelay, client: redis.Redis) -> dict[str, set[str]]:
    """For each shard tag, the ids in its delayed, in-flight and dead sets."""
    held: dict[str, set[str]] = {}
    for store in rd.shards.all():
        ids: set[str] = set()
        for key in (store.keys.delayed, store.keys.inflight, store.keys.dead):
            ids |= {member.decode() for member in client.zrange(key, 0, -1)}
        held[store.keys.tag] = ids
    return held


@pytest.mark.parametrize("count", [2, 3, 5, 16])
def test_shard_tags_spread_over_the_slot_space_in_order(count: int) -> None:
    tags = shard_tags("app", count)
    slots = [key_slot(f"{{{tag}}}:delayed".encode()) for tag in tags]
    assert [slot * count // 16384 for slot in slots] == list(range(count))
    assert len(set(tags)) == count
    assert shard_tags("app", 1) == ["app"], "one shard keeps the unsharded key names"


def test_calls_spread_over_shards_and_each_lives_in_its_home(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_shards=3)
    echo = echo_on(rd)
    ids = [echo.apply_async((n,), countdown=3600).id for n in range(300)]
    held = held_by(rd, client)
    sizes = [len(held[store.keys.tag]) for store in rd.shards.stores]
    assert min(sizes) > 50, f"uneven spread: {sizes}"
    for call_id in ids:
        assert call_id in held[rd.shards.home(call_id).keys.tag]
    assert rd.stats()["delayed"] == 300


def test_tick_releases_every_shard_and_acks_find_the_call(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_shards=3)
    echo = echo_on(rd)
    ids = {echo.apply_async((n,), countdown=0).id for n in range(120)}
    many = echo.park_many([(n,) for n in range(2500)], countdown=0)
    ids |= {result.id for result in many}
    assert rd.tick()["released"] == 2620
    assert set(queued_ids(client, rd)) == ids
    for call_id in list(ids)[:50]:
        assert rd.shards.first(call_id, lambda store, i=call_id: store.ack(i))
    assert rd.stats()["inflight"] == 2570


def test_releasers_that_own_a_shard_each_release_only_their_own(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_shards=3)
    echo = echo_on(rd)
    ids = [echo.apply_async((n,), countdown=0).id for n in range(90)]
    by_shard = [{i for i in ids if rd.shards.home(i) is store} for store in rd.shards.stores]
    assert rd.tick(shards=[1])["released"] == len(by_shard[1])
    assert set(queued_ids(client, rd)) == by_shard[1]
    assert [store.stats()["delayed"] for store in rd.shards.stores] == [len(by_shard[0]), 0, len(by_shard[2])]
    owners = [PreciseReleasers(rd.releasers, longest_sleep=0.05, shards=[index]) for index in (0, 2)]
    assert [[r.store for r in owner.releasers] for owner in owners] == [[rd.shards.stores[0]], [rd.shards.stores[2]]]
    threads = [threading.Thread(target=owner.run, daemon=True) for owner in owners]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: rd.stats()["delayed"] == 0, 30, "the owners to release their shards")
    finally:
        for owner in owners:
            owner.stop()
        for thread in threads:
            thread.join(10)
    assert [owner.released for owner in owners] == [len(by_shard[0]), len(by_shard[2])]
    assert sorted(queued_ids(client, rd)) == sorted(ids)
    with pytest.raises(ConfigurationError, match="shard indexes must be 0 to 2"):
        rd.tick(shards=[3])


def test_park_many_puts_each_chunk_on_one_shard(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_shards=3)
    echo = echo_on(rd)
    results = echo.park_many([(n,) for n in range(2500)], countdown=60)
    homes = [rd.shards.home(result.id).keys.tag for result in results]
    chunks = [set(homes[start : start + 1000]) for start in range(0, 2500, 1000)]
    assert all(len(chunk) == 1 for chunk in chunks)
    assert len(set().union(*chunks)) == 3


def test_cancel_reschedule_find_and_requeue_across_shards(make_app: MakeApp) -> None:
    _, rd = make_app(redisdelay_shards=3)
    echo = echo_on(rd)
    ids = [echo.apply_async((n,), countdown=3600).id for n in range(30)]
    for call_id in ids[:10]:
        assert rd.cancel(call_id)
        assert rd.find(call_id) is None
    for call_id in ids[10:20]:
        assert rd.reschedule(call_id, countdown=7200)
        found = rd.find(call_id)
        assert found is not None and found.state == "delayed"
    for call_id in ids[20:]:
        assert rd.shards.home(call_id).bury(call_id, "by hand")
        assert rd.requeue(call_id)
    assert not rd.cancel("no-such-call") and not rd.reschedule("no-such-call", countdown=1)
    assert rd.stats() | {} == rd.stats() and rd.stats()["delayed"] == 20


def test_unique_and_debounce_keys_live_on_their_keys_shard(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_shards=3)
    echo = echo_on(rd)
    first = echo.apply_async((1,), countdown=3600, unique_key="order-7")
    again = echo.apply_async((2,), countdown=3600, unique_key="order-7")
    assert again.id == first.id
    debounced = [echo.apply_async((n,), countdown=3600, debounce_key="cart-9").id for n in range(5)]
    assert len(set(debounced)) == 1
    assert rd.stats()["delayed"] == 2
    for call_id, key in ((first.id, "order-7"), (debounced[0], "cart-9")):
        group = json.dumps([echo.name, key], separators=(",", ":"))
        store = rd.shards.for_name(group)
        assert rd.shards.home(call_id) is store
        assert client.hget(store.keys.index, group) == call_id.encode()


def test_a_task_id_on_another_shard_than_its_key_is_refused(make_app: MakeApp) -> None:
    _, rd = make_app(redisdelay_shards=3)
    echo = echo_on(rd)
    group = json.dumps([echo.name, "k"], separators=(",", ":"))
    wrong = next(i for i in (str(n) for n in range(100)) if rd.shards.home(i) is not rd.shards.for_name(group))
    with pytest.raises(ScheduleError, match="redisdelay_shards"):
        echo.apply_async((1,), countdown=60, unique_key="k", task_id=wrong)
    assert rd.stats()["delayed"] == 0


def test_batches_and_locked_calls_go_beside_their_key(make_app: MakeApp) -> None:
    _, rd = make_app(redisdelay_shards=3)

    @rd.batched(name=f"tests.shards.batch.{uuid.uuid4().hex[:6]}", size=3, max_wait=3600)
    def trucks(key: str, items: list[int]) -> None:
        return None

    @rd.delayed(name=f"tests.shards.locked.{uuid.uuid4().hex[:6]}", lock="order:{order}")
    def update(order: int) -> None:
        return None

    results = [trucks.add(f"depot-{n % 4}", n) for n in range(12)]
    flushed = [result for result in results if result is not None]
    assert len(flushed) == 4
    for result in flushed:
        key = f"depot-{int(results.index(result)) % 4}"
        group = json.dumps([trucks.name, key], separators=(",", ":"))
        assert rd.shards.home(result.id) is rd.shards.for_name(group)
    for order in range(20):
        call = update.apply_async((order,), countdown=60)
        assert rd.shards.home(call.id) is rd.shards.for_name(f"order:{order}")


def test_calls_parked_before_the_shard_count_changed_are_still_served(make_app: MakeApp, client: redis.Redis) -> None:
    app, before = make_app()
    prefix = app.conf.redisdelay_key_prefix
    echo = echo_on(before)
    old = [echo.apply_async((n,), countdown=0).id for n in range(40)]
    kept = echo.apply_async((99,), countdown=3600).id
    queue = app.conf.task_default_queue
    _, after = make_app(redisdelay_shards=3, redisdelay_key_prefix=prefix, task_default_queue=queue)
    echo_after = echo_on(after)
    new = [echo_after.apply_async((n,), countdown=0).id for n in range(40)]
    assert after.tick()["released"] == 80
    assert set(queued_ids(client, after)) == set(old) | set(new)
    assert after.find(kept) is not None and after.cancel(kept)
    # And back to one shard: the three shards are drained too.
    _, again = make_app(redisdelay_key_prefix=prefix, task_default_queue=queue)
    echo_again = echo_on(again)
    late = [echo_again.apply_async((n,), countdown=0).id for n in range(5)]
    for store in after.shards.stores:
        store.park(f"left-{store.keys.tag}", b"x", {"t": echo.name}, countdown_ms=0)
    report = again.tick()
    assert report["released"] + report["dead"] == 5 + 3
    assert set(late) <= set(queued_ids(client, again))


def test_precise_releasers_watch_every_shard(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_shards=3)
    echo = echo_on(rd)
    releasers = PreciseReleasers(rd.releasers, longest_sleep=30.0)
    thread = threading.Thread(target=releasers.run, daemon=True)
    thread.start()
    try:
        ids = {echo.apply_async((n,), countdown=0.2).id for n in range(30)}
        assert len({rd.shards.home(i).keys.tag for i in ids}) == 3
        wait_for(lambda: set(queued_ids(client, rd)) == ids, 10, "every shard's calls released")
    finally:
        releasers.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_shard_count_is_checked(make_app: MakeApp) -> None:
    from celery_redisdelay import ConfigurationError

    for bad in (0, -1, 1.5, "3", True, 5000):
        _, rd = make_app(redisdelay_shards=bad)
        with pytest.raises(ConfigurationError, match="redisdelay_shards"):
            _ = rd.shards
    assert shard_of("x", 1) == 0


def test_a_producer_that_never_ticked_still_registers_its_shards(make_app: MakeApp, client: redis.Redis) -> None:
    app, three = make_app(redisdelay_shards=3)
    prefix, queue = app.conf.redisdelay_key_prefix, app.conf.task_default_queue
    echo = echo_on(three)
    ids = {echo.apply_async((n,), countdown=0).id for n in range(12)}
    _, five = make_app(redisdelay_shards=5, redisdelay_key_prefix=prefix, task_default_queue=queue)
    assert five.tick()["released"] == 12
    assert set(queued_ids(client, five)) == ids
