"""The extension under each of Celery's worker pools, on real worker processes (``tests/pool_proj.py``)."""

from __future__ import annotations

import os
import signal

import pytest

from celery_redisdelay.testing import CeleryProcess, RedisServer, beat, wait_for
from tests.pool_run import ROOT, children_of, pool_worker

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("hold_lock", [False, True], ids=["as-it-comes", "lock-held-at-each-fork"])
def test_prefork_replaces_pool_processes_while_the_precise_releaser_runs(
    redis_server: RedisServer, hold_lock: bool
) -> None:
    # Each pool process runs one task and is replaced: a fork of the worker's main process per call, while
    # the releaser thread in that process runs release scripts on the store's pool. A child forked while
    # a thread of the parent held the pool's lock used to block for good at its first task; the second run
    # makes every fork happen so. The calls wait in their list longer than the 6 s lease (a fork per call): a
    # sweep that took a call a worker had just popped, its take still on the way, for a lost one delivered it again
    # (every note must be delivery 1; it failed 2 runs of 2 so before the fix in sweep.lua).
    calls = 120 if not hold_lock else 40
    with pool_worker(
        redis_server,
        "prefork",
        redisdelay_precise_release=True,
        worker_max_tasks_per_child=1,
        redisdelay_visibility_timeout=600,  # a hung child's call would not come back within the test
        hold_store_lock_at_fork=hold_lock,
        redisdelay_lease=6,
        redisdelay_lease_renewal=2,
    ) as run:
        record = run.task("pools.record")
        key = f"{run.prefix}:ran"
        ids = {record.apply_async((key, n), countdown=n * 0.03).id for n in range(calls)}
        wait_for(lambda: run.marks.llen(key) >= calls, 180, f"{calls} calls to run, each in a new pool process")
        wait_for(run.settled, 30, "every call to be acknowledged")
        notes = run.notes(key)
        assert {note["id"] for note in notes} == ids
        assert all(note["delivery"] == 1 for note in notes)
        assert len({note["pid"] for note in notes}) >= calls // 2
        assert len(children_of(run.worker.pid)) <= 2


#: Celery's pools, with a concurrency each runs at here.
POOLS = [("prefork", 2), ("threads", 4), ("solo", 1), ("gevent", 10), ("eventlet", 10)]
POOL_IDS = [pool for pool, _ in POOLS]


@pytest.mark.parametrize(("pool", "concurrency"), POOLS, ids=POOL_IDS)
def test_every_feature_under_each_pool(redis_server: RedisServer, pool: str, concurrency: int) -> None:
    # The precise releaser runs in the worker (a thread, or a greenlet under gevent and eventlet).
    with pool_worker(redis_server, pool, concurrency=concurrency, redisdelay_precise_release=True) as run:
        key = f"{run.prefix}:features"
        tracked = run.task("pools.record").apply_async((key, "tracked"), countdown=0.3)
        parent = run.task("pools.park_from_task").apply_async((key, 0.3))
        touched = run.task("pools.touching").apply_async((key, 3.0))  # runs past its 2 s visibility timeout
        abandoned = run.task("pools.abandon_once").apply_async((key,))  # the sweep brings it back after 1 s
        revoked = run.task("pools.record").apply_async((key, "revoked"), countdown=30)
        run.app.control.revoke(revoked.id)
        with run.rd.lock("pools:7", timeout=30):
            locked = run.task("pools.locked").apply_async((key, 7))
            wait_for(lambda: run.state(locked.id) == "deferred", 30, "the locked call to be deferred")
        wait_for(lambda: run.rd.find(revoked.id) is None, 30, "the worker to drop the revoked call for good")
        wait_for(lambda: len(run.notes(key)) >= 6, 60, "six runs")
        wait_for(run.settled, 30, "every call to be acknowledged")
        notes = run.notes(key)
        by_id = {note["id"]: note for note in notes}
        child = by_id[parent.id]["parked"]
        assert set(by_id) == {tracked.id, parent.id, child, touched.id, abandoned.id, locked.id}
        assert len(notes) == 6, "no call ran twice"
        assert by_id[tracked.id]["delivery"] == by_id[child]["delivery"] == by_id[touched.id]["delivery"] == 1
        assert by_id[abandoned.id]["delivery"] == 2, "abandoned once, delivered again"
        assert (by_id[abandoned.id]["redelivered"], by_id[abandoned.id]["count"]) == (True, 1), "and it says so"
        assert run.rd.stats()["dead"] == 0


@pytest.mark.parametrize(("pool", "concurrency"), POOLS, ids=POOL_IDS)
def test_release_by_beat_and_by_the_releaser_process_under_each_pool(
    redis_server: RedisServer, pool: str, concurrency: int
) -> None:
    with pool_worker(redis_server, pool, concurrency=concurrency) as run:
        for name, process in (
            ("beat", beat("tests.pool_proj", env=run.env, cwd=str(ROOT))),
            ("releaser", CeleryProcess("tests.pool_proj", ["redisdelay", "releaser"], run.env, str(ROOT))),
        ):
            key = f"{run.prefix}:{name}"
            with process:
                ids = {run.task("pools.record").apply_async((key, n), countdown=0.5).id for n in range(20)}
                wait_for(lambda key=key: run.marks.llen(key) >= 20, 60, f"20 calls released by {name}")
                wait_for(run.settled, 30, "every call to be acknowledged")
            notes = run.notes(key)
            assert {note["id"] for note in notes} == ids and len(notes) == 20
            process.remove_files()


def test_prefork_replaces_children_over_their_memory_limit_and_those_killed(redis_server: RedisServer) -> None:
    # worker_max_memory_per_child of 1 KiB: every pool process is over it after a task and is replaced.
    with pool_worker(redis_server, "prefork", redisdelay_precise_release=True, worker_max_memory_per_child=1) as run:
        key = f"{run.prefix}:memory"
        ids = {run.task("pools.record").apply_async((key, n), countdown=n * 0.02).id for n in range(30)}
        wait_for(lambda: run.marks.llen(key) >= 30, 60, "30 calls, each in a new pool process")
        notes = run.notes(key)
        assert {note["id"] for note in notes} == ids and len(notes) == 30
        assert len({note["pid"] for note in notes}) >= 10

        # A pool process killed mid-run: Celery records WorkerLostError and the call is finished as Celery
        # sees it (not delivered again); the processes that replace it run the next calls.
        killed = f"{run.prefix}:killed"
        running = run.task("pools.touching").apply_async((killed, 30.0))
        wait_for(lambda: run.state(running.id) == "running", 30, "the long call to start")
        for child in children_of(run.worker.pid):
            os.kill(child, signal.SIGKILL)
        wait_for(lambda: run.rd.find(running.id) is None, 30, "the lost call to be finished")
        after = f"{run.prefix}:after"
        later = {run.task("pools.record").apply_async((after, n), countdown=0.2).id for n in range(5)}
        wait_for(lambda: run.marks.llen(after) >= 5, 60, "the replacements to run the next calls")
        wait_for(run.settled, 30, "every call to be acknowledged")
        assert {note["id"] for note in run.notes(after)} == later
        assert run.notes(killed) == [], "the killed run is not delivered again"


def test_the_chaos_runners_watch_sees_a_pool_process_blocked_on_a_lock(redis_server: RedisServer) -> None:
    # What the chaos runner counts as a hung process (chaos/hung.py): a pool process whose every thread waits
    # on a futex for good. A task that blocks on a lock it holds stands in for one forked with a held lock.
    from chaos import hung

    with pool_worker(redis_server, "prefork", concurrency=2) as run:
        watch = hung.HungWatch(lambda: [("worker", run.worker.pid)])
        assert watch.finish() == [], "idle pool processes wait on their pipe, not on a lock"
        run.task("pools.hang").delay()
        wait_for(lambda: any(hung.blocked_on_a_lock(pid) for pid in children_of(run.worker.pid)), 30, "the block")
        watch = hung.HungWatch(lambda: [("worker", run.worker.pid)])
        found = watch.finish()
        assert [row["worker_pid"] for row in found] == [run.worker.pid]
