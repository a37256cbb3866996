"""A worker survives a restart of the store it also uses as its broker.

Redis is SIGKILLed and started again on the same port under a running worker (``tests/pool_proj.py``) with no
supervisor, while the worker runs a call and holds two more unacknowledged with a BRPOP in flight: there Celery 5.7
closes its lost connection twice, and kombu's Redis channel raises on the second close (``AttributeError:
'NoneType' object has no attribute 'hostname'``, see :mod:`celery_redisdelay.worker.broker_loss`), which ended the
worker. The worker must stay alive and run the calls sent after each restart. The same sequence, in this process,
checks the guard itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection

from celery_redisdelay.testing import RedisServer, wait_for
from celery_redisdelay.testing.processes import kill_group
from celery_redisdelay.worker.broker_loss import guard
from tests.pool_run import PoolRun, pool_worker

RESTARTS = 3
LOST = "Connection to broker lost"


@pytest.fixture
def store() -> Iterator[RedisServer]:
    """A Redis of the test's own, as the test kills it (the session's serves the other tests)."""
    server = RedisServer().start()
    yield server
    server.stop()


def kill_and_start(server: RedisServer) -> None:
    """SIGKILL the server, as a crash would (nothing is saved), and start it again on the same port."""
    assert server.process is not None
    kill_group(server.process)
    server.process.wait(10)
    server.process = None
    server.start()


def runs(run: PoolRun, key: str, timeout: float) -> None:
    """Send a call and wait for it to run; fail at once if the worker exits meanwhile."""
    value = uuid.uuid4().hex
    run.task("pools.record").apply_async((key, value))

    def ran() -> bool:
        process = run.worker.process
        assert process is not None and process.poll() is None, f"the worker exited:\n{run.output()}"
        return any(note.get("value") == value for note in run.notes(key))

    wait_for(ran, timeout, "a call sent after the restart to run")


def sees_losses(run: PoolRun, count: int) -> None:
    """Wait for the worker to log its ``count``-th lost connection."""
    wait_for(lambda: run.worker.output().count(LOST) >= count, 30, f"the worker to see restart {count}")


def hold_calls(run: PoolRun, key: str, broker: redis.Redis) -> None:
    """Have the worker run a 2 s call and hold two more unacknowledged (its one slot is busy), with room to fetch
    more: its BRPOP is in flight."""
    long = run.task("pools.sleep").apply_async((key, 2.0))
    wait_for(lambda: any(n.get("id") == long.id for n in run.notes(key)), 30, "the long call to start")
    for _ in range(2):
        run.task("pools.sleep").apply_async((key, 0.0))
    wait_for(lambda: broker.llen(run.conf["task_default_queue"]) == 0, 30, "the worker to fetch the two calls")


@pytest.mark.e2e
@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_worker_consumes_again_after_the_store_is_killed_and_started_again(store: RedisServer, pool: str) -> None:
    with pool_worker(
        store,
        pool,
        concurrency=1,
        worker_prefetch_multiplier=4,  # room to hold two calls and still wait in BRPOP for more
        redisdelay_all_tasks=True,
        redisdelay_precise_release=True,
        redisdelay_lease=3.0,  # short, so that the last check below outlasts one
        redisdelay_lease_renewal=0.5,
    ) as run:
        key = f"{run.prefix}:runs"
        broker = redis.Redis.from_url(run.conf["broker_url"])  # redis-py connects again after each restart
        for restart in range(1, RESTARTS + 1):
            runs(run, key, 30)
            hold_calls(run, key, broker)
            kill_and_start(store)
            sees_losses(run, restart)
        runs(run, key, 30)
        # The event loop still notes its turns for the leases after the reconnections (Celery before 5.7 clears
        # its timer on each): a call that outlasts a lease, with one waiting behind it, and no stall is seen.
        last = run.task("pools.sleep").apply_async((key, 4.0))
        runs(run, key, 30)
        wait_for(lambda: sum(n.get("id") == last.id for n in run.notes(key)) == 2, 30, "the 4 s call to end")
        broker.close()
        output = run.worker.output()
        assert "Unrecoverable error" not in output, output[-6000:]
        assert output.count(LOST) == RESTARTS
        assert "has not turned" not in output, output[-6000:]


def test_a_guarded_channel_closed_after_its_transport_raises_nothing(redis_server: RedisServer) -> None:
    """Celery 5.7's sequence on a lost connection, on a real kombu channel: ``collect()``, where the task channel
    fails to close (kombu 5.7 reads its BRPOP's reply first, which raises) and so does the remote-control channel
    made after it (deleting its fanout queue raises), which ends the transport's own round of closing; then
    ``close()``; then a message received before is acknowledged, and one rejected."""
    connection = Connection(f"{redis_server.url}/0")
    channel = connection.default_channel
    assert guard(channel) and guard(channel)  # once
    qos = channel.qos
    qos._delivered.update({"held": object(), "running": object()})
    fails_once(channel)
    fails_once(connection.channel())
    connection.collect(socket_timeout=1)
    assert channel.connection is not None and channel.connection.client is None and not channel.closed
    connection.close()  # unguarded: AttributeError: 'NoneType' object has no attribute 'hostname'
    assert channel.closed and not qos._delivered
    qos.ack("running")  # unguarded: AttributeError: 'NoneType' object has no attribute 'client'
    qos.reject("running", requeue=True)


def fails_once(channel: Any) -> None:
    """The channel's first ``close()`` raises the connection error of a broker that is gone, before it does
    anything; the next closes it."""
    kombu_close, calls = channel.close, []

    def close() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise redis.ConnectionError("Connection closed by server.")
        kombu_close()

    channel.close = close
