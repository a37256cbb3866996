"""End to end: calls due now, from the first call to the last acknowledgement, on one worker.

One worker (``--pool prefork --concurrency 2``) with the precise releaser in it runs no-op tasks whose calls are
due now: N calls of a delayed task (parked, released by the releaser thread, run, tracked, acknowledged: timed
until the store holds none) against N calls of the same task as a plain ``@app.task`` (timed until a last call
sent after them has run). The producer runs beside the worker on the same machine, as it would. Both sides take
turns over two rounds after a warm-up of each; without a result backend (``ignore_result``), then with a Redis
result backend on both.

All-tasks mode: the same plain task, called due now (never parked), in an app with ``redisdelay_all_tasks``
(producer and worker) against the same task in an app without the extension (``bench.plain_app``), timed as
Celery's side above. Target: at least 0.98x.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from celery_redisdelay.testing import wait_for

from ..app import BenchApp, build
from ..common import E2E_PLAIN_QUEUE, E2E_QUEUE, ENV_URL
from ..context import Context
from ..report import Row, ratio

ROUNDS = 2
TARGET = 0.95
#: (row, a Redis result backend on both sides, redisdelay_skip_unacked False on our side: kombu's unacked
#: bookkeeping for every message, two round trips each in the worker's main process)
VARIANTS = (
    ("e2e_throughput", False, False),
    ("e2e_throughput (Redis results)", True, False),
    ("e2e_throughput (redisdelay_skip_unacked False)", False, True),
    ("e2e_throughput (Redis results, redisdelay_skip_unacked False)", True, True),
)
ALL_TASKS_TARGET = 0.98


def ours(ctx: Context, app: BenchApp, n: int) -> float:
    """Seconds from the first of ``n`` delayed calls due now to the acknowledgement of the last."""
    rd = app.rd
    started = time.perf_counter()
    for i in range(n):
        app.delayed_noop.apply_async((i,), queue=E2E_QUEUE)

    def settled() -> bool:
        stats = rd.stats()
        return stats["delayed"] == 0 and stats["inflight"] == 0

    wait_for(settled, 600, f"{n} delayed calls to be acknowledged", interval=0.02)
    return time.perf_counter() - started


def celerys(ctx: Context, app: BenchApp, n: int) -> float:
    """Seconds from the first of ``n`` plain calls to the run of a last one sent after them (FIFO, 2 processes)."""
    return plain_calls(ctx, app.app, app.plain_noop, app.plain_stamp, n)


def plain_calls(ctx: Context, app: Any, noop: Any, stamp: Any, n: int, queue: str = E2E_QUEUE) -> float:
    """Seconds from the first of ``n`` calls of ``noop`` to the run of a call of ``stamp`` sent after them."""
    marks = f"bench:e2e:{uuid.uuid4().hex}"
    started = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for i in range(n):
            noop.apply_async((i,), queue=queue, producer=producer)
        stamp.apply_async((marks,), queue=queue, producer=producer)
    wait_for(lambda: ctx.client.llen(marks) >= 1, 600, f"{n} plain calls to run", interval=0.02)
    seconds = time.perf_counter() - started
    ctx.client.unlink(marks)
    return seconds


def e2e_throughput(ctx: Context) -> dict[str, Any]:
    """Calls/s end to end, delayed vs plain Celery, without and with a Redis result backend."""
    n = ctx.sizes.e2e
    rows: list[Row] = []
    details: dict[str, Any] = {"calls": n, "rounds": ROUNDS, "pool": "prefork", "concurrency": 2}
    for label, results, kombu_unacked in VARIANTS:
        app = build(ctx.url, precise=True, results=results, kombu_unacked=kombu_unacked)
        worker = ctx.processes.worker(
            "bench-e2e",
            queues=E2E_QUEUE,
            concurrency=2,
            precise=True,
            results=results,
            tick_interval=1.0,
            kombu_unacked=kombu_unacked,
        )
        try:
            ours_seconds = celery_seconds = 0.0
            for turn in range(ROUNDS + 1):
                size = n if turn else max(50, n // 10)
                mine, theirs = ours(ctx, app, size), celerys(ctx, app, size)
                ctx.say(
                    f"  {label} {'round ' + str(turn) if turn else 'warm-up'}: "
                    f"ours {size / mine:,.0f} calls/s, Celery {size / theirs:,.0f} calls/s"
                )
                if turn:
                    ours_seconds += mine
                    celery_seconds += theirs
        finally:
            ctx.processes.stop(worker)
            app.app.close()
        rate, base = ROUNDS * n / ours_seconds, ROUNDS * n / celery_seconds
        found = ratio(rate, base)
        rows.append(
            Row(
                label,
                rate,
                "calls/s",
                base,
                "plain Celery, same tasks",
                found,
                f">= {TARGET}x",
                found is not None and found >= TARGET,
            )
        )
        details[label] = {"ours_seconds": ours_seconds, "celery_seconds": celery_seconds}
    rows.append(all_tasks_mode(ctx, n, details))
    ctx.clear(E2E_QUEUE, E2E_PLAIN_QUEUE)
    return {"rows": [row.as_dict() for row in rows], "details": details}


def all_tasks_mode(ctx: Context, n: int, details: dict[str, Any]) -> Row:
    """Calls/s of a plain task called due now, in an app with redisdelay_all_tasks vs one without the extension."""
    label = "e2e_throughput (all-tasks mode, never parked)"
    os.environ[ENV_URL] = ctx.url  # the plain app reads its Redis from the bench's environment
    from .. import plain_app

    ours = build(ctx.url, all_tasks=True)
    sides = {
        "ours": (ours.app, ours.plain_noop, ours.plain_stamp, E2E_QUEUE),
        "plain": (plain_app.app, plain_app.plain_noop, plain_app.plain_stamp, E2E_PLAIN_QUEUE),
    }
    # Both workers run throughout, each on its own queue, and the sides take turns.
    workers = [
        ctx.processes.worker("bench-e2e-all", queues=E2E_QUEUE, concurrency=2, all_tasks=True),
        ctx.processes.worker("bench-e2e-plain", queues=E2E_PLAIN_QUEUE, concurrency=2, app="bench.plain_app"),
    ]
    seconds = {"ours": 0.0, "plain": 0.0}
    try:
        for turn in range(ROUNDS + 1):
            size = n if turn else max(50, n // 10)
            for side, (app, noop, stamp, queue) in sides.items():
                took = plain_calls(ctx, app, noop, stamp, size, queue)
                ctx.say(f"  {label} {side} {'round ' + str(turn) if turn else 'warm-up'}: {size / took:,.0f} calls/s")
                if turn:
                    seconds[side] += took
    finally:
        for worker in workers:
            ctx.processes.stop(worker)
    ours.app.close()
    rate, base = ROUNDS * n / seconds["ours"], ROUNDS * n / seconds["plain"]
    found = ratio(rate, base)
    details[label] = {"ours_seconds": seconds["ours"], "without_seconds": seconds["plain"]}
    return Row(
        label,
        rate,
        "calls/s",
        base,
        "the same app without the extension",
        found,
        f">= {ALL_TASKS_TARGET}x",
        found is not None and found >= ALL_TASKS_TARGET,
    )
