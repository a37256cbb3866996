"""The RSS of one prefork pool process, kind of battle call by kind: what makes the battle's workers grow.

Usage::

    python -m chaos.battle.pool_rss

Starts a store and a ledger redis-server, one worker of the battle's app (prefork, concurrency 1) and the
releaser, then sends batches of one kind at a time and prints the pool process's RSS after each: calls due
now and parked calls (runs that raise nothing), retries (``self.retry``, Celery's ``Retry``), and deferrals
behind a lock held here (``Deferred``, an ``Ignore``). Each kind is sent twice: a growth the first time only
is a high-water mark, a growth both times a cost per call. Everything it starts is stopped by PID.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from celery_redisdelay.testing import CeleryProcess, RedisServer, worker

from ..cluster import ROOT
from ..harness.ledger import RedisLedger
from .config import (
    ENV_BATCH,
    ENV_LEASE,
    ENV_LEDGER_URL,
    ENV_PLAIN,
    ENV_URL,
    ENV_VISIBILITY,
    QUEUE,
    TICK_QUEUE,
)

APP = "chaos.battle.app"
PHASE_SECONDS = 300.0
DEFER_SECONDS = 30.0


def rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return 0


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def until(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def main() -> int:
    run_dir = Path(tempfile.mkdtemp(prefix="redisdelay-pool-rss-"))
    store, ledger_server = RedisServer(directory=run_dir / "store"), RedisServer(directory=run_dir / "ledger")
    processes: list[CeleryProcess] = []
    try:
        store.start()
        ledger_server.start()
        env = {
            ENV_URL: f"{store.url}/0",
            ENV_LEDGER_URL: f"{ledger_server.url}/0",
            ENV_PLAIN: "0",
            ENV_VISIBILITY: "120",
            ENV_LEASE: "",
            ENV_BATCH: "10,5",
        }
        os.environ.update(env)
        from . import app as battle  # builds the app from the environment

        ledger = RedisLedger.from_url(env[ENV_LEDGER_URL])
        pool = worker(
            APP, concurrency=1, pool="prefork", queues=f"{QUEUE},{TICK_QUEUE}", env=env, cwd=str(ROOT), extra=[]
        )
        processes.append(pool.start())
        processes.append(CeleryProcess(APP, ["redisdelay", "releaser"], env, str(ROOT)).start())
        if not until(lambda: "ready." in pool.output() and bool(children(pool.pid)), 60):
            raise RuntimeError("the worker did not get ready")
        child = children(pool.pid)[0]
        print(f"pool process {child}: {rss_mib(child)} MiB", flush=True)
        counter = iter(range(10**9))

        def phase(name: str, count: int, send: Callable[[int], object], units: int = 1) -> None:
            target = ledger.done() + count * units
            began = time.monotonic()
            for _ in range(count):
                send(next(counter))
            if not until(lambda: ledger.done() >= target, PHASE_SECONDS):
                print(f"{name}: not all ran within {PHASE_SECONDS:g}s", flush=True)
            print(f"{name:<9} {count:>5} calls in {time.monotonic() - began:4.0f}s: {rss_mib(child)} MiB", flush=True)

        def now(n: int) -> object:
            return battle.work.apply_async((n,))

        def parked(n: int) -> object:
            return battle.work.apply_async((n,), countdown=0.05)

        def retried(n: int) -> object:
            return battle.retrying.apply_async((n, 0.05, 1))

        phase("warm-up", 1000, now)
        for name, send, units in (("now", now, 1), ("parked", parked, 1), ("retry", retried, 2)):
            count = 1500 if units == 2 else 3000
            phase(name, count, send, units)
            phase(name, count, send, units)
        assert battle.rd is not None
        receipts = ledger.receipts()
        with battle.rd.lock("battle:0", timeout=600):
            for _ in range(200):
                battle.locked.apply_async((next(counter), 0, 0.0))
            for _ in range(2):
                time.sleep(DEFER_SECONDS)  # the calls come back behind the lock every lock_retry seconds
                deferred = ledger.receipts() - receipts
                print(f"deferred  {deferred:>5} deliveries: {rss_mib(child)} MiB", flush=True)
        phase("now", 3000, now)
        return 0
    finally:
        for process in reversed(processes):
            process.stop()
        store.terminate()
        ledger_server.terminate()


if __name__ == "__main__":
    sys.exit(main())
