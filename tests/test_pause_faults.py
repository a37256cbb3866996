"""A pause under faults and pools (issue 45), on real processes (``tests/pool_proj.py``): it holds across a SIGKILL of
beat when beat's ticks release the calls, and a worker holds back the queued calls of a paused task under each of
Celery's pools. After the resume every held call runs, each once. See docs/pausing.rst."""

from __future__ import annotations

import importlib.util
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis

from celery_redisdelay.testing import CeleryProcess, RedisServer, beat, wait_for
from tests.pool_run import ROOT, PoolRun, pool_worker
from tests.test_pools import POOL_IDS, POOLS

pytestmark = pytest.mark.e2e

#: The pools whose package is not Celery's own.
POOL_PACKAGES = {"gevent": "gevent", "eventlet": "eventlet"}


def started_ids(run: PoolRun, key: str) -> list[str]:
    """The ids of the calls noted under ``key`` (``pools.record`` notes each run, ``pools.sleep`` its start)."""
    return [note["id"] for note in run.notes(key) if note.get("at", "start") == "start"]


def waiting(run: PoolRun) -> int:
    """The calls waiting on every pause of ``run``'s store."""
    return sum(one["waiting"] for one in run.rd.paused())


def none_started(run: PoolRun, key: str) -> None:
    """Fail at once, naming them, when a call of the paused task (noted under ``key``) has started."""
    started = started_ids(run, key)
    assert started == [], f"{len(started)} calls of a paused task started: {started}"


def ticks_sent(process: CeleryProcess) -> int:
    """How many ticks beat has sent, by its log (which a restarted beat appends to)."""
    return process.output().count("Sending due task redisdelay.tick")


def test_a_pause_holds_across_a_sigkill_of_beat(redis_server: RedisServer) -> None:
    """The release runs from beat's ticks (no precise releaser). Beat is SIGKILLed while calls of the paused task
    fall due, more calls park and fall due while it is down, and it starts again on its schedule file, as after a
    crash. No call of the paused task starts until the resume, the other task's calls run on, and after the resume
    every paused call runs once, as its first delivery: none lost, none twice."""
    with pool_worker(redis_server, "prefork", concurrency=2, redisdelay_precise_release=False) as run:
        scheduler = beat("tests.pool_proj", env=run.env, cwd=str(ROOT))
        try:
            record, sleep = run.task("pools.record"), run.task("pools.sleep")
            key, other = f"paused-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"
            scheduler.start()
            wait_for(lambda: ticks_sent(scheduler) >= 1, 60, "beat to send its first tick")
            run.rd.pause(task="pools.record", reason="incident")
            # Falling due over 6 s: beat is killed after the first few, with the rest still parked.
            before = [record.apply_async((key, i), countdown=0.3 + i * 0.3).id for i in range(20)]
            others = [sleep.apply_async((other, 0), countdown=0.3 + i * 1.2).id for i in range(5)]

            def put_aside(count: int) -> bool:
                none_started(run, key)
                return waiting(run) >= count

            wait_for(lambda: put_aside(3), 30, "beat's ticks to put 3 calls aside")
            scheduler.kill()
            scheduler.stop()  # closes its log; the process is gone already
            sent_before_the_kill = ticks_sent(scheduler)
            assert waiting(run) < len(before), "the kill came while calls of the paused task were still falling due"
            # While beat is down nothing releases: these fall due and stay in the delay set.
            during = [record.apply_async((key, 100 + i), countdown=0.1 + i * 0.1).id for i in range(10)]
            others += [sleep.apply_async((other, 0), countdown=0.1).id for _ in range(3)]
            wait_for(lambda: run.rd.stats()["due"] >= 13, 30, "the calls parked while beat is down to fall due")
            none_started(run, key)
            scheduler.start()  # on the schedule file of the killed beat, which a SIGKILL may have left half-written
            wait_for(lambda: ticks_sent(scheduler) > sent_before_the_kill, 60, "the new beat to send a tick")
            wait_for(lambda: put_aside(30), 30, "every call of the paused task to wait on the pause")
            wait_for(lambda: sorted(started_ids(run, other)) == sorted(others), 30, "the other task's calls to run")
            none_started(run, key)
            assert run.rd.stats()["due"] == 0, "the new beat releases: nothing due is left behind"
            resumed_at_ms = time.time() * 1000
            assert run.rd.resume(task="pools.record")
            wait_for(lambda: len(started_ids(run, key)) >= 30, 60, "every paused call to run after the resume")
            wait_for(run.settled, 30, "the store to settle")  # nothing left parked or in flight to run again
            notes = run.notes(key)
            assert sorted(note["id"] for note in notes) == sorted(before + during), "none lost, each once"
            assert min(note["at_ms"] for note in notes) >= resumed_at_ms, "none before the resume"
            assert all(note["delivery"] == 1 for note in notes), "released once, at the resume"
            assert run.rd.paused() == []
        except BaseException:
            print(scheduler.output()[-6000:])
            raise
        finally:
            scheduler.stop()
            scheduler.remove_files()


@pytest.mark.parametrize(("pool", "concurrency"), POOLS, ids=POOL_IDS)
def test_a_worker_holds_back_the_queued_calls_of_a_paused_task_under_each_pool(
    redis_server: RedisServer, pool: str, concurrency: int
) -> None:
    """Calls in the broker's queue when their tasks are paused (released ones, and ones Celery sent itself), then
    more that Celery sends to the running worker: under each pool the worker takes them and puts them aside in the
    store, unrun, while another task's calls run. After the resume each runs once."""
    package = POOL_PACKAGES.get(pool)
    if package is not None and importlib.util.find_spec(package) is None:
        pytest.skip(f"the {pool} pool needs the {package} package, which is not installed")
    with pool_worker(
        redis_server,
        pool,
        concurrency=concurrency,
        start=False,
        redisdelay_all_tasks=True,
        redisdelay_track_due_now=False,  # the plain calls due now take Celery's own path, into the broker's queue
    ) as run:
        record, plain, sleep = run.task("pools.record"), run.task("plain.record"), run.task("pools.sleep")
        key, other = f"paused-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"
        queue = run.app.conf.task_default_queue
        now = datetime.now(UTC)
        released = [record.apply_async((key, i), eta=now - timedelta(seconds=10 - i)).id for i in range(6)]
        run.rd.tick()
        sent = [plain.apply_async((key, 100 + i)).id for i in range(4)]  # Celery's own path: not tracked
        with redis.Redis.from_url(run.conf["broker_url"]) as broker:
            assert broker.llen(queue) == 10, "all ten wait in the broker's queue"
        run.rd.pause(task="pools.record", reason="incident")
        run.rd.pause(task="plain.record", reason="incident")
        run.worker.start()
        wait_for(lambda: "ready." in run.worker.output(), 60, f"the {pool} worker to be ready")

        def held(count: int) -> bool:
            none_started(run, key)
            run.rd.tick()  # the plain calls the worker took into the store are put aside by the release
            return waiting(run) == count

        wait_for(lambda: held(10), 30, "the worker to hold all 10 back")
        # The worker has read the pauses since they were set: what Celery sends it now is held back too.
        later = [plain.apply_async((key, 200 + i)).id for i in range(4)]
        others = [sleep.apply_async((other, 0)).id for _ in range(3)]
        wait_for(lambda: held(14), 30, "the worker to hold the 4 later calls back")
        wait_for(lambda: sorted(started_ids(run, other)) == sorted(others), 30, "the other task's calls to run")
        none_started(run, key)
        assert run.rd.resume(task="pools.record") and run.rd.resume(task="plain.record")

        def all_ran() -> bool:
            run.rd.tick()
            return len(started_ids(run, key)) >= 14

        wait_for(all_ran, 60, "every held call to run after the resume")
        wait_for(lambda: (run.rd.tick() or True) and run.settled(), 30, "the store to settle")
        notes = run.notes(key)
        assert sorted(note["id"] for note in notes) == sorted(released + sent + later), "none lost, each once"
        deliveries = {note["id"]: note["delivery"] for note in notes}
        assert all(deliveries[call_id] == 2 for call_id in released), "held back once, delivered again on resume"
