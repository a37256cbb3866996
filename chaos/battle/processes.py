"""The battle's processes: workers of several pools, beat and the releaser, killed, restarted with SIGTERM,
and started again as a supervisor would (``chaos/cluster.py``, with the battle's app); and the fault
injector of the chaos runner with the battle's one more fault, a worker's SIGTERM restart."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from celery_redisdelay.testing import CeleryProcess, beat, worker

from ..cluster import ROOT, Cluster, Member
from ..faults import BEAT_KILL, RELEASER_KILL, Fault, Injector
from .config import QUEUE, TICK_QUEUE
from .plan import WORKER_TERM

APP = "chaos.battle.app"
#: A worker's warm shutdown (SIGTERM) may take this long before it is SIGKILLed.
WARM_SHUTDOWN_SECONDS = 60.0


def parse_pools(text: str) -> list[tuple[str, int]]:
    """``prefork:2,prefork:2,threads:4``: one worker per item, its pool and concurrency."""
    pools = []
    for part in text.split(","):
        pool, _, concurrency = part.strip().partition(":")
        if pool not in ("prefork", "threads", "solo"):
            raise ValueError(f"unknown pool {pool!r} (prefork, threads, solo)")
        pools.append((pool, int(concurrency or 2)))
    if not pools:
        raise ValueError("no workers")
    return pools


class BattleCluster(Cluster):
    """The chaos runner's cluster, running ``chaos.battle.app`` with a pool per worker slot."""

    def __init__(
        self, env: dict[str, str], run_dir: Path, say: Callable[[str], None], pools: list[tuple[str, int]]
    ) -> None:
        super().__init__(env, run_dir, say)
        self.pools = pools

    def _process(self, role: str, name: str) -> CeleryProcess:
        if role == "worker":
            slot = int(name.removeprefix("worker").split("-")[0])
            pool, concurrency = self.pools[slot]
            return worker(
                APP,
                concurrency=concurrency,
                pool=pool,
                queues=f"{QUEUE},{TICK_QUEUE}",
                env=self.env,
                cwd=str(ROOT),
                extra=[f"--hostname={name}@%h"],
            )
        if role == "beat":
            return beat(APP, env=self.env, cwd=str(ROOT))
        if role == "releaser":
            return CeleryProcess(APP, ["redisdelay", "releaser"], self.env, str(ROOT))
        raise ValueError(f"unknown role {role}")

    def restart(self, role: str, slot: int = 0) -> tuple[Member, Member, float]:
        """SIGTERM the current process (Celery's warm shutdown), wait for it to exit (SIGKILL after
        :data:`WARM_SHUTDOWN_SECONDS`), start a new one: (old, new, seconds the shutdown took)."""
        with self._restart_lock:
            old = self.current[(role, slot)]
            with self._lock:
                old.how = "killing"  # the supervisor leaves it alone; _end below finishes it
            began = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.kill(old.pid, signal.SIGTERM)
            assert old.process.process is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                old.process.process.wait(WARM_SHUTDOWN_SECONDS)
            took = time.monotonic() - began
            self._end(old, how="terminated")
            return old, self.start(role, slot), took


class BattleInjector(Injector):
    """The chaos runner's injector; a worker's SIGTERM restart besides, and with plain Celery (no beat, no
    releaser) their kills are skipped."""

    plain = False

    def inject(self, fault: Fault) -> None:
        if fault.kind in (BEAT_KILL, RELEASER_KILL) and self.plain:
            fault.detail = "skipped: plain Celery has no beat or releaser to kill"
            return
        if fault.kind != WORKER_TERM:
            super().inject(fault)
            return
        assert isinstance(self.cluster, BattleCluster)
        began = self.mark(fault)
        old, new, took = self.cluster.restart("worker", fault.slot)
        fault.target = f"{old.name} pid {old.pid}"
        fault.replacement = f"{new.name} pid {new.pid}"
        fault.detail = f"warm shutdown in {took:.1f}s"
        fault.recovery_seconds = round(time.monotonic() - began, 2)
        self.say(
            f"fault {fault.kind:<13} at {fault.elapsed:7.1f}s: {fault.target} -> {fault.replacement} "
            f"({fault.detail}), recovered in {fault.recovery_seconds:.1f}s"
        )
