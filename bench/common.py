"""What the bench's apps share (``bench.app`` with the extension, ``bench.plain_app`` without it, ``bench.peer_app``):
the environment they are configured from, the queues, and the Redis clock. Importing it creates no app."""

from __future__ import annotations

import os

import redis

ENV_URL = "REDISDELAY_BENCH_URL"
ENV_TICK = "REDISDELAY_BENCH_TICK"
ENV_PRECISE = "REDISDELAY_BENCH_PRECISE"
ENV_PARK_RECEIVED = "REDISDELAY_BENCH_PARK_RECEIVED"
ENV_RESULTS = "REDISDELAY_BENCH_RESULTS"
ENV_PREFETCH = "REDISDELAY_BENCH_PREFETCH"
ENV_LEASE = "REDISDELAY_BENCH_LEASE"
ENV_ALL_TASKS = "REDISDELAY_BENCH_ALL_TASKS"
ENV_KOMBU_UNACKED = "REDISDELAY_BENCH_KOMBU_UNACKED"
ENV_TRACK = "REDISDELAY_BENCH_TRACK"
ENV_WORKER_LOST = "REDISDELAY_BENCH_WORKER_LOST"

#: ``REDISDELAY_BENCH_PRECISE``: ``1`` sets ``redisdelay_precise_release=True``, ``off`` sets it False (workers
#: release nothing), anything else leaves the package's default (every worker runs a precise releaser).
PRECISE_ON, PRECISE_OFF = "1", "off"

KEY_PREFIX = "bench"
IO_KEY = "bench:e2e:io"  # the counter the I/O task (``bench.plain_incr``, ``bench.peer_incr``) increments

# Every queue of the benchmarks, declared in ``task_queues`` as an application declares its queues
# (the release script pushes only onto the lists of queues the app knows). Nobody consumes a queue
# unless a figure starts a worker for it.
DEFAULT_QUEUE = "bench"  # the tick and the lateness calls
PARK_QUEUE = "bench-park"  # routing of the calls park_single and park_bulk park
PARK_PLAIN_QUEUE = "bench-park-plain"  # Celery's countdown messages of park_single
RELEASE_QUEUE = "bench-release"  # where the release figure's calls land
SEND_QUEUE = "bench-release-send"  # the send_task loop of the release figure
MEMORY_QUEUE = "bench-memory"  # routing of the calls of redis_memory_per_call
MEMORY_PLAIN_QUEUE = "bench-memory-plain"
WORKER_OURS_QUEUE = "bench-mem-ours"  # the worker_memory workers
WORKER_PLAIN_QUEUE = "bench-mem-plain"
WORKER_RECEIVED_QUEUE = "bench-mem-received"  # Celery's eta messages, parked by the worker that receives them
E2E_QUEUE = "bench-e2e"  # calls due now, run by one worker, end to end
E2E_PLAIN_QUEUE = "bench-e2e-plain"  # the same, for a worker without the extension (all-tasks mode's baseline)
RECOVERY_QUEUE = "bench-recovery"  # a killed worker's calls, run again by another
BURST_QUEUE = "bench-burst"  # calls due at one instant, drained by one worker
BURST_PLAIN_QUEUE = "bench-burst-plain"  # the same as Celery's eta tasks
LIMITED_QUEUE = "bench-limited"  # calls under limits, released by the tick (nobody consumes)
LIMITS_QUEUE = "bench-limits"  # calls under a fleet-wide rate, run by two workers
LIMITS_PLAIN_QUEUE = "bench-limits-plain"  # the same under Celery's per-worker rate_limit
QUEUES = (
    DEFAULT_QUEUE,
    PARK_QUEUE,
    PARK_PLAIN_QUEUE,
    RELEASE_QUEUE,
    SEND_QUEUE,
    MEMORY_QUEUE,
    MEMORY_PLAIN_QUEUE,
    WORKER_OURS_QUEUE,
    WORKER_PLAIN_QUEUE,
    WORKER_RECEIVED_QUEUE,
    E2E_QUEUE,
    E2E_PLAIN_QUEUE,
    RECOVERY_QUEUE,
    BURST_QUEUE,
    BURST_PLAIN_QUEUE,
    LIMITED_QUEUE,
    LIMITS_QUEUE,
    LIMITS_PLAIN_QUEUE,
)


def server_ms(client: redis.Redis) -> int:
    """The Redis server's clock in ms, the clock due times are scored by."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


_clients: dict[tuple[int, str], redis.Redis] = {}


def process_client(url: str) -> redis.Redis:
    """The Redis client of this process for ``url``, made at its first use in the process: a task calls it, so
    each prefork child makes its own (at its first call) and keeps it, as a real task keeps its connections."""
    key = (os.getpid(), url)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(url)
    return client


def incr_io(url: str, i: int = 0) -> int:
    """The I/O task's body: one INCR of :data:`IO_KEY` on the Redis at ``url`` (a database URL)."""
    process_client(url).incr(IO_KEY)
    return i
