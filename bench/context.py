"""What every figure gets: the Redis, the bench app, the sizes of this run, the subprocesses, progress output."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from .app import BenchApp, build
from .processes import Processes


@dataclass(frozen=True)
class Sizes:
    """How much each figure does; ``QUICK`` is for a smoke test, ``NORMAL`` for the figures we report."""

    park_single: int  # apply_async calls timed, each side
    park_bulk: int  # calls parked by one park_many, and copies written by the raw pipeline
    memory_per_call: int  # calls parked (and plain messages sent) for the Redis memory per call
    release: int  # due calls released by the tick (and moved by the raw Lua mover)
    release_send_task: int  # send_task calls of the baseline
    release_limited: int  # due calls under limits (and without) released by the tick
    limits_seconds: float  # how long the rate of the limits figure is kept busy
    limits_keys: int  # keys of the per-key limit, a call each
    worker_memory: int  # calls parked / plain tasks sent per worker
    worker_memory_deadline: float  # seconds to wait for the plain worker to prefetch and settle
    lateness_calls: int  # calls whose lateness is measured per run
    lateness_spread: float  # seconds their due times are spread over
    lateness_small: int  # parked calls in the background, small run
    lateness_large: int  # parked calls in the background, large run (scaled down to fit memory)
    release_cluster: int  # due calls released from a Redis Cluster store, baseline and scaled alike
    dashboard: int  # parked calls behind the dashboard's pages
    e2e: int  # calls due now, run end to end by one worker, each side
    burst: int  # calls due at one instant, drained by one worker, each side


NORMAL = Sizes(
    park_single=5000,
    park_bulk=50_000,
    memory_per_call=5000,
    release=100_000,
    release_send_task=5000,
    release_limited=20_000,
    limits_seconds=30.0,
    limits_keys=1000,
    worker_memory=50_000,
    worker_memory_deadline=240.0,
    lateness_calls=300,
    lateness_spread=3.0,
    lateness_small=1000,
    lateness_large=1_000_000,
    release_cluster=60_000,
    dashboard=1_000_000,
    e2e=5000,
    burst=5000,
)
QUICK = Sizes(
    park_single=500,
    park_bulk=2000,
    memory_per_call=500,
    release=5000,
    release_send_task=500,
    release_limited=2000,
    limits_seconds=5.0,
    limits_keys=100,
    worker_memory=2000,
    worker_memory_deadline=30.0,
    lateness_calls=100,
    lateness_spread=2.0,
    lateness_small=1000,
    lateness_large=20_000,
    release_cluster=6000,
    dashboard=20_000,
    e2e=300,
    burst=200,
)


class Context:
    """One benchmark run on one redis-server."""

    def __init__(self, url: str, *, quick: bool, say: Callable[[str], None], redis_pid: int | None = None) -> None:
        self.url = url
        self.redis_pid = redis_pid  # the redis-server's process, for the CPU time it uses
        self.quick = quick
        self.sizes = QUICK if quick else NORMAL
        self.say = say
        self.client = redis.Redis.from_url(f"{url}/0")
        self.bench: BenchApp = build(url)
        self.processes = Processes(url, say)

    @property
    def store_keys(self) -> list[str]:
        return self.bench.rd.keys.store_keys

    def clear(self, *extra: str) -> None:
        """Drop the call store and ``extra`` keys (queues, scratch keys) and wait until Redis has freed them.

        Only named keys are dropped, never the database: kombu keeps its queue bindings in Redis too.
        """
        self.client.unlink(*self.store_keys, *extra)
        self.wait_lazyfree()

    def wait_lazyfree(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while int(self.client.info("memory").get("lazyfree_pending_objects", 0)) and time.monotonic() < deadline:
            time.sleep(0.05)

    def used_memory(self) -> int:
        self.wait_lazyfree()
        return int(self.client.info("memory")["used_memory"])

    def close(self) -> None:
        self.processes.stop_all()
        self.bench.app.close()
        self.client.close()
