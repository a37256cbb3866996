"""The worker probe (``celery -A proj redisdelay probe``) against real workers of ``tests/pool_proj.py`` on a real
redis-server: a healthy idle worker passes, and so does a busy one whose runs outlast the bound; a stuck event loop
fails it, and so does a consumer cancelled after a Redis restart; a name no worker has fails, saying why; the file of
``redisdelay_probe_file`` passes while the worker is healthy and fails when its loop is stuck.

Short leases keep the bound (the lease, by default) short. Each wait polls with a deadline; no timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_redisdelay.cli.probe import worker_name
from celery_redisdelay.errors import ConfigurationError
from celery_redisdelay.operations.probe import ProbeResult, probe_file, probe_worker
from celery_redisdelay.settings import Settings
from celery_redisdelay.testing import RedisServer, wait_for
from tests.pool_run import ROOT, PoolRun, pool_worker

#: Seconds: the bound is the lease (6 s); the leases are renewed each second.
LEASE = {"redisdelay_lease": 6.0, "redisdelay_lease_renewal": 1.0}
BOUND = LEASE["redisdelay_lease"]


def cli(run: PoolRun, *args: str) -> tuple[int, str]:
    """``celery -A tests.pool_proj redisdelay probe ARGS`` in a subprocess: its exit status and its output."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.pool_proj", "redisdelay", "probe", *args],
        env={**os.environ, **run.env},
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def verdict(run: PoolRun, name: str, ok: bool, saying: str = "", timeout: float = 60) -> ProbeResult:
    """Poll the probe (in this process) until it passes (``ok``) or fails, with ``saying`` in its line."""
    found: list[ProbeResult] = []

    def judged() -> bool:
        found[:] = [probe_worker(run.rd, name)]
        return found[0].ok is ok and saying in found[0].line

    try:
        wait_for(judged, timeout, f"the probe of {name} to {'pass' if ok else 'fail'} saying {saying!r}", 0.2)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; it said: {found[0].line if found else None}") from None
    return found[0]


@pytest.fixture(scope="module")
def idle(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolRun]:
    """An idle prefork worker named ``idle@<host>``, which touches ``<tmp>/idle.alive``."""
    alive = tmp_path_factory.mktemp("probe") / "%n.alive"
    with pool_worker(
        redis_server, "prefork", concurrency=1, hostname="idle@%h", redisdelay_probe_file=str(alive), **LEASE
    ) as run:
        yield run


@pytest.mark.e2e
def test_a_healthy_idle_worker_passes(idle: PoolRun) -> None:
    name = worker_name("idle@%h")
    queue = idle.conf["task_default_queue"]
    result = verdict(idle, name, True, f"it consumes {queue};")
    assert result.record is not None and result.record["should"] == [queue]
    code, output = cli(idle, "-n", "idle@%h")
    assert code == 0, output
    assert output.startswith(f"OK {name}: its event loop turned ") and f"it consumes {queue}; bound 6.0 s" in output
    assert output.count("\n") == 1, "one line"
    code, output = cli(idle, "--hostname", name, "--json")
    assert code == 0, output
    assert json.loads(output)["ok"] is True


@pytest.mark.e2e
def test_a_name_no_worker_has_fails_with_its_reason(idle: PoolRun) -> None:
    name = worker_name("idle@%h")
    verdict(idle, name, True)  # the worker has written its heartbeat
    for given in ("nobody@%h", "idle@elsewhere"):
        code, output = cli(idle, "-n", given)
        assert code == 1, output
        assert output.startswith(f"FAIL {worker_name(given)}: no heartbeat of a worker named {worker_name(given)}")
        assert f"workers with one: {name}" in output
    # Without -n, Celery's default name (celery@<host>), which this worker does not have.
    code, output = cli(idle)
    assert code == 1 and output.startswith(f"FAIL {worker_name(None)}: no heartbeat"), output
    assert worker_name(None).startswith("celery@")
    assert not probe_worker(idle.rd, "")


@pytest.mark.e2e
def test_the_file_passes_while_the_worker_is_healthy(idle: PoolRun) -> None:
    path = Path(str(idle.conf["redisdelay_probe_file"]).replace("%n", "idle"))
    wait_for(path.exists, 30, "the worker to touch its file")
    code, output = cli(idle, "-n", "idle@%h", "--file", str(idle.conf["redisdelay_probe_file"]), "--max-age", "6")
    assert code == 0 and output.startswith(f"OK {path}: touched "), output
    first = path.stat().st_mtime
    wait_for(lambda: path.stat().st_mtime > first, 30, "the worker to touch it again")
    assert probe_file(path, BOUND)
    gone = probe_file(path.with_name("nobody.alive"), BOUND)
    assert not gone and "no file" in gone.line


@pytest.mark.e2e
@pytest.mark.parametrize(("pool", "concurrency"), [("prefork", 2), ("solo", 1)])
def test_a_busy_worker_running_long_tasks_passes(redis_server: RedisServer, pool: str, concurrency: int) -> None:
    """Under prefork the runs leave the loop turning; under solo a run holds the loop's thread, which waits for it."""
    with pool_worker(redis_server, pool, concurrency=concurrency, hostname=f"busy-{pool}@%h", **LEASE) as run:
        name = worker_name(f"busy-{pool}@%h")
        key = f"{run.prefix}:runs"
        try:
            calls = [run.task("pools.sleep").apply_async((key, 600.0)) for _ in range(concurrency)]
            wait_for(
                lambda: sum(n["at"] == "start" for n in run.notes(key)) == concurrency, 60, "the long calls to start"
            )
            began = min(n["at_ms"] for n in run.notes(key)) / 1000
            checks = 0
            # Every look passes, until the runs have lasted twice the bound (and a look after that passes too).
            while True:
                result = probe_worker(run.rd, name)
                assert result.ok, (result.line, result.record)
                checks += 1
                if time.time() - began > 2 * BOUND:
                    break
                time.sleep(0.5)
            assert all(n["at"] == "start" for n in run.notes(key)), "the runs go on"
            assert checks > 1
            if pool == "solo":
                assert "its event loop runs a call (solo pool) for " in result.line, result.line
            code, output = cli(run, "-n", f"busy-{pool}@%h")
            assert code == 0, output
            assert {call.id for call in calls} <= {n["id"] for n in run.notes(key)}
        finally:
            run.worker.kill()


@pytest.mark.e2e
def test_a_stuck_event_loop_fails_the_probe_and_its_file(redis_server: RedisServer, tmp_path: Path) -> None:
    # The worker's event loop gets stuck receiving a call (tests/pool_proj.py, as in tests/test_lease_workers.py);
    # its lease thread and its heartbeat go on.
    unstall = f"stall-probe-{threading.get_ident()}-{id(tmp_path)}"
    alive = tmp_path / "stuck.alive"
    with pool_worker(
        redis_server,
        "prefork",
        concurrency=1,
        hostname="stuck@%h",
        stall_loop_on=["pools.record", unstall],
        redisdelay_probe_file=str(alive),
        **LEASE,
    ) as run:
        name = worker_name("stuck@%h")
        try:
            verdict(run, name, True)
            wait_for(alive.exists, 30, "the worker to touch its file")
            run.task("pools.record").apply_async((f"{run.prefix}:runs", "stalls the loop"))
            wait_for(lambda: run.marks.get(f"{unstall}:taken"), 30, "the worker's loop to get stuck")
            result = verdict(run, name, False, "its event loop has not turned for")
            assert result.failures == (result.line.removeprefix(f"FAIL {name}: "),), "the loop alone fails it"
            code, output = cli(run, "-n", "stuck@%h")
            assert code == 1 and output.startswith(f"FAIL {name}: its event loop has not turned for "), output
            assert "(bound 6.0 s)" in output
            wait_for(lambda: not probe_file(alive, BOUND), 60, "the file to be older than the bound")
            code, output = cli(run, "--file", str(alive), "--max-age", "6")
            assert code == 1 and output.startswith(f"FAIL {alive}: {alive} was last touched "), output
        finally:
            run.marks.set(unstall, 1)
        verdict(run, name, True)  # the loop turns again
        wait_for(lambda: probe_file(alive, BOUND), 60, "the worker to touch its file again")


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own, as the test restarts it (the session's serves the other tests)."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.mark.e2e
def test_a_consumer_cancelled_after_a_redis_restart_fails_the_probe(own_redis: RedisServer) -> None:
    with pool_worker(own_redis, "prefork", concurrency=1, hostname="restarted@%h", **LEASE) as run:
        name = worker_name("restarted@%h")
        queue = run.conf["task_default_queue"]
        verdict(run, name, True, f"it consumes {queue};")
        own_redis.restart()  # nothing saved: the heartbeat is gone until the worker writes it again
        wait_for(lambda: run.worker.output().count("Connected to redis") >= 2, 60, "the worker to reconnect")
        verdict(run, name, True, f"it consumes {queue};")

        def cancelled() -> bool:
            replies = run.app.control.cancel_consumer(queue, destination=[name], reply=True, timeout=2)
            return any(name in reply for reply in replies or [])

        wait_for(cancelled, 60, "the worker to cancel its consumer")
        result = verdict(run, name, False, "it has consumed none of its queues for")
        assert f"should: {queue})" in result.line
        code, output = cli(run, "-n", "restarted@%h")
        assert code == 1 and output.startswith(f"FAIL {name}: it has consumed none of its queues for "), output


def test_a_bad_probe_file_setting_is_refused_naming_it() -> None:
    conf = {"broker_url": "redis://127.0.0.1:6379/0"}
    assert Settings.from_conf(conf).probe_file is None
    assert Settings.from_conf({**conf, "redisdelay_probe_file": Path("/tmp/x")}).probe_file == "/tmp/x"
    for bad in (3, "", b"/tmp/x", True):
        with pytest.raises(ConfigurationError, match=r"redisdelay_probe_file must be the path of a file .* not "):
            Settings.from_conf({**conf, "redisdelay_probe_file": bad})
