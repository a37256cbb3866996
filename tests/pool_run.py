"""Running ``tests/pool_proj.py`` on a real worker with one of Celery's pools, and the same app in the test
process to park calls and read what the tasks noted."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from celery_redisdelay.testing import CeleryProcess, RedisServer, wait_for, worker
from tests import pool_proj

ROOT = Path(__file__).resolve().parent.parent


class PoolRun:
    """A worker of ``tests.pool_proj`` with one pool, and the same app in the test process."""

    def __init__(
        self, server: RedisServer, pool: str, concurrency: int, conf: dict[str, Any], hostname: str | None = None
    ) -> None:
        self.prefix = f"pools-{uuid.uuid4().hex[:8]}"
        self.conf = {
            "broker_url": f"{server.url}/0",
            "redisdelay_key_prefix": self.prefix,
            "task_default_queue": f"{self.prefix}-queue",
            "marks_url": f"{server.url}/2",
            **conf,
        }
        self.env = {pool_proj.ENV: json.dumps(self.conf), "PYTHONPATH": str(ROOT)}
        self.pool, self.concurrency = pool, concurrency
        self.worker = self.new_worker(hostname)
        self.app, self.rd = pool_proj.make_app(self.conf, name=f"pools-{self.prefix}")
        self.marks = redis.Redis.from_url(f"{server.url}/2")

    def new_worker(self, hostname: str | None = None) -> CeleryProcess:
        """A worker of this run's app and pool (not started); ``hostname``: its node name (``name@host``)."""
        extra = [f"--hostname={hostname}"] if hostname else []
        return worker(
            "tests.pool_proj", pool=self.pool, concurrency=self.concurrency, env=self.env, cwd=str(ROOT), extra=extra
        )

    def restart_after_kill(self) -> None:
        """SIGKILL the worker and its pool processes, as a crash would, and start a new one."""
        self.worker.kill()
        self.worker.stop()
        self.worker.remove_files()
        self.worker = self.new_worker().start()
        wait_for(lambda: "ready." in self.worker.output(), 60, f"the new {self.pool} worker to be ready")

    def rss_bytes(self) -> int:
        """The resident memory of the worker and its pool processes."""
        return sum(rss_of(pid) for pid in {self.worker.pid} | children_of(self.worker.pid))

    def task(self, name: str) -> Any:
        """The test process's side of a task of ``tests.pool_proj``."""
        return self.app.tasks[name]

    def notes(self, key: str) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.marks.lrange(key, 0, -1)]

    def starts_by_worker(self, key: str) -> dict[str, list[str]]:
        """The workers (their name before the ``@``) each call started on, in order, from the ``at: start`` notes
        of tasks that name their worker (``pools.sleep``, ``plain.sleep``)."""
        starts: dict[str, list[str]] = {}
        for note in self.notes(key):
            if note.get("at") == "start":
                starts.setdefault(note["id"], []).append(note["worker"].split("@")[0])
        return starts

    def state(self, call_id: str) -> str | None:
        """The state a call's metadata records (``delayed``, ``deferred``, ``running``...), None when unknown."""
        found = self.rd.find(call_id)
        return None if found is None else str(found.meta.get("s"))

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
def pool_worker(
    server: RedisServer,
    pool: str,
    *,
    concurrency: int = 2,
    hostname: str | None = None,
    start: bool = True,
    **conf: Any,
) -> Iterator[PoolRun]:
    """A run whose worker is ready (with ``start`` False, not started: the test starts it); its output is
    printed when the block fails."""
    run = PoolRun(server, pool, concurrency, conf, hostname)
    try:
        if start:
            run.worker.start()
            wait_for(lambda: "ready." in run.worker.output(), 60, f"the {pool} worker to be ready")
        yield run
    except BaseException:
        print(run.output())
        raise
    finally:
        run.close()
        run.worker.remove_files()


def rss_of(pid: int) -> int:
    """A process's resident memory in bytes (0 when it is gone), from /proc."""
    with contextlib.suppress(OSError):
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


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
