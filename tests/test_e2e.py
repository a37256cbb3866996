"""End to end: real worker and beat processes running ``tests.proj`` against the session's Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from celery_redisdelay import run_validation
from celery_redisdelay.testing import wait_for, worker

from .conftest import Cluster

pytestmark = pytest.mark.e2e

# Release happens on the beat tick: allow one interval plus a margin for two loaded cores.
RELEASE_MARGIN_MS = 2000


def marks(proj: Any) -> redis.Redis:
    return proj._marks  # type: ignore[no-any-return]


def runs(proj: Any, key: str, count: int = 1, timeout: float = 30) -> list[tuple[str, int, str]]:
    """Wait until ``record`` has run ``count`` times for ``key``; return (id, start ms, value) per run."""
    raw = wait_for(
        lambda: (lambda r: r if len(r) >= count else None)(marks(proj).lrange(key, 0, -1)),
        timeout,
        f"{count} run(s) of {key}",
    )
    return [tuple(item.decode().split(" ", 2)) for item in raw]  # type: ignore[misc]


def test_countdown_is_honoured(proj: Any) -> None:
    key = "countdown"
    result = proj.record.apply_async((key, "x"), countdown=1.5)
    entry = proj.rd.find(result.id)
    assert entry is not None
    assert entry.state == "delayed"
    due_ms = entry.score_ms
    [(call_id, started_ms, value)] = runs(proj, key)
    assert call_id == result.id
    assert value == "x"
    assert int(started_ms) >= due_ms, "ran before its due time"
    assert int(started_ms) - due_ms < proj.TICK_INTERVAL * 1000 + RELEASE_MARGIN_MS
    assert result.get(timeout=10) == "x"
    wait_for(lambda: proj.rd.find(result.id) is None, 10, "the acknowledgement")


def test_eta_is_honoured(proj: Any) -> None:
    key = "eta"
    eta = datetime.now(UTC) + timedelta(seconds=1)
    result = proj.record.apply_async((key, "y"), eta=eta)
    [(_, started_ms, _)] = runs(proj, key)
    assert int(started_ms) >= int(eta.timestamp() * 1000)
    assert result.get(timeout=10) == "y"


def test_delay_runs_now_and_result_is_available(proj: Any) -> None:
    result = proj.record.delay("delay-now", 7)
    assert result.get(timeout=15) == 7


def test_cancelled_call_never_runs(proj: Any) -> None:
    key = "cancelled"
    cancelled = proj.record.apply_async((key, "no"), countdown=0.5)
    assert proj.rd.cancel(cancelled.id) is True
    assert proj.rd.cancel(cancelled.id) is False
    # A later call on the same key shows the worker and tick are alive; the cancelled one never ran.
    proj.record.apply_async((key, "yes"), countdown=1.0).get(timeout=15)
    assert [value for _, _, value in runs(proj, key)] == ["yes"]


def test_retry_parks_the_call_again(proj: Any) -> None:
    key = "flaky"
    result = proj.flaky.apply_async((key, 1))
    # The first run calls self.retry(countdown=1.5): the same id is parked again, not held by the worker.
    wait_for(lambda: marks(proj).get(key) == b"1", 15, "the first run")
    entry = wait_for(
        lambda: (lambda e: e if e and e.state == "delayed" else None)(proj.rd.find(result.id)),
        10,
        "the retry to be parked",
    )
    assert entry.meta["t"] == proj.flaky.name
    assert entry.meta["d"] == 0, "a retry is a new schedule, not a lost delivery"
    assert result.get(timeout=15) == 2
    wait_for(lambda: proj.rd.find(result.id) is None, 10, "the acknowledgement")


def test_worker_killed_mid_task_is_swept_and_completed(proj: Any, cluster: Cluster) -> None:
    key = "killed"
    result = proj.slow_once.apply_async((key, 60))
    wait_for(lambda: marks(proj).get(f"{key}:started"), 20, "the task to start")
    cluster.restart_worker_after_kill()
    # visibility timeout of slow_once is 2 s: the sweep sends it again and the new worker completes it.
    assert result.get(timeout=30) == 2
    wait_for(lambda: proj.rd.find(result.id) is None, 10, "the acknowledgement")


def test_validation_of_1000_with_fail_every_other(proj: Any) -> None:
    report = run_validation(proj.rd, 1000, fail_every=2, timeout=1.0, deadline=120)
    print(report.as_dict())
    assert report.missing == []
    assert not report.timed_out
    assert report.processed == 1000
    assert report.failures > 0
    assert report.deliveries == report.processed + report.failures + len(report.duplicates)


def test_validation_survives_a_worker_killed_mid_run(proj: Any, cluster: Cluster) -> None:
    progress: list[int] = []
    killed = threading.Event()

    def kill_midway(done: int, total: int) -> None:
        progress.append(done)
        if not killed.is_set() and done >= total // 10:
            killed.set()
            cluster.restart_worker_after_kill()

    report = run_validation(
        proj.rd, 1000, fail_every=2, timeout=1.0, queue_timeout=10, deadline=180, progress=kill_midway
    )
    print(report.as_dict())
    assert killed.is_set()
    assert report.missing == []
    assert not report.timed_out


def celery_cli(cluster: Cluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``celery -A tests.proj redisdelay ARGS`` as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.proj", "redisdelay", *args],
        env={**os.environ, **cluster.env},
        cwd=cluster.env["PYTHONPATH"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_cli_validate_prints_the_report_and_exits_zero(proj: Any, cluster: Cluster) -> None:
    args = ("validate", "--count", "100", "--timeout", "1", "--deadline", "120", "--json")
    completed = celery_cli(cluster, *args, timeout=180)
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["expected"] == 100
    assert report["missing"] == []
    assert report["ok"] is True


def test_cli_stats_and_cancel(proj: Any, cluster: Cluster) -> None:
    parked = proj.record.apply_async(("cli-cancel", 1), countdown=600)

    def celery(*args: str) -> subprocess.CompletedProcess[str]:
        return celery_cli(cluster, *args)

    stats = json.loads(celery("status", "--json").stdout)
    assert stats["delayed"] >= 1
    listed = celery("list", "--state", "delayed", "--limit", "10000", "--json")
    assert parked.id in {row["id"] for row in json.loads(listed.stdout)["calls"]}
    assert celery("cancel", parked.id).returncode == 0
    again = celery("cancel", parked.id)
    assert again.returncode != 0
    assert "not parked" in again.stderr
    assert proj.rd.find(parked.id) is None


def test_touch_keeps_a_long_run_from_being_redelivered(proj: Any) -> None:
    key = "heartbeat"
    # Visibility timeout 1 s, a 4 s run: without touch() the sweep would deliver it again.
    result = proj.heartbeat.apply_async((key, 4.0))
    assert result.get(timeout=30) == 1
    assert marks(proj).get(key) == b"1", "delivered once"


def test_a_call_waiting_in_the_broker_queue_is_not_taken_for_lost(proj: Any, cluster: Cluster) -> None:
    """kombu#337: a call that waits behind a backlog must not be delivered again meanwhile."""
    key = "backlog"
    result = proj.record.apply_async((key, "once"), queue="backlog", visibility_timeout=0.5, queue_timeout=600)
    entry = wait_for(
        lambda: (lambda e: e if e and e.meta.get("s") == "queued" else None)(proj.rd.find(result.id)),
        15,
        "the release into the unconsumed queue",
    )
    released_ms = entry.score_ms - 600_000
    # Let several sweeps pass a moment well beyond the 0.5 s run timeout (by the Redis clock).
    wait_for(lambda: proj.server_ms() > released_ms + 2_000, 10, "2 s of Redis time")
    wait_for(lambda: int(proj.rd.tick()["requeued"]) == 0, 5, "a sweep that requeues nothing")
    still = proj.rd.find(result.id)
    assert still is not None
    assert (still.state, still.meta["s"], still.meta["d"]) == ("inflight", "queued", 1)
    backlog_worker = worker(
        "tests.proj", concurrency=1, queues="backlog", env=cluster.env, cwd=cluster.env["PYTHONPATH"]
    ).start()
    try:
        assert result.get(timeout=30) == "once"
    finally:
        backlog_worker.stop()
        backlog_worker.remove_files()
    assert [value for _, _, value in runs(proj, key)] == ["once"]


def test_validate_task_runs_on_a_worker(proj: Any) -> None:
    report = proj.app.tasks["redisdelay.validate"].delay(count=30, timeout=1.0, deadline=60).get(timeout=90)
    assert report["ok"] is True
    assert report["processed"] == 30
    assert report["missing"] == []
