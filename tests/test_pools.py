"""The extension under each of Celery's worker pools, on real worker processes (``tests/pool_proj.py``)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_redisdelay.testing import RedisServer, wait_for, worker
from tests import pool_proj

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


class PoolRun:
    """A worker of ``tests.pool_proj`` with one pool, and the same app in the test process."""

    def __init__(self, server: RedisServer, pool: str, concurrency: int, conf: dict[str, Any]) -> None:
        self.prefix = f"pools-{uuid.uuid4().hex[:8]}"
        self.conf = {
            "broker_url": f"{server.url}/0",
            "redisdelay_key_prefix": self.prefix,
            "task_default_queue": f"{self.prefix}-queue",
            "marks_url": f"{server.url}/2",
            **conf,
        }
        self.env = {pool_proj.ENV: json.dumps(self.conf), "PYTHONPATH": str(ROOT)}
        self.worker = worker("tests.pool_proj", pool=pool, concurrency=concurrency, env=self.env, cwd=str(ROOT))
        self.app, self.rd = pool_proj.make_app(self.conf, name=f"pools-{self.prefix}")
        self.marks = redis.Redis.from_url(f"{server.url}/2")

    def task(self, name: str) -> Any:
        """The test process's side of a task of ``tests.pool_proj``."""
        return self.app.tasks[name]

    def notes(self, key: str) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.marks.lrange(key, 0, -1)]

    def settled(self) -> bool:
        stats = self.rd.stats()
        return stats["delayed"] == 0 and stats["inflight"] == 0

    def output(self) -> str:
        return self.worker.output()[-6000:]

    def close(self) -> None:
        self.worker.stop()
        self.app.close()
        self.marks.close()


@contextlib.contextmanager
def pool_worker(server: RedisServer, pool: str, *, concurrency: int = 2, **conf: Any) -> Iterator[PoolRun]:
    run = PoolRun(server, pool, concurrency, conf)
    run.worker.start()
    try:
        wait_for(lambda: "ready." in run.worker.output(), 60, f"the {pool} worker to be ready")
        yield run
    except BaseException:
        print(run.output())
        raise
    finally:
        run.close()
        run.worker.remove_files()


def children_of(pid: int) -> set[int]:
    """The live child processes of ``pid`` (its pool processes), from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.add(int(entry.name))
    return found


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
