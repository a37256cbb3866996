"""Worker memory: an idle worker's RSS, then with N delayed calls parked, against N Celery countdown tasks; and a
worker that parks the N eta messages it receives (``redisdelay_park_received``) from a producer without the
extension, against the same N held by Celery."""

from __future__ import annotations

import time
from typing import Any

from celery_redisdelay.testing import CeleryProcess, wait_for

from ..common import WORKER_OURS_QUEUE as OURS_QUEUE
from ..common import WORKER_PLAIN_QUEUE as PLAIN_QUEUE
from ..common import WORKER_RECEIVED_QUEUE as RECEIVED_QUEUE
from ..context import Context
from ..processes import rss_mb
from ..report import Row

#: What kombu's Redis transport keeps for unacknowledged (prefetched) messages.
KOMBU_UNACKED = ("unacked", "unacked_index", "unacked_mutex")
COUNTDOWN = 3600
TARGET_MB = 5.0


def settled_rss(process: CeleryProcess, *, minimum: float, deadline: float, window: float = 3.0) -> float:
    """The RSS of ``process`` once it has stopped growing: within 0.5 MB over ``window`` seconds."""
    started = time.monotonic()
    samples: list[tuple[float, float]] = []
    while True:
        now = time.monotonic()
        samples.append((now, rss_mb(process.pid)))
        recent = [value for at, value in samples if at >= now - window]
        covered = samples[0][0] <= now - window
        if now - started >= minimum and covered and max(recent) - min(recent) < 0.5:
            return samples[-1][1]
        if now - started > deadline:
            return samples[-1][1]
        time.sleep(0.25)


def worker_memory(ctx: Context) -> dict[str, Any]:
    """RSS growth of a solo worker's process: N calls parked for an hour vs N tasks sent with countdown=3600."""
    n = ctx.sizes.worker_memory
    bench, client, processes = ctx.bench, ctx.client, ctx.processes
    ctx.clear(OURS_QUEUE, PLAIN_QUEUE, RECEIVED_QUEUE, *KOMBU_UNACKED)
    # The workers start fresh now; the others idle until their turn. The solo pool's one process holds the
    # prefetched messages.
    ours_worker = processes.worker("bench-mem-ours", queues=OURS_QUEUE, pool="solo")
    plain_worker = processes.worker("bench-mem-plain", queues=PLAIN_QUEUE, pool="solo")
    received_worker = processes.worker("bench-mem-received", queues=RECEIVED_QUEUE, pool="solo", park_received=True)
    settle = 2.0 if ctx.quick else 5.0
    try:
        ours_idle = settled_rss(ours_worker, minimum=settle, deadline=30)
        started = time.perf_counter()
        for i in range(n):
            bench.delayed_noop.apply_async((i,), countdown=COUNTDOWN, queue=OURS_QUEUE)
        ctx.say(f"  parked {n:,} calls in {time.perf_counter() - started:.1f} s")
        ours_after = settled_rss(ours_worker, minimum=settle, deadline=30)
        parked, in_queue = bench.rd.stats()["delayed"], int(client.llen(OURS_QUEUE))
        if parked != n or in_queue:
            raise RuntimeError(f"expected {n} parked calls and an empty queue, found {parked} and {in_queue}")
        processes.stop(ours_worker, kill=True)
        ctx.clear(OURS_QUEUE)
        ours_growth = ours_after - ours_idle
        ctx.say(f"  ours: {ours_idle:.1f} MB idle, {ours_after:.1f} MB with {n:,} parked ({ours_growth:+.1f} MB)")

        plain_idle = settled_rss(plain_worker, minimum=1.0, deadline=30)
        started = time.perf_counter()
        with bench.app.producer_or_acquire() as producer:
            for i in range(n):
                bench.plain_noop.apply_async((i,), countdown=COUNTDOWN, queue=PLAIN_QUEUE, producer=producer)
        ctx.say(f"  sent {n:,} countdown tasks in {time.perf_counter() - started:.1f} s")
        deadline = ctx.sizes.worker_memory_deadline
        wait_for(
            lambda: client.llen(PLAIN_QUEUE) == 0,
            deadline,
            "the plain worker to prefetch every countdown task",
            interval=0.25,
        )
        plain_after = settled_rss(plain_worker, minimum=settle, deadline=deadline)
        plain_growth = plain_after - plain_idle
        ctx.say(
            f"  Celery: {plain_idle:.1f} MB idle, {plain_after:.1f} MB with {n:,} prefetched ({plain_growth:+.1f} MB)"
        )
        processes.stop(plain_worker, kill=True)
        ctx.clear(PLAIN_QUEUE, *KOMBU_UNACKED)

        # The same countdown tasks, sent as Celery sends them, to a worker that parks what it receives.
        received_idle = settled_rss(received_worker, minimum=1.0, deadline=30)
        before = bench.rd.stats()["delayed"]
        started = time.perf_counter()
        with bench.app.producer_or_acquire() as producer:
            for i in range(n):
                bench.plain_noop.apply_async((i,), countdown=COUNTDOWN, queue=RECEIVED_QUEUE, producer=producer)
        wait_for(
            lambda: bench.rd.stats()["delayed"] - before >= n and client.llen(RECEIVED_QUEUE) == 0,
            deadline,
            "the worker to park every eta message it received",
            interval=0.25,
        )
        ctx.say(f"  sent {n:,} countdown tasks, parked by the worker, in {time.perf_counter() - started:.1f} s")
        received_after = settled_rss(received_worker, minimum=settle, deadline=deadline)
        received_growth = received_after - received_idle
        ctx.say(
            f"  received: {received_idle:.1f} MB idle, {received_after:.1f} MB with {n:,} parked "
            f"({received_growth:+.1f} MB)"
        )
    finally:
        for process in (ours_worker, plain_worker, received_worker):
            if process in processes.running:
                processes.stop(process, kill=True)  # what they hold is not wanted back
        ctx.clear(OURS_QUEUE, PLAIN_QUEUE, RECEIVED_QUEUE, *KOMBU_UNACKED)
    row = Row(
        "worker_memory",
        ours_growth,
        "MB",
        plain_growth,
        "Celery countdown tasks",
        ours_growth / plain_growth if plain_growth > 0 else None,
        f"< +{TARGET_MB:.0f} MB",
        ours_growth < TARGET_MB,
    )
    received_row = Row(
        f"worker_memory ({n:,} received eta messages)",
        received_growth,
        "MB",
        plain_growth,
        "Celery countdown tasks",
        received_growth / plain_growth if plain_growth > 0 else None,
        f"< +{TARGET_MB:.0f} MB",
        received_growth < TARGET_MB,
    )
    details = {
        "calls": n,
        "received_idle_mb": received_idle,
        "received_after_mb": received_after,
        "pool": "solo",
        "ours_idle_mb": ours_idle,
        "ours_after_mb": ours_after,
        "plain_idle_mb": plain_idle,
        "plain_after_mb": plain_after,
        "plain_kib_per_task": plain_growth * 1024 / n,
    }
    return {"rows": [row.as_dict(), received_row.as_dict()], "details": details}
