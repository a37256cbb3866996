"""The faults: planned from a seeded RNG at points spread over the run, injected by a thread.

A fault's moment is a point of the run's progress, drawn uniformly: in a validation, progress counts
the parking of the messages (the first :data:`PARK_SHARE` of it) and then the messages processed, so
some faults hit while the runner is still parking and the others while the workers process and the
sweep redelivers (progress, not time, because how long a run lasts depends on the machine and on the
faults themselves); every other SIGKILL of the store's Redis is placed while the runner parks, where it
can cost acknowledged parks. In a soak, progress is the share of its minutes gone by. The thread
injects the faults one after another, each with its recovery (a new process started and ready, Redis
answering again) before the next.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .cluster import Cluster, ClusterClosed
from .topology import Topology

WORKER_KILL = "worker_kill"
BEAT_KILL = "beat_kill"
RELEASER_KILL = "releaser_kill"
REDIS_RESTART = "redis_restart"
REDIS_KILL = "redis_kill"
BROKER_RESTART = "broker_restart"
BROKER_KILL = "broker_kill"
CLIENT_KILL = "client_kill"
KINDS = (WORKER_KILL, BEAT_KILL, RELEASER_KILL, REDIS_RESTART, REDIS_KILL, BROKER_RESTART, BROKER_KILL, CLIENT_KILL)
ROLES = {WORKER_KILL: "worker", BEAT_KILL: "beat", RELEASER_KILL: "releaser"}
#: Faults of a redis-server: they break every client's connection.
REDIS_FAULTS = (REDIS_RESTART, REDIS_KILL, BROKER_RESTART, BROKER_KILL)

#: The share of the progress scale given to parking the messages; the rest is processing them.
PARK_SHARE = 0.1
#: Faults are placed uniformly between these points of the progress scale (0: start, 1: all done).
EARLIEST, LATEST = 0.01, 0.9


@dataclass
class Fault:
    """One planned fault and, once injected, what happened."""

    kind: str
    at: float  # planned point of progress, 0..1
    slot: int = 0  # the worker slot, for worker kills
    injected: bool = False
    elapsed: float | None = None  # seconds since the run started
    wall: float | None = None  # time.time() of the fault, to match the workers' event logs
    progress: float | None = None  # progress when it was injected
    target: str = ""  # what was killed or restarted (name and pid)
    replacement: str = ""  # what took its place
    recovery_seconds: float | None = None  # until the replacement was ready / Redis answered
    detail: str = ""
    error: str | None = None
    # A SIGKILL of the store: calls acknowledged to the producer before it that are gone after it.
    exposed: int | None = None  # parks acknowledged within the fsync bound before the kill
    lost: list[dict[str, Any]] | None = None  # {"n", "id", "kind", "before_kill": seconds}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(
    counts: dict[str, int],
    rng: random.Random,
    workers: int,
    *,
    earliest: float = EARLIEST,
    parking: tuple[float, float] | None = (EARLIEST, PARK_SHARE),
) -> list[Fault]:
    """``counts[kind]`` faults of each kind at uniformly drawn points of progress, in order; with
    ``parking``, every other SIGKILL of the store within that span of progress (the runner parking)."""
    faults = []
    for kind in KINDS:
        for index in range(counts.get(kind, 0)):
            low, high = parking if parking and kind == REDIS_KILL and index % 2 == 0 else (earliest, LATEST)
            at = round(rng.uniform(low, high), 4)
            faults.append(Fault(kind, at, slot=rng.randrange(workers) if kind == WORKER_KILL else 0))
    return sorted(faults, key=lambda fault: fault.at)


class Progress:
    """Where a validation is, on a 0..1 scale: messages parked (by the runner) and processed (by the workers)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.parked = 0
        self.processed = 0
        self.started = time.monotonic()

    def on_parked(self) -> None:
        self.parked += 1  # one thread parks; the fault thread only reads

    def on_processed(self, done: int, total: int) -> None:
        self.processed = done

    def fraction(self) -> float:
        parked = min(self.parked, self.count) / self.count
        processed = min(self.processed, self.count) / self.count
        return PARK_SHARE * parked + (1 - PARK_SHARE) * processed

    def elapsed(self) -> float:
        return time.monotonic() - self.started


class Clock(Progress):
    """Where a soak is, on a 0..1 scale: the share of its parking time gone by."""

    def __init__(self, seconds: float) -> None:
        super().__init__(1)
        self.seconds = seconds

    def fraction(self) -> float:
        return min(1.0, self.elapsed() / self.seconds)


class Injector(threading.Thread):
    """Injects the planned faults in order as progress reaches their points, until :meth:`finish`."""

    def __init__(
        self,
        faults: list[Fault],
        progress: Progress,
        cluster: Cluster,
        topology: Topology,
        say: Callable[[str], None],
        after_store_kill: Callable[[Fault], None],
    ) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.faults = faults
        self.progress = progress
        self.cluster = cluster
        self.topology = topology
        self.say = say
        self.after_store_kill = after_store_kill
        self.stopping = threading.Event()
        self.failure: str | None = None  # a fault that could not be injected or recovered from

    def finish(self, timeout: float = 120.0) -> None:
        self.stopping.set()
        self.join(timeout)

    def run(self) -> None:
        for fault in self.faults:
            while self.progress.fraction() < fault.at:
                if self.stopping.wait(0.05):
                    return
            if self.stopping.is_set():
                return
            try:
                self.inject(fault)
            except ClusterClosed:
                return
            except Exception as exc:  # noqa: BLE001 - reported, and the run goes on without this process
                fault.error = f"{type(exc).__name__}: {exc}"
                self.failure = f"{fault.kind} at {fault.elapsed:.1f}s: {fault.error}"
                self.say(f"fault {fault.kind} failed: {traceback.format_exc()}")
                if self.stopping.is_set():
                    return

    def mark(self, fault: Fault) -> float:
        """Note that ``fault`` is injected now (run time, wall clock, progress): the monotonic clock, to time
        its recovery from."""
        fault.injected = True
        fault.elapsed = round(self.progress.elapsed(), 2)
        fault.wall = round(time.time(), 4)
        fault.progress = round(self.progress.fraction(), 4)
        return time.monotonic()

    def inject(self, fault: Fault) -> None:
        began = self.mark(fault)
        if fault.kind in ROLES:
            role, slot = ROLES[fault.kind], fault.slot
            old = self.cluster.current[(role, slot)]
            fault.target = f"{old.name} pid {old.pid}"
            _, new = self.cluster.replace(role, slot)
            fault.replacement = f"{new.name} pid {new.pid}"
        elif fault.kind in REDIS_FAULTS:
            role = "broker" if fault.kind in (BROKER_RESTART, BROKER_KILL) else "store"
            fault.target = f"{role} {self.topology.server_name(role)} pid {self.topology.pid(role)}"
            fault.detail, fault.wall = self.topology.fail(role, kill=fault.kind in (REDIS_KILL, BROKER_KILL))
            fault.replacement = f"pid {self.topology.pid(role)}"
        elif fault.kind == CLIENT_KILL:
            client = self.topology.store_client()
            try:
                before = len(client.client_list(_type="normal"))
                killed = client.client_kill_filter(_type="normal")  # skips this connection
            finally:
                client.close()
            fault.target = "CLIENT KILL TYPE normal"
            fault.detail = f"{killed} of {before - 1} other normal connections dropped on the store's Redis"
        else:
            raise ValueError(f"unknown fault {fault.kind}")
        fault.recovery_seconds = round(time.monotonic() - began, 2)
        if fault.kind == REDIS_KILL:
            self.after_store_kill(fault)
        self.say(
            f"fault {fault.kind:<13} at {fault.elapsed:7.1f}s (progress {fault.progress:.3f}): "
            f"{fault.target}{' -> ' + fault.replacement if fault.replacement else ''}"
            f"{' (' + fault.detail + ')' if fault.detail else ''}, recovered in {fault.recovery_seconds:.1f}s"
        )
