"""Metrics kept by the scripts, the Prometheus exporter, and the start-up checks of the configuration."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery, signals

from celery_redisdelay import RedisDelay
from celery_redisdelay.operations.metrics import serve, snapshot
from celery_redisdelay.store.layout import LATENESS_BOUNDS_MS
from celery_redisdelay.testing import RedisServer, free_port, stop_process, wait_for
from tests.conftest import ROOT

MakeApp = Callable[..., tuple[Celery, RedisDelay]]


def echo_on(rd: RedisDelay) -> Any:
    @rd.delayed(name=f"tests.metrics.echo.{uuid.uuid4().hex[:6]}")
    def echo(n: int) -> int:
        return n

    return echo


def push_back(rd: RedisDelay, client: redis.Redis, call_id: str, late_ms: int) -> None:
    """Make a parked call due ``late_ms`` ago, by the Redis clock."""
    seconds, micros = client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    client.zadd(rd.shards.home(call_id).keys.delayed, {call_id: now - late_ms})


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "kombu-path"])
def test_totals_count_each_change_once(make_app: MakeApp, client: redis.Redis, fast: bool) -> None:
    _, rd = make_app(redisdelay_shards=2, redisdelay_fast_release=fast, redisdelay_max_deliveries=1)
    echo = echo_on(rd)
    ids = [echo.apply_async((n,), countdown=3600).id for n in range(10)]
    for call_id, late in zip(ids, (0, 0, 0, 7, 7, 300, 300, 300, 4000, 90_000), strict=True):
        push_back(rd, client, call_id, late)
    assert rd.tick()["released"] == 10
    for call_id in ids[:4]:
        assert rd.shards.first(call_id, lambda store, i=call_id: store.ack(i))
    for call_id in ids[4:6]:  # out of deliveries: the sweep dead-letters them
        store = rd.shards.home(call_id)
        client.zadd(store.keys.inflight, {call_id: 0})
    for call_id, outcome in ((ids[6], "revoked"), (ids[7], "expired")):  # discarded unrun by a worker
        assert rd.shards.first(call_id, lambda store, i=call_id, o=outcome: store.ack(i, o))
    assert rd.cancel(echo.apply_async((10,), countdown=3600).id)
    rd.tick()
    shot = snapshot(rd.depot)
    assert shot.totals == {
        "parked": 11,
        "released": 10,
        "swept": 0,
        "dead_lettered": 2,
        "worker_lost": 0,  # no run was cut short with its worker
        "acked": 4,
        "revoked": 1,
        "expired": 1,
        "cancelled": 1,
        "batches_flushed": 0,
        "lock_deferrals": 0,
        "lock_takeovers": 0,
        "limited": 0,
    }
    assert shot.states["inflight"] == 2 and shot.states["dead"] == 2
    cumulative = dict(shot.lateness_buckets)
    # Lateness is measured from each due time to the release, so each call is at least as late as set.
    assert cumulative[float("inf")] == 10
    assert cumulative[0.005] <= 3
    assert cumulative[0.25] <= 5 and cumulative[0.5] >= 8 - 3
    assert cumulative[LATENESS_BOUNDS_MS[-1] / 1000] == 9, "the call 90 s late is only in the last bucket"
    assert shot.lateness_sum_seconds >= (7 * 2 + 300 * 3 + 4000 + 90_000) / 1000


def test_sweeps_batches_and_deferrals_are_counted(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app()

    @rd.batched(name=f"tests.metrics.batch.{uuid.uuid4().hex[:6]}", size=2, max_wait=3600)
    def trucks(key: str, items: list[int]) -> None:
        return None

    echo = echo_on(rd)
    for n in range(5):
        trucks.add("depot", n)
    call = echo.apply_async((1,), countdown=0)
    rd.tick()
    client.zadd(rd.keys.inflight, {call.id: 0})
    rd.tick()
    with rd.lock("order:1", timeout=30):
        status, _ = rd.store.lock_take("order:1", "other", 1000, call.id, 1000)
    shot = snapshot(rd.depot)
    assert shot.totals["batches_flushed"] == 2
    assert shot.totals["swept"] == 1
    assert (status, shot.totals["lock_deferrals"]) == (0, 1)
    assert shot.states["batch_items"] == 1


def test_the_exporter_serves_prometheus_text(make_app: MakeApp, client: redis.Redis) -> None:
    pytest.importorskip("prometheus_client")
    _, rd = make_app()
    echo = echo_on(rd)
    for n in range(3):
        echo.apply_async((n,), countdown=0)
    echo.apply_async((9,), countdown=3600)
    rd.tick()
    port = free_port()
    server = serve(rd.depot, port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            page = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    lines = set(page.splitlines())
    assert 'redisdelay_calls{state="delayed"} 1.0' in lines
    assert 'redisdelay_calls{state="inflight"} 3.0' in lines
    assert "redisdelay_released_total 3.0" in lines
    assert 'redisdelay_release_lateness_seconds_bucket{le="+Inf"} 3.0' in lines
    assert "redisdelay_release_lateness_seconds_count 3.0" in lines


def test_the_exporter_command_serves_until_sigterm(redis_server: RedisServer) -> None:
    pytest.importorskip("prometheus_client")
    port = free_port()
    env = {**os.environ, "REDISDELAY_TEST_URL": redis_server.url, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "celery", "-A", "tests.proj", "redisdelay", "exporter", "--port", str(port)]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        page = wait_for(lambda: _scrape(port), 60, "the exporter to answer")
        assert "redisdelay_calls{" in page and "redisdelay_release_lateness_seconds_bucket" in page
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        stop_process(process)
    assert process.returncode == 0, output
    assert b"redisdelay exporter: stopped" in output


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return None


# -- start-up checks ----------------------------------------------------------------------------


def test_a_run_longer_than_the_broker_visibility_timeout_is_reported(make_app: MakeApp) -> None:
    _, rd = make_app(broker_transport_options={"visibility_timeout": 600})

    @rd.delayed(name="tests.metrics.long", acks_late=True, timeout=1800)
    def long_job() -> None:
        return None

    @rd.delayed(name="tests.metrics.short", acks_late=True, timeout=60)
    def short_job() -> None:
        return None

    [problem] = [p for p in rd.check_config() if "acks_late" in p]
    assert "tests.metrics.long" in problem and "tests.metrics.short" not in problem
    assert "1800 s" in problem and "600 s" in problem


def test_a_queue_timeout_shorter_than_the_broker_visibility_timeout_is_reported(make_app: MakeApp) -> None:
    _, rd = make_app(redisdelay_queue_timeout=60)
    [problem] = rd.check_config()
    assert "redisdelay_queue_timeout (60 s)" in problem and "3600 s" in problem
    _, fine = make_app()
    assert fine.check_config() == []


@pytest.mark.parametrize(
    "broker",
    ["list of URLs", "redis+socket", "write URL"],
)
def test_the_check_knows_a_redis_broker_as_kombu_does(make_app: MakeApp, redis_server: Any, broker: str) -> None:
    url = f"{redis_server.url}/0"
    conf: dict[str, Any] = {
        "list of URLs": {"broker_url": [url, url]},
        "redis+socket": {"broker_url": "redis+socket:///tmp/redis.sock"},
        "write URL": {"broker_url": url, "broker_read_url": url},
    }[broker]
    _, rd = make_app(redisdelay_url=url, redisdelay_queue_timeout=60, **conf)
    [problem] = rd.check_config()
    assert "redisdelay_queue_timeout (60 s)" in problem
    _, memory = make_app(broker_url="memory://", redisdelay_url=url, redisdelay_queue_timeout=60)
    assert memory.check_config() == [], "no Redis transport, no visibility timeout"


def test_problems_are_logged_when_a_worker_starts(make_app: MakeApp, caplog: pytest.LogCaptureFixture) -> None:
    app, _ = make_app(redisdelay_queue_timeout=60)

    class Sender:
        pass

    sender = Sender()
    sender.app = app  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="celery_redisdelay.extension"):
        signals.worker_ready.send(sender=sender)
    assert any("redisdelay_queue_timeout (60 s)" in record.getMessage() for record in caplog.records)
