"""Leases on real workers under each of Celery's pools (``tests/pool_proj.py``): a worker SIGKILLed while it
runs a call and holds prefetched ones loses none of them, and another worker runs them all once their leases
run out; a run several leases long on a live worker is delivered once. Short leases keep the tests short;
``python -m bench --only recovery`` measures the same with the default lease."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from celery_redisdelay.testing import RedisServer, wait_for
from tests.pool_run import PoolRun, pool_worker

pytestmark = pytest.mark.e2e

POOLS = [("prefork", 1), ("threads", 1), ("solo", 1), ("gevent", 1), ("eventlet", 1)]
POOL_IDS = [pool for pool, _ in POOLS]
#: Seconds: short leases, renewed often (the defaults are 30 and 10).
SHORT = {"redisdelay_lease": 3.0, "redisdelay_lease_renewal": 0.5}
PREFETCHED = 50


@pytest.mark.parametrize(("pool", "concurrency"), POOLS, ids=POOL_IDS)
def test_a_killed_workers_calls_run_again_on_another_worker(
    redis_server: RedisServer, pool: str, concurrency: int
) -> None:
    with pool_worker(
        redis_server,
        pool,
        concurrency=concurrency,
        hostname="first@%h",
        redisdelay_precise_release=True,
        worker_prefetch_multiplier=PREFETCHED + 10,  # the worker holds every call it can while one runs
        **SHORT,
    ) as run:
        key = f"{run.prefix}:runs"
        first = run.worker
        long = run.task("pools.sleep").apply_async((key, 600.0))
        wait_for(lambda: any(n["at"] == "start" for n in run.notes(key)), 30, "the long call to start")
        record = run.task("pools.sleep")
        quick = [record.apply_async((key, 0.0)).id for _ in range(PREFETCHED)]
        wait_for(lambda: run.rd.stats()["delayed"] == 0, 30, "the quick calls to be released")
        broker = redis.Redis.from_url(run.conf["broker_url"])
        # A prefork or threads worker fetches what it may prefetch while its one slot runs the long call; solo's
        # consumer, and gevent's and eventlet's with a pool of one, wait for the slot: the calls stay queued,
        # but for one the consumer may have popped just before the kill and not held yet, which the sweep
        # takes back a lease after kombu noted it (sweep.lua).
        if pool in ("prefork", "threads"):
            wait_for(lambda: broker.llen(run.conf["task_default_queue"]) == 0, 30, "the worker to fetch them all")
            wait_for(
                lambda: all((held(run, i) or "").startswith("first@") for i in [long.id, *quick]),
                30,
                "the worker to hold every call it has",
            )
        first.kill()
        run.marks.set(f"{key}:sleep", 0)  # the long call, run again, ends at once
        run.worker = run.new_worker("second@%h").start()
        wait_for(lambda: "ready." in run.worker.output(), 60, "the second worker to be ready")

        def on_second() -> set[str]:
            return {n["id"] for n in run.notes(key) if n["worker"].startswith("second@")}

        try:
            wait_for(lambda: on_second() >= {long.id, *quick}, 90, "every call of the killed worker to run again")
        except TimeoutError:
            missing = {call_id: where(run, call_id) for call_id in {long.id, *quick} - on_second()}
            raise AssertionError(f"not run on the second worker: {missing}") from None
        wait_for(lambda: run.rd.stats()["delayed"] == 0, 30, "nothing parked")
        starts = run.starts_by_worker(key)
        assert starts[long.id] == ["first", "second"], "the run cut short runs again"
        assert all(starts[call_id] == ["second"] for call_id in quick), "a call that never started runs once"
        first.remove_files()
        broker.close()


@pytest.mark.parametrize(("pool", "concurrency"), POOLS, ids=POOL_IDS)
def test_a_run_longer_than_its_lease_on_a_live_worker_is_delivered_once(
    redis_server: RedisServer, pool: str, concurrency: int
) -> None:
    lease = {"redisdelay_lease": 1.5, "redisdelay_lease_renewal": 0.3}
    with pool_worker(redis_server, pool, concurrency=concurrency, redisdelay_precise_release=True, **lease) as run:
        key = f"{run.prefix}:runs"
        call = run.task("pools.sleep").apply_async((key, 6.0))  # four leases long
        wait_for(lambda: any(n["at"] == "end" for n in run.notes(key)), 60, "the run to end")
        wait_for(run.settled, 30, "the call to be acknowledged")
        notes = run.notes(key)
        assert [(n["id"], n["at"]) for n in notes] == [(call.id, "start"), (call.id, "end")], notes
        assert notes[0]["delivery"] == 1


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_the_calls_a_worker_with_a_stuck_event_loop_has_not_started_run_on_another_worker(
    redis_server: RedisServer, pool: str
) -> None:
    # The worker's event loop gets stuck receiving a call, while a long call runs and another waits behind it.
    # Its lease thread still renews; without a watch on the loop it would hold the waiting call for as long as
    # the worker lives. The call runs on a second worker once a lease has passed without a turn of the loop.
    unstall = f"stall-{pool}-{threading.get_ident()}-{id(redis_server)}"
    with pool_worker(
        redis_server,
        pool,
        concurrency=1,
        hostname="first@%h",
        redisdelay_precise_release=True,
        stall_loop_on=["pools.record", unstall],
        worker_prefetch_multiplier=10,
        **SHORT,
    ) as run:
        key = f"{run.prefix}:runs"
        first = run.worker
        sleep = run.task("pools.sleep")
        long = sleep.apply_async((key, 600.0))
        wait_for(lambda: any(n["at"] == "start" for n in run.notes(key)), 30, "the long call to start")
        waiting = sleep.apply_async((key, 0.0))
        wait_for(lambda: (held(run, waiting.id) or "").startswith("first@"), 30, "the first worker to hold it")
        stalls = run.task("pools.record").apply_async((key, "stalls the loop"))
        try:
            wait_for(lambda: run.marks.get(f"{unstall}:taken"), 30, "the first worker's loop to get stuck")
        except TimeoutError:
            raise AssertionError(where(run, stalls.id)) from None
        run.worker = run.new_worker("second@%h").start()
        try:
            wait_for(
                lambda: run.starts_by_worker(key).get(waiting.id) == ["second"],
                60,
                "the waiting call to run on the second worker",
            )
            assert "has not turned for" in first.output()
            assert "in on_received" in first.output(), "the log shows where the loop is stuck"
            assert run.starts_by_worker(key)[long.id] == ["first"], "the running call stays where it runs"
        finally:
            run.marks.set(unstall, 1)
            first.kill()
            first.stop()
            first.remove_files()


def where(run: Any, call_id: str) -> tuple[str, dict[str, Any]] | None:
    """A call's state and metadata, for a failure's message."""
    found = run.rd.find(call_id)
    return None if found is None else (found.state, dict(found.meta))


def held(run: Any, call_id: str) -> str | None:
    """The worker holding a call, from its metadata."""
    found = run.rd.find(call_id)
    return None if found is None else found.meta.get("h")


def test_a_worker_with_a_bad_lease_setting_refuses_to_start(redis_server: RedisServer) -> None:
    run = PoolRun(redis_server, "solo", 1, {"redisdelay_lease": 5.0})
    run.worker.start()
    try:
        process = run.worker.process
        assert process is not None
        wait_for(lambda: process.poll() is not None, 60, "the worker to refuse to start")
        assert process.returncode != 0
        assert "redisdelay_lease (5 s) must be longer than redisdelay_lease_renewal (10 s)" in run.worker.output()
    finally:
        run.close()
        run.worker.remove_files()


def test_a_call_never_parked_costs_no_redis_call_on_the_worker(redis_server: RedisServer) -> None:
    """In all-tasks mode without tracking, a run of a plain task's call sent due now (as Celery sends it) makes no
    Redis call of ours: no lease, no start, no acknowledgement. A parked call's run makes them, as the control."""
    with pool_worker(
        redis_server,
        "threads",
        concurrency=2,
        redisdelay_all_tasks=True,
        redisdelay_track_due_now=False,
        redisdelay_precise_release=True,
        **SHORT,
    ) as run:
        key = f"{run.prefix}:runs"
        seen: list[str] = []
        monitor = redis.Redis.from_url(f"{redis_server.url}/0")
        stop = threading.Event()

        def watch() -> None:
            with monitor.monitor() as commands:
                for command in commands.listen():
                    seen.append(str(command.get("command", "")))
                    if stop.is_set():
                        return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        wait_for(lambda: seen, 10, "MONITOR to start")
        record = run.task("plain.record")
        now = [record.apply_async((key, n)).id for n in range(20)]
        parked = record.apply_async((key, "parked"), countdown=0.5).id
        wait_for(lambda: len(run.notes(key)) >= 21, 60, "every call to run")
        wait_for(run.settled, 30, "the parked call to be acknowledged")
        stop.set()
        run.marks.ping()  # a last command, so the watcher sees the stop
        watcher.join(10)
        monitor.close()
        ours = [command for command in seen if "EVALSHA" in command.upper()]
        assert any(parked in command for command in ours), "the parked call is leased, started and acknowledged"
        assert not [command for command in ours if any(call_id in command for call_id in now)]
