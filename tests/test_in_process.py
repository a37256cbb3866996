"""A delayed task tested in-process, as a Celery user tests tasks: the ``celery_config`` and ``celery_app``
fixtures (celery.contrib.pytest, which the pytest-celery plugin provides; its own fixtures start
Docker containers, so they are not used here) and Celery's in-process worker (a thread).

No beat, no tick: the worker releases the calls it runs as they fall due (``redisdelay_precise_release``, on by
default), as it does outside the tests.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker

from celery_redisdelay import RedisDelay, patching
from celery_redisdelay.testing import wait_for
from celery_redisdelay.worker import tracking
from celery_redisdelay.worker.leases import Leases


@pytest.fixture(scope="session")
def celery_config(redis_server: Any) -> dict[str, Any]:
    """The configuration of ``celery_app``: the session's redis-server as broker, store and results."""
    return {
        "broker_url": f"{redis_server.url}/11",
        "result_backend": f"{redis_server.url}/12",
        "redisdelay_key_prefix": f"in-process-{uuid.uuid4().hex[:8]}",
    }


@pytest.fixture
def delayed_app(celery_app: Any) -> Iterator[tuple[Any, RedisDelay, Any]]:
    rd = RedisDelay(celery_app)

    @rd.delayed(name="tests.in_process.add")
    def add(x: int, y: int) -> int:
        return x + y

    with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        yield celery_app, rd, add


def test_a_delayed_task_runs_on_the_in_process_worker(delayed_app: tuple[Any, RedisDelay, Any]) -> None:
    _, rd, add = delayed_app
    result = add.apply_async((2, 3), countdown=0.2)
    # The state read from the backend, not get(): Celery 5.3's Redis result consumer can miss a result
    # published while it subscribes (the same with a plain task), and this test is run with it too.
    wait_for(lambda: result.state == "SUCCESS", 30, "the worker thread to run the call")
    assert result.result == 5
    # The result is stored before task_postrun, where the worker thread acknowledges the call.
    wait_for(lambda: rd.find(result.id) is None, 10, "the worker thread's acknowledgement")


def test_a_run_names_its_worker_as_the_leases_do_where_celerys_request_says_another_host(
    celery_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery's in-process worker is named ``gen<pid>@<host>`` and its requests say the bare host. A run's start
    names the worker its leases name: named after the request, the call was held by "another worker" whenever
    the start came before the lease's take, so its lease was never renewed and a requeued copy of it
    (``Reject(requeue=True)``) was dropped as stale, the call waiting for its lease (celery-suite's
    ``test_reject_with_requeue_redelivers_and_succeeds``)."""
    rd = RedisDelay(celery_app)
    gate, seen = threading.Event(), {}

    @rd.delayed(name="tests.in_process.whose")
    def whose() -> None:
        seen["request"] = whose.request.hostname
        gate.wait(30)

    # The lease's take never comes, as when the start is written first: the start alone names the holder.
    monkeypatch.setattr(Leases, "received", lambda self, call_id, tag: None)
    with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=10) as worker:
        result = whose.apply_async(countdown=0)  # released by the worker's own releaser
        try:
            wait_for(
                lambda: (entry := rd.find(result.id)) is not None and entry.meta.get("s") == "running",
                30,
                "the run's start",
            )
            entry = rd.find(result.id)
            assert entry is not None and seen["request"] != worker.hostname
            assert entry.meta.get("h") == worker.hostname
        finally:
            gate.set()
        wait_for(lambda: rd.find(result.id) is None, 10, "the run's acknowledgement")


def test_a_call_waits_until_it_is_due(delayed_app: tuple[Any, RedisDelay, Any]) -> None:
    _, rd, add = delayed_app
    later = add.apply_async((1, 1), countdown=3600)
    assert rd.tick()["released"] == 0, "nothing due, for the tick as for the worker's releaser"
    assert later.state == "PENDING" and rd.find(later.id).state == "delayed"  # type: ignore[union-attr]


def test_the_precise_releaser_of_an_in_process_worker_stops_with_it(make_app: Any) -> None:
    """Celery's in-process worker stops cold (``start_worker`` ends it by ``should_terminate``): its releaser
    thread ends with it, and does not go on releasing calls for a worker that is gone."""
    app, _ = make_app(redisdelay_precise_release=True)
    before = set(threading.enumerate())
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        wait_for(
            lambda: any(t.name == "redisdelay-releaser" for t in set(threading.enumerate()) - before),
            10,
            "the worker's releaser thread",
        )
        releasers = [t for t in set(threading.enumerate()) - before if t.name == "redisdelay-releaser"]
    wait_for(lambda: not any(t.is_alive() for t in releasers), 15, "the releaser thread to end with its worker")


def test_the_patches_go_on_in_their_stated_order_and_come_off(celery_app: Any) -> None:
    """What the extension changes of Celery's and kombu's objects, a real worker's included, is in
    ``patching.ORDER``, goes on in that order, and comes off again, leaving Celery's own."""
    celery_app.conf.redisdelay_park_received = True
    rd = RedisDelay(celery_app)

    @rd.delayed(name="tests.in_process.patched")
    def patched() -> None: ...

    assert [patch.name for patch in patching.applied(celery_app)] == ["send_task"]
    task = celery_app.tasks["tests.in_process.patched"]
    with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=10) as worker:
        result = patched.apply_async(countdown=0)
        wait_for(lambda: result.state == "SUCCESS", 30, "the worker thread to run the call")
        qos = worker.consumer.task_consumer.channel.qos
        on_qos = [patch.name for patch in patching.applied(qos)]
        on_task = [patch.name for patch in patching.applied(task)]
        assert on_qos == ["qos.broker_loss", "qos.unacked"]
        assert on_task == ["strategy.received", "strategy.stale", "strategy.paused"]
        assert on_task + on_qos == [name for name in patching.ORDER if name in on_task + on_qos]
        assert patching.undo(qos) == ["qos.unacked", "qos.broker_loss"]
        assert not {"ack", "reject", "append", "restore_unacked"} & set(vars(qos))  # kombu's own methods again
    assert patching.undo(task) == ["strategy.paused", "strategy.stale", "strategy.received"]
    assert "Strategy" not in vars(task) and task.Strategy == type(task).Strategy
    assert patching.undo(celery_app) == ["send_task"]
    assert celery_app.send_task.__func__ is type(celery_app).send_task
    # The tracking handlers, connected under a dispatch_uid of their depot, come off the same way.
    assert tracking.disconnect(rd.depot) == len(tracking.SIGNALS)
    assert tracking.disconnect(rd.depot) == 0
    patching.apply("strategy.stale", task, {"Strategy": None})
    with pytest.raises(ValueError, match="must go on before"):
        patching.apply("strategy.received", task, {"Strategy": None})
    with pytest.raises(ValueError, match="already applied"):
        patching.apply("strategy.stale", task, {"Strategy": None})
    patching.undo(task)
    with pytest.raises(ValueError, match="unknown patch"):
        patching.apply("elsewhere", task, {"Strategy": None})
