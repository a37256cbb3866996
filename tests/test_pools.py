"""The extension under each of Celery's worker pools, on real worker processes (``tests/pool_proj.py``)."""

from __future__ import annotations

import pytest

from celery_redisdelay.testing import RedisServer, wait_for
from tests.pool_run import children_of, pool_worker

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("hold_lock", [False, True], ids=["as-it-comes", "lock-held-at-each-fork"])
def test_prefork_replaces_pool_processes_while_the_precise_releaser_runs(
    redis_server: RedisServer, hold_lock: bool
) -> None:
    # Each pool process runs one task and is replaced: a fork of the worker's main process per call, while
    # the releaser thread in that process runs release scripts on the store's pool. A child forked while
    # a thread of the parent held the pool's lock used to block for good at its first task; the second run
    # makes every fork happen so.
    calls = 120 if not hold_lock else 40
    with pool_worker(
        redis_server,
        "prefork",
        redisdelay_precise_release=True,
        worker_max_tasks_per_child=1,
        redisdelay_visibility_timeout=600,  # a hung child's call would not come back within the test
        hold_store_lock_at_fork=hold_lock,
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
