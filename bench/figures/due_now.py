"""End to end, calls due now in the app mode with ``redisdelay_track_due_now``: every call tracked, against plain
Celery and celery-redis-plus, at Celery's default prefetch (4) and at 1.

Three ``-P prefork -c 2`` workers run throughout, each on its own queue: ours (an app with ``redisdelay_all_tasks``
and ``redisdelay_track_due_now``: each call is written in flight and pushed onto its queue in one script, held
under a lease, acknowledged), the same tasks in an app without the extension (``bench/plain_app.py``), and, when
installed on Redis 7 or newer, celery-redis-plus (``bench/peer_app.py``). N no-op calls, then a call that records
its start, sent one at a time through one producer; timed until that last call runs. The sides take turns over two
rounds after a warm-up of each. Targets: at least 1.5x plain Celery and at least 1.0x celery-redis-plus.

``e2e_due_now_io`` is the same figure with a task that does some I/O, as real tasks do: each call writes once to the
bench's Redis (an INCR, through a client the worker's process makes once), on every side.

At Celery's default prefetch a fourth side is ours with ``redisdelay_worker_lost = "run_again"``: the task's start is
then written by the pool process's outbox with its acknowledgement, in batches, instead of in a round trip of its own
before the body (the delivery contract of a task that acknowledges early, see docs/guarantees.rst). Its row reports
what that contract costs, against plain Celery; no target.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from celery_redisdelay.testing import wait_for

from ..app import build
from ..common import E2E_PLAIN_QUEUE, E2E_QUEUE, ENV_PREFETCH, ENV_URL, ENV_WORKER_LOST, IO_KEY, WORKER_OURS_QUEUE
from ..context import Context
from ..report import SKIPPED, Row, ratio
from .burst import peer_available
from .e2e import ROUNDS, plain_calls

PREFETCHES = (4, 1)
RUN_AGAIN = "run_again"
TARGET_CELERY = 1.5
TARGET_PEER = 1.0


@dataclass(frozen=True)
class Workload:
    """The task every side calls: one figure of this module per workload."""

    figure: str
    task: str  # the attribute of the task on our bench app and on bench.plain_app
    peer_task: str  # the attribute of the same task on bench.peer_app
    what: str  # for the details
    writes: bool = False  # each call increments IO_KEY: checked after each side's calls, outside the timing


NOOP = Workload("e2e_due_now", "plain_noop", "noop_task", "no-op")
IO = Workload("e2e_due_now_io", "plain_incr", "incr_task", f"one INCR of {IO_KEY} on the bench's Redis", writes=True)


def io_writes(ctx: Context) -> int:
    return int(ctx.client.get(IO_KEY) or 0)


def check_writes(ctx: Context, at_least: int, what: str) -> None:
    """Wait until every call of a side has written (its last calls may still run when its timing ends)."""
    wait_for(lambda: io_writes(ctx) >= at_least, 60, what, interval=0.05)


def e2e_due_now(ctx: Context) -> dict[str, Any]:
    """Calls/s of no-op calls due now, every one tracked, against plain Celery and celery-redis-plus."""
    return due_now(ctx, NOOP)


def e2e_due_now_io(ctx: Context) -> dict[str, Any]:
    """The same with a task that writes once to Redis."""
    return due_now(ctx, IO)


def due_now(ctx: Context, workload: Workload) -> dict[str, Any]:
    """Calls/s of ``workload``'s calls due now, every one tracked, against plain Celery and celery-redis-plus."""
    n = ctx.sizes.e2e
    rows: list[Row] = []
    details: dict[str, Any] = {
        "calls": n,
        "rounds": ROUNDS,
        "pool": "prefork",
        "concurrency": 2,
        "task": workload.what,
    }
    for prefetch in PREFETCHES[:1] if ctx.quick else PREFETCHES:  # --quick: Celery's default prefetch alone
        rates, why_not = one_prefetch(ctx, n, prefetch, details, workload)
        label = f"{workload.figure} (tracked, prefetch {prefetch})"
        found = ratio(rates["ours"], rates["plain"])
        again = rates.get("ours_run_again")
        rows.append(
            Row(
                label,
                rates["ours"],
                "calls/s",
                rates["plain"],
                "plain Celery, same tasks",
                found,
                f">= {TARGET_CELERY}x",
                found is not None and found >= TARGET_CELERY,
            )
        )
        if again is not None:
            rows.append(
                Row(
                    f"{workload.figure} (tracked, prefetch {prefetch}, worker_lost run_again)",
                    again,
                    "calls/s",
                    rates["plain"],
                    "plain Celery, same tasks",
                    ratio(again, rates["plain"]),
                    "reported",
                )
            )
        label = f"{workload.figure} (tracked, prefetch {prefetch}) vs celery-redis-plus"
        if why_not is not None:
            rows.append(Row(label, SKIPPED, "calls/s", target=f"skipped: {why_not}"[:60]))
        else:
            found = ratio(rates["ours"], rates["peer"])
            rows.append(
                Row(
                    label,
                    rates["ours"],
                    "calls/s",
                    rates["peer"],
                    "celery-redis-plus, same tasks",
                    found,
                    f">= {TARGET_PEER}x",
                    found is not None and found >= TARGET_PEER,
                )
            )
    ctx.clear(E2E_QUEUE, E2E_PLAIN_QUEUE, IO_KEY)
    return {"rows": [row.as_dict() for row in rows], "details": details}


def one_prefetch(
    ctx: Context, n: int, prefetch: int, details: dict[str, Any], workload: Workload = NOOP
) -> tuple[dict[str, float], str | None]:
    """Each side's calls/s over the rounds at one ``worker_prefetch_multiplier``; why the peer was not measured."""
    os.environ[ENV_URL] = ctx.url  # the plain and peer apps read their Redis from the bench's environment
    os.environ[ENV_PREFETCH] = str(prefetch)
    from .. import plain_app

    ours = build(ctx.url, all_tasks=True, track=True, prefetch=prefetch)
    sides: dict[str, tuple[Any, Any, Any, str]] = {
        "ours": (ours.app, getattr(ours, workload.task), ours.plain_stamp, E2E_QUEUE),
        "plain": (plain_app.app, getattr(plain_app, workload.task), plain_app.plain_stamp, E2E_PLAIN_QUEUE),
    }
    processes = ctx.processes
    workers = [
        processes.worker(
            f"bench-due-ours-{prefetch}", queues=E2E_QUEUE, concurrency=2, prefetch=prefetch, all_tasks=True, track=True
        ),
        processes.worker(
            f"bench-due-plain-{prefetch}",
            queues=E2E_PLAIN_QUEUE,
            concurrency=2,
            prefetch=prefetch,
            app="bench.plain_app",
        ),
    ]
    if prefetch == PREFETCHES[0]:  # the cost of the delivery contract's start, at Celery's default prefetch
        again = build(ctx.url, all_tasks=True, track=True, prefetch=prefetch, worker_lost=RUN_AGAIN)
        sides["ours_run_again"] = (again.app, getattr(again, workload.task), again.plain_stamp, WORKER_OURS_QUEUE)
        os.environ[ENV_WORKER_LOST] = RUN_AGAIN
        try:
            workers.append(
                processes.worker(
                    f"bench-due-again-{prefetch}",
                    queues=WORKER_OURS_QUEUE,
                    concurrency=2,
                    prefetch=prefetch,
                    all_tasks=True,
                    track=True,
                )
            )
        finally:
            del os.environ[ENV_WORKER_LOST]
    why_not = peer_available(ctx) if not ctx.quick else "not measured with --quick"
    if why_not is None:
        from .. import peer_app

        sides["peer"] = (peer_app.app, getattr(peer_app, workload.peer_task), peer_app.stamp, peer_app.PEER_QUEUE)
        workers.append(
            processes.worker(
                f"bench-due-peer-{prefetch}",
                queues=peer_app.PEER_QUEUE,
                concurrency=2,
                prefetch=prefetch,
                app="bench.peer_app",
            )
        )
    seconds = dict.fromkeys(sides, 0.0)
    ctx.client.unlink(IO_KEY)
    calls = 0
    try:
        for turn in range(ROUNDS + 1):
            size = n if turn else max(50, n // 10)
            for side, (app, task, stamp, queue) in sides.items():
                took = plain_calls(ctx, app, task, stamp, size, queue)
                calls += size
                if workload.writes:
                    check_writes(ctx, calls, f"the {size} writes of {side}'s calls")
                ctx.say(
                    f"  {workload.figure} prefetch {prefetch} {side} "
                    f"{'round ' + str(turn) if turn else 'warm-up'}: {size / took:,.0f} calls/s"
                )
                if turn:
                    seconds[side] += took
    finally:
        for worker in workers:
            processes.stop(worker)
        for side in ("ours", "ours_run_again"):
            if side in sides:
                sides[side][0].close()
    details[f"prefetch {prefetch}"] = {f"{side}_seconds": took for side, took in seconds.items()}
    if workload.writes:
        details[f"prefetch {prefetch}"].update(calls=calls, writes=io_writes(ctx))
    return {side: ROUNDS * n / took for side, took in seconds.items()}, why_not
