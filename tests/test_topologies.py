"""Smoke tests of the local Redis topologies (cluster, sentinel, TLS) against real redis-server processes, with
plain redis-py. What the binary cannot run is skipped with the reason it gives."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry
from redis.sentinel import Sentinel

from celery_redisdelay.testing import kill_group, wait_for
from celery_redisdelay.testing.capabilities import cluster_binary
from celery_redisdelay.testing.topologies import (
    HOST,
    LocalCluster,
    LocalSentinel,
    LocalTLS,
    TopologyUnavailable,
    cluster_slot_ranges,
)

Topology = TypeVar("Topology", LocalCluster, LocalSentinel, LocalTLS)


def running(topology: Topology) -> Iterator[Topology]:
    try:
        topology.start()
    except TopologyUnavailable as exc:
        pytest.skip(str(exc))
    yield topology
    topology.stop()


def once(port: int, **options: object) -> redis.Redis:
    """A client that tries once and gives up quickly."""
    return redis.Redis(host=HOST, port=port, socket_timeout=5, retry=Retry(NoBackoff(), 0), **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    yield from running(LocalCluster(binary=cluster_binary()))


@pytest.fixture
def cluster_client(cluster: LocalCluster) -> Iterator[redis.cluster.RedisCluster]:
    client = cluster.client()
    yield client
    client.close()


@pytest.fixture(scope="module")
def sentinel() -> Iterator[LocalSentinel]:
    yield from running(LocalSentinel())


@pytest.fixture(scope="module")
def tls() -> Iterator[LocalTLS]:
    yield from running(LocalTLS(username="delay", password=uuid.uuid4().hex))


def tag_in(first: int, last: int) -> str:
    return next(tag for tag in (f"t{n}" for n in range(100_000)) if first <= key_slot(f"{{{tag}}}".encode()) <= last)


# -- cluster ------------------------------------------------------------------------------------


def test_the_slots_are_split_as_redis_cli_does() -> None:
    assert cluster_slot_ranges(3) == [(0, 5460), (5461, 10922), (10923, 16383)]
    assert cluster_slot_ranges(1) == [(0, 16383)]


def test_keys_in_a_hundred_slots_round_trip(cluster_client: redis.cluster.RedisCluster) -> None:
    keys: dict[int, str] = {}
    for n in range(10_000):
        key = f"round-trip:{uuid.uuid4().hex[:6]}:{n}"
        keys.setdefault(key_slot(key.encode()), key)
        if len(keys) == 100:
            break
    for slot, key in keys.items():
        cluster_client.set(key, slot)
    assert {slot: cluster_client.get(key) for slot, key in keys.items()} == {slot: str(slot).encode() for slot in keys}


def test_each_third_of_the_slots_is_served_by_its_own_node(
    cluster: LocalCluster, cluster_client: redis.cluster.RedisCluster
) -> None:
    serving = []
    for index, (first, last) in enumerate(cluster_slot_ranges(3)):
        key = f"{{{tag_in(first, last)}}}:third"
        cluster_client.set(key, index)
        host, port = cluster.node_for_slot(key_slot(key.encode()))
        assert (host, port) == (HOST, cluster.ports[index])
        with once(port) as node:
            assert node.get(key) == str(index).encode()
        serving.append(port)
    assert len(set(serving)) == 3


def test_a_script_with_two_keys_of_one_hash_tag(cluster_client: redis.cluster.RedisCluster) -> None:
    tag = uuid.uuid4().hex[:8]
    script = "redis.call('set', KEYS[1], ARGV[1]); redis.call('set', KEYS[2], ARGV[2])"
    script += "; return redis.call('mget', KEYS[1], KEYS[2])"
    keys = [f"{{{tag}}}:a", f"{{{tag}}}:b"]
    assert cluster_client.eval(script, 2, *keys, "one", "two") == [b"one", b"two"]
    assert cluster_client.mget(keys) == [b"one", b"two"]


# -- sentinel -----------------------------------------------------------------------------------


def test_the_sentinel_addresses(sentinel: LocalSentinel) -> None:
    port, name = sentinel.sentinel_port, sentinel.master_name
    assert sentinel.sentinel_url == f"redis+sentinel://127.0.0.1:{port}/{name}/0"
    assert sentinel.kombu_broker_url == f"sentinel://127.0.0.1:{port}/0"
    assert sentinel.kombu_transport_options == {"master_name": name}


@contextlib.contextmanager
def master_client(sentinel: LocalSentinel) -> Iterator[redis.Redis]:
    """A client of the master the Sentinel names, as an application makes one."""
    watcher = Sentinel([(HOST, sentinel.sentinel_port)], socket_timeout=5)  # type: ignore[no-untyped-call]
    client: redis.Redis = watcher.master_for(sentinel.master_name, socket_timeout=5)  # type: ignore[no-untyped-call]
    try:
        yield client
    finally:
        client.close()
        for node in watcher.sentinels:
            node.close()


def test_a_failover_keeps_replicated_writes_and_takes_new_ones(sentinel: LocalSentinel) -> None:
    key = f"failover:{uuid.uuid4().hex}"
    with master_client(sentinel) as before:
        before.set(key, "before")
        assert before.wait(1, 1000) == 1

    old = sentinel.master_port()
    new = sentinel.failover()

    assert new != old
    assert sentinel.master_port() == new
    with master_client(sentinel) as after, once(new) as promoted, once(old) as demoted:
        assert promoted.role()[0] == b"master"
        assert demoted.role()[0] == b"slave"
        assert after.get(key) == b"before"
        after.set(key, "after")
        assert after.wait(1, 1000) == 1
        assert (promoted.get(key), demoted.get(key)) == (b"after", b"after")


@pytest.fixture
def three_sentinels() -> Iterator[LocalSentinel]:
    yield from running(LocalSentinel(sentinels=3, data_args=["--appendonly", "yes", "--appendfsync", "everysec"]))


def test_three_sentinels_fail_over_a_killed_master_and_take_it_back_as_a_replica(
    three_sentinels: LocalSentinel,
) -> None:
    group = three_sentinels
    ports = group.sentinel_ports
    assert (len(set(ports)), group.quorum) == (3, 2)
    assert group.sentinel_url == f"redis+sentinel://{','.join(f'127.0.0.1:{p}' for p in ports)}/redisdelay/0"
    assert group.kombu_broker_url.split(";") == [f"sentinel://127.0.0.1:{port}/0" for port in ports]
    old = group.master_port()
    with once(old) as master:
        master.set("acknowledged", "yes")
        assert master.wait(1, 1000) == 1
        assert master.config_get("appendonly") == {"appendonly": "yes"}
    killed = group.node(old)
    assert killed.process is not None
    kill_group(killed.process)  # a crash: no time to hand over
    killed.process.wait(10)

    def promoted() -> bool:
        for index in range(3):
            with group.sentinel_client(index) as sentinel:
                if int(sentinel.sentinel_get_master_addr_by_name("redisdelay")[1]) == old:
                    return False
        return True

    wait_for(promoted, 60, "every sentinel to name the promoted replica")
    assert group.master_port() != old
    group.rejoin(old)
    # Under load the Sentinels may fail over once more, to the rejoined node: either way one master, whose replica
    # has everything acknowledged, and takes new writes.
    new = group.master_port()
    old = next(port for port in group.data_ports if port != new)
    with once(new) as promoted_node, once(old) as rejoined:
        assert promoted_node.role()[0] == b"master"
        assert rejoined.role()[0] == b"slave"
        assert promoted_node.get("acknowledged") == b"yes"
        promoted_node.set("after", "yes")
        # The link is up, but a replica acknowledges what it has applied only when asked or once a second: on a
        # busy machine one WAIT of a second can end first. Each WAIT asks again.
        wait_for(lambda: promoted_node.wait(1, 1000) == 1, 30, "the rejoined replica to acknowledge the write")
        assert rejoined.get("after") == b"yes"


# -- TLS ----------------------------------------------------------------------------------------


def test_tls_with_the_ca_and_the_acl_user(tls: LocalTLS) -> None:
    with tls.client() as client:
        assert client.ping()
        assert client.acl_whoami() == "delay"
    with redis.Redis.from_url(tls.url, **tls.ssl_options) as client:
        assert client.set("tls", "yes")
        assert client.get("tls") == b"yes"


def test_a_plain_connection_is_refused(tls: LocalTLS) -> None:
    with once(tls.port) as client, pytest.raises(redis.ConnectionError):
        client.ping()


@pytest.mark.parametrize("credentials", [{}, {"username": "delay", "password": "wrong"}, {"password": "any"}])
def test_tls_without_the_acl_user_fails_authentication(tls: LocalTLS, credentials: dict[str, str]) -> None:
    with once(tls.port, ssl=True, **tls.ssl_options, **credentials) as client, pytest.raises(redis.AuthenticationError):
        client.ping()


def test_tls_with_another_ca_fails_verification(tls: LocalTLS, tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    options = {"ssl": True, "ssl_cert_reqs": "required", "ssl_ca_certs": str(other)}
    client = once(tls.port, username=tls.username, password=tls.password, **options)
    with client, pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        client.ping()
