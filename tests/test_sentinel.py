"""The store behind Sentinel (one master, one replica, one sentinel on loopback), including a failover.

The end-to-end test kills the master in the middle of a validation run, with the broker on the same
Sentinel-managed Redis (kombu's ``sentinel://`` transport), and the store found from the broker URL.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_redisdelay import NotReplicatedError, RedisDelay
from celery_redisdelay.operations.validation import ValidationReport, run_validation
from celery_redisdelay.settings import Settings
from celery_redisdelay.testing import CeleryProcess, RedisServer, beat, kill_group, wait_for, worker
from celery_redisdelay.testing.topologies import LocalSentinel
from tests import topology_proj
from tests.conftest import ROOT


def echo_on(rd: RedisDelay) -> Any:
    @rd.delayed(name=f"tests.sentinel.echo.{uuid.uuid4().hex[:6]}")
    def echo(n: int) -> int:
        return n

    return echo


def test_the_store_url_comes_from_a_sentinel_broker() -> None:
    settings = Settings.from_conf(
        {
            "broker_url": "sentinel://:secret@10.0.0.1:26379;sentinel://10.0.0.2:26380/3",
            "broker_transport_options": {"master_name": "mymaster"},
        }
    )
    # As kombu reads it: every sentinel of the list, credentials and database from the first URL only
    # (tests/test_broker_urls.py checks this against kombu's own channel).
    assert settings.url == "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/mymaster/0"
    assert settings.connection_options == {"password": "secret", "min_other_sentinels": 0}


def test_a_sentinel_broker_without_master_name_is_refused() -> None:
    from celery_redisdelay import ConfigurationError

    with pytest.raises(ConfigurationError, match="master_name"):
        Settings.from_conf({"broker_url": "sentinel://10.0.0.1:26379"})


def test_the_store_follows_a_failover(sentinel: LocalSentinel, redis_server: RedisServer) -> None:
    app, rd = topology_proj.make_app(
        {
            "broker_url": f"{redis_server.url}/0",
            "redisdelay_url": sentinel.sentinel_url,
            "redisdelay_key_prefix": f"st-{uuid.uuid4().hex[:6]}",
            "task_default_queue": f"st-queue-{uuid.uuid4().hex[:6]}",
        },
        name="sentinel-store",
    )
    try:
        echo = echo_on(rd)
        before = [echo.apply_async((n,), countdown=0).id for n in range(50)]
        old = sentinel.master_port()
        rd.client.wait(1, 5000)  # replicated before the switch: a planned failover loses nothing
        new = sentinel.failover()
        assert new != old
        after = wait_for(lambda: _park_or_none(echo), 30, "a park on the new master")
        rest = [echo.apply_async((n,), countdown=0).id for n in range(49)]
        assert rd.tick()["released"] == 100
        assert rd.stats()["inflight"] == 100
        assert all(rd.find(i) is not None for i in [*before, after, *rest])
    finally:
        app.close()


def test_after_a_failover_the_parks_direct_connection_is_on_the_new_master(
    sentinel: LocalSentinel, redis_server: RedisServer
) -> None:
    """The connection a thread keeps for its parks (store/evalsha.py), once the failover disconnected it, connects
    again through the Sentinel: to the new master, not to the old one (now a replica, where every park would be
    refused and made again on another connection)."""
    app, rd = topology_proj.make_app(
        {
            "broker_url": f"{redis_server.url}/0",
            "redisdelay_url": sentinel.sentinel_url,
            "redisdelay_key_prefix": f"sd-{uuid.uuid4().hex[:6]}",
            "task_default_queue": f"sd-queue-{uuid.uuid4().hex[:6]}",
        },
        name="sentinel-direct",
    )
    try:
        echo = echo_on(rd)
        echo.apply_async((0,), countdown=0)
        direct = rd.depot.store._scripts._direct["park"].connections
        assert direct.get().port == sentinel.master_port()
        rd.client.wait(1, 5000)
        new = sentinel.failover()
        wait_for(lambda: _park_or_none(echo), 30, "a park on the new master")
        for n in range(3):
            echo.apply_async((n,), countdown=0)
        assert direct.get().port == new
    finally:
        app.close()


def _park_or_none(echo: Any) -> str | None:
    try:
        return str(echo.apply_async((0,), countdown=0).id)
    except Exception:  # noqa: BLE001 - the old connection's error, until the client finds the new master
        return None


@pytest.mark.e2e
@pytest.mark.timeout(480)  # its own waits: a third of the run 120 s, the promotion 60 s, the rest 240 s
def test_validation_loses_nothing_when_the_master_dies_mid_run(sentinel: LocalSentinel) -> None:
    conf = {
        "broker_url": sentinel.kombu_broker_url,
        "broker_transport_options": sentinel.kombu_transport_options,
        "redisdelay_key_prefix": f"sv-{uuid.uuid4().hex[:6]}",
        "task_default_queue": f"sv-queue-{uuid.uuid4().hex[:6]}",
    }
    env = {topology_proj.ENV: json.dumps(conf), "PYTHONPATH": str(ROOT)}
    app, rd = topology_proj.make_app(conf, name="sentinel-validation")
    assert rd.settings.url.startswith("redis+sentinel://")
    processes = {
        "worker": worker("tests.topology_proj", concurrency=2, env=env, cwd=str(ROOT)),
        "beat": beat("tests.topology_proj", env=env, cwd=str(ROOT)),
    }
    for process in processes.values():
        process.start()
    reports: list[ValidationReport] = []
    halfway = threading.Event()

    def progress(done: int, total: int) -> None:
        if done >= total // 3:
            halfway.set()

    def validate() -> None:
        reports.append(run_validation(rd, 600, fail_every=2, timeout=2, deadline=240, progress=progress))

    runner = threading.Thread(target=validate, daemon=True)
    restarts = 0
    killed: RedisServer | None = None
    try:
        wait_for(lambda: "ready." in processes["worker"].output(), 60, "the worker to be ready")
        runner.start()
        assert halfway.wait(120), "the run did not get a third of the way"
        old = sentinel.master_port()
        killed = next(server for server in sentinel.servers if server.port == old)
        assert killed.process is not None
        kill_group(killed.process)  # a crash: no time to hand over
        wait_for(lambda: _promoted_away_from(sentinel, old), 60, "the sentinel to promote the replica")
        deadline = time.monotonic() + 240
        while runner.is_alive() and time.monotonic() < deadline:
            # A supervisor's job: the failover can make a worker exit (see the README's Limits).
            restarts += _restart_exited(processes)
            runner.join(0.5)
        logs = "\n".join(p.output()[-3000:] for p in processes.values())
        assert reports, f"the validation did not finish\n{logs}"
        [report] = reports
        assert report.ok and not report.timed_out, f"{report}\n{logs}"
        assert report.processed == 600 and report.failures >= 300
        print(f"failover mid-run: {report.as_dict()}, processes restarted: {restarts}")
    finally:
        for process in processes.values():
            process.stop()
            process.remove_files()
        app.close()
        if killed is not None:
            killed.start()  # back as a replica of the new master, for the module's other tests


def _promoted_away_from(sentinel: LocalSentinel, old: int) -> bool:
    try:
        return sentinel.master_port() != old
    except (redis.RedisError, LookupError):
        return False


def _restart_exited(processes: dict[str, CeleryProcess]) -> int:
    restarted = 0
    for process in processes.values():
        if process.process is not None and process.process.poll() is not None:
            process.stop()
            process.start()
            restarted += 1
    return restarted


# -- parks confirmed by replicas (redisdelay_wait_replicas) -------------------------------------------


@pytest.fixture
def master_and_replica() -> Iterator[tuple[RedisServer, RedisServer]]:
    master = RedisServer().start()
    replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    try:
        with redis.Redis(port=replica.port) as client:
            wait_for(lambda: client.info("replication")["master_link_status"] == "up", 30, "the replica's link")
        yield master, replica
    finally:
        replica.stop()
        master.stop()


def test_a_park_returns_once_the_replica_has_it(master_and_replica: tuple[RedisServer, RedisServer]) -> None:
    master, replica = master_and_replica
    conf = {"broker_url": f"{master.url}/0", "redisdelay_wait_replicas": 1, "redisdelay_key_prefix": "durable"}
    app, rd = topology_proj.make_app(conf, name="durable")
    try:
        echo = echo_on(rd)

        @rd.batched(name="tests.sentinel.trucks", size=2, max_wait=60)
        def trucks(key: str, items: list[int]) -> None:
            return None

        parked = [echo.apply_async((n,), countdown=60).id for n in range(20)]
        parked += [result.id for result in echo.park_many([(n,) for n in range(50)], countdown=60)]
        trucks.add("k", 1)
        flushed = trucks.add("k", 2)
        assert flushed is not None
        parked.append(flushed.id)
        with redis.Redis(port=replica.port) as copy:
            # No waiting here: WAIT returned only when the replica had every one of them.
            assert all(copy.hexists(rd.store.keys.payloads, call_id) for call_id in parked)

        replica.terminate()
        with pytest.raises(NotReplicatedError, match="0 of 1 replicas confirmed it within 1000 ms"):
            echo.apply_async((99,), countdown=60, task_id="unconfirmed")
        assert rd.find("unconfirmed") is not None, "it is stored on the master all the same"
    finally:
        app.close()


def test_waiting_for_replicas_is_refused_on_a_cluster(local_cluster: Any, redis_server: RedisServer) -> None:
    from celery_redisdelay import ConfigurationError

    conf = {
        "broker_url": f"{redis_server.url}/0",
        "redisdelay_url": local_cluster.url.replace("redis://", "redis+cluster://"),
        "redisdelay_wait_replicas": 1,
    }
    app, rd = topology_proj.make_app(conf, name="durable-cluster")
    try:
        with pytest.raises(ConfigurationError, match="redisdelay_wait_replicas"):
            _ = rd.shards
    finally:
        app.close()
