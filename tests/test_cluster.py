"""The call store on a local 3-master Redis Cluster (cluster bus on explicit ports), the broker standalone.

kombu has no Redis Cluster transport, so the broker stays a single Redis; the store's shards spread over
the cluster's masters, and releases go through kombu (the fast path needs the broker on the store's
server). Needs a redis-server with ``--cluster-port`` (Redis 7.0): skipped on older binaries.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from celery_redisdelay import RedisDelay
from celery_redisdelay.testing import RedisServer
from celery_redisdelay.testing.topologies import LocalCluster
from tests import topology_proj

SHARDS = 3


@pytest.fixture
def cluster_conf(local_cluster: LocalCluster, redis_server: RedisServer) -> dict[str, Any]:
    return {
        "broker_url": f"{redis_server.url}/0",
        "redisdelay_url": local_cluster.url.replace("redis://", "redis+cluster://"),
        "redisdelay_shards": SHARDS,
        "redisdelay_key_prefix": f"cl-{uuid.uuid4().hex[:6]}",
        "task_default_queue": f"cl-queue-{uuid.uuid4().hex[:6]}",
    }


@pytest.fixture
def on_cluster(cluster_conf: dict[str, Any]) -> Iterator[RedisDelay]:
    app, rd = topology_proj.make_app(cluster_conf, name=f"cl{uuid.uuid4().hex[:4]}")
    yield rd
    app.close()


def echo_on(rd: RedisDelay) -> Any:
    @rd.delayed(name=f"tests.cluster.echo.{uuid.uuid4().hex[:6]}")
    def echo(n: int) -> int:
        return n

    return echo


def queued_ids(rd: RedisDelay, redis_server: RedisServer) -> set[str]:
    broker = redis.Redis.from_url(f"{redis_server.url}/0")
    try:
        return {json.loads(raw)["headers"]["id"] for raw in broker.lrange(rd.app.conf.task_default_queue, 0, -1)}
    finally:
        broker.close()


def test_the_store_is_a_cluster_client_and_its_shards_are_on_three_masters(
    on_cluster: RedisDelay, local_cluster: LocalCluster
) -> None:
    assert isinstance(on_cluster.client, RedisCluster)
    assert not on_cluster.fast_release, "the broker is not on the store's server"
    nodes = {
        local_cluster.node_for_slot(on_cluster.client.keyslot(store.keys.delayed)) for store in on_cluster.shards.stores
    }
    assert len(nodes) == SHARDS
    for store in on_cluster.shards.stores:
        assert len({on_cluster.client.keyslot(key) for key in store.keys.store_keys}) == 1


def test_every_operation_runs_on_the_cluster(on_cluster: RedisDelay, redis_server: RedisServer) -> None:
    rd = on_cluster
    echo = echo_on(rd)
    due = {echo.apply_async((n,), countdown=0).id for n in range(60)}
    due |= {result.id for result in echo.park_many([(n,) for n in range(1500)], countdown=0)}
    later = [echo.apply_async((n,), countdown=3600).id for n in range(9)]
    unique = echo.apply_async((1,), countdown=3600, unique_key="u")
    assert echo.apply_async((2,), countdown=3600, unique_key="u").id == unique.id
    debounced = {echo.apply_async((n,), countdown=3600, debounce_key="d").id for n in range(3)}
    assert len(debounced) == 1
    assert rd.cancel(later[0]) and rd.reschedule(later[1], countdown=7200)
    assert rd.shards.home(later[2]).bury(later[2], "by hand") and rd.requeue(later[2])
    due.add(later[2])

    @rd.batched(name=f"tests.cluster.batch.{uuid.uuid4().hex[:6]}", size=2, max_wait=3600)
    def trucks(key: str, items: list[int]) -> None:
        return None

    flushed = [trucks.add(f"k{n % 3}", n) for n in range(6)]
    due |= {result.id for result in flushed if result is not None}
    with rd.lock("order:1", timeout=10) as held:
        assert held.owned
    report = rd.tick()
    assert report["released"] == len(due) == 1564
    assert queued_ids(rd, redis_server) == due
    some = sorted(due)[:20]
    for call_id in some:
        assert rd.shards.first(call_id, lambda store, i=call_id: store.start(i, 60_000))
        assert rd.shards.first(call_id, lambda store, i=call_id: store.ack(i))
    stats = rd.stats()
    assert (stats["inflight"], stats["delayed"]) == (1564 - 20, 7 + 1 + 1)


@pytest.mark.e2e
def test_a_validation_run_on_the_cluster_loses_nothing(
    cluster_conf: dict[str, Any], on_cluster: RedisDelay, redis_server: RedisServer
) -> None:
    topology_proj.validate_with_worker_and_beat(cluster_conf, on_cluster, 300, timeout=3)


def test_a_node_that_is_down_stops_only_its_shard(cluster_conf: dict[str, Any], local_cluster: LocalCluster) -> None:
    # A second app whose tick meets a shard it cannot reach must still release the other shards'
    # calls and report the failure; here one shard's key is made unusable instead of killing a node.
    app, rd = topology_proj.make_app(cluster_conf, name="cl-broken")
    try:
        echo = echo_on(rd)
        ids = [echo.apply_async((n,), countdown=0).id for n in range(30)]
        broken = rd.shards.stores[1]
        rd.client.delete(broken.keys.inflight)
        rd.client.set(broken.keys.inflight, "not a zset")
        with pytest.raises(Exception, match="WRONGTYPE"):
            rd.tick()
        healthy = [i for i in ids if rd.shards.home(i) is not broken]
        assert all(rd.find(i).state == "inflight" for i in healthy)  # type: ignore[union-attr]
    finally:
        app.close()


def test_limits_hold_on_the_cluster(on_cluster: RedisDelay, redis_server: RedisServer) -> None:
    """A task's calls under a concurrency limit are stored on one shard (its limit's), and the release, through
    kombu since the broker is elsewhere, lets out no more than the limit; per key, each key's calls on its own."""
    rd = on_cluster

    @rd.delayed(name=f"tests.cluster.limited.{uuid.uuid4().hex[:6]}", limit_concurrency=2)
    def limited(n: int) -> int:
        return n

    @rd.delayed(name=f"tests.cluster.keyed.{uuid.uuid4().hex[:6]}", limit_concurrency=1, limit_key="k{key}")
    def keyed(key: int) -> int:
        return key

    calls = [limited.delay(n).id for n in range(6)]
    assert len({rd.shards.home(call_id).keys.tag for call_id in calls}) == 1
    per_key = [keyed.delay(key).id for key in range(12) for _ in range(2)]
    assert len({rd.shards.home(call_id).keys.tag for call_id in per_key}) > 1  # the keys spread over the shards
    rd.tick()
    queued = queued_ids(rd, redis_server)
    assert len(queued & set(calls)) == 2
    assert len(queued & set(per_key)) == 12
    assert rd.stats()["limited"] == 4 + 12
