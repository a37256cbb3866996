"""Limits across the fleet, on two real workers (``--pool prefork --concurrency 2`` each, a precise releaser in each).

Rate: a task limited to 20 calls/s (``limit_rate="20/s"``) with a backlog of calls due now, kept busy for 30 [5] s;
against the same calls of a plain task with Celery's ``rate_limit="20/s"`` on the same two workers, which each
keep their own limit. Per side, by the Redis clock: the calls started per second over the run, and the most that
started in any one-second window. Targets (issue 32): ours at least 0.95x the limit, and at most 21 in a window.

Per key: 1,000 [100] keys limited to 1 call/s each (``limit_key``), a call per key, all due at one instant 3 s
ahead, drained by the same two workers: how late each key's call started after its due time (p50, p99, max),
against the same calls without limits. Target: every key served, none more than 2 s late.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from celery_redisdelay.testing import wait_for

from ..common import LIMITS_PLAIN_QUEUE, LIMITS_QUEUE, server_ms
from ..context import Context
from ..marks import read_marks
from ..report import Row, percentile

RATE = 20.0
WINDOW_MS = 1000.0
LEAD_MS = 3000


def starts(ctx: Context, key: str, n: int, deadline: float, everything: bool = True) -> list[float]:
    """The Redis times (ms) at which the ``n`` calls noted under ``key`` started, once all have (or, unless
    ``everything``, those that have when ``deadline`` s have passed)."""
    client = ctx.client
    try:
        wait_for(lambda: client.llen(key) >= n, deadline, f"{n} calls to start under {key}", 0.1)
    except TimeoutError:
        if everything:
            raise
    marks = read_marks(client, key)
    client.unlink(key)
    return sorted(float(mark.ms) for mark in marks)


def most_in_a_window(times: list[float]) -> int:
    most = first = 0
    for last, at in enumerate(times):
        while at - times[first] >= WINDOW_MS:
            first += 1
        most = max(most, last - first + 1)
    return most


def rate_side(
    ctx: Context, task: Any, queue: str, seconds: float, label: str, everything: bool = True
) -> dict[str, Any]:
    """A backlog of calls due now of ``task``, kept busy for ``seconds`` at the limit: calls/s and the busiest
    window. The plain side's workers run as fast as their two limits allow, so it gets as many calls."""
    n = round(RATE * seconds)
    key = f"bench:limits:{uuid.uuid4().hex}"
    with ctx.bench.app.producer_or_acquire() as producer:
        for i in range(n):
            task.apply_async((key, i), queue=queue, producer=producer)
    # Celery's side is measured over what started in twice the time the limit needs (its workers may stall).
    times = starts(ctx, key, n, seconds * 4 + 60 if everything else seconds * 2, everything)
    span = (times[-1] - times[0]) / 1000
    found = {
        "calls": n,
        "started": len(times),
        "per_s": (len(times) - 1) / span if span else float("inf"),
        "most_in_1s": most_in_a_window(times),
    }
    ctx.say(
        f"  {label}: {found['started']:,} of {n:,} started, {found['per_s']:,.1f} calls/s, "
        f"at most {found['most_in_1s']} in one second"
    )
    return found


def keyed_side(ctx: Context, task: Any, keys: int, label: str) -> dict[str, Any]:
    """A call per key, all due LEAD_MS ahead: how late each started."""
    key = f"bench:limits:{uuid.uuid4().hex}"
    due_ms = server_ms(ctx.client) + LEAD_MS
    eta = datetime.fromtimestamp(due_ms / 1000, tz=UTC)
    for i in range(keys):
        task.apply_async((key, i), eta=eta, queue=LIMITS_QUEUE)
    if server_ms(ctx.client) >= due_ms:
        raise RuntimeError(f"parking {keys} calls took past their due time; raise LEAD_MS")
    late = [at - due_ms for at in starts(ctx, key, keys, 120)]
    found = {"keys": keys, "p50_ms": percentile(late, 50), "p99_ms": percentile(late, 99), "max_ms": max(late)}
    ctx.say(f"  {label}: p50 {found['p50_ms']:,.0f} ms, p99 {found['p99_ms']:,.0f} ms, max {found['max_ms']:,.0f} ms")
    return found


def limits(ctx: Context) -> dict[str, Any]:
    """A fleet-wide rate against Celery's per-worker rate_limit, and 1,000 keys served on time."""
    tasks, processes = ctx.bench.app.tasks, ctx.processes
    ctx.clear(LIMITS_QUEUE, LIMITS_PLAIN_QUEUE)
    queues = f"{LIMITS_QUEUE},{LIMITS_PLAIN_QUEUE}"
    workers = [
        processes.worker(f"bench-limits-{n}", queues=queues, concurrency=2, precise=True, prefetch=1) for n in (1, 2)
    ]
    try:
        seconds = ctx.sizes.limits_seconds
        ours = rate_side(ctx, tasks["bench.rated_stamp"], LIMITS_QUEUE, seconds, "limit_rate='20/s', two workers")
        plain = tasks["bench.plain_rated_stamp"]
        label = "Celery's rate_limit='20/s', two workers"
        celery = rate_side(ctx, plain, LIMITS_PLAIN_QUEUE, seconds, label, everything=False)
        ctx.clear(LIMITS_PLAIN_QUEUE)  # what Celery's workers did not start in time
        keyed = keyed_side(ctx, tasks["bench.keyed_stamp"], ctx.sizes.limits_keys, "a call per key, 1/s per key")
        free = keyed_side(ctx, tasks["bench.stamp"], ctx.sizes.limits_keys, "the same calls without limits")
    finally:
        for worker in workers:
            processes.stop(worker)
    ctx.clear(LIMITS_QUEUE, LIMITS_PLAIN_QUEUE)
    rate_ratio = ours["per_s"] / RATE
    rows = [
        Row(
            "limit_rate 20/s on two workers: rate",
            ours["per_s"],
            "calls/s",
            celery["per_s"],
            "Celery's rate_limit='20/s', same workers",
            rate_ratio,
            ">= 0.95x the limit (ratio: ours / 20)",
            rate_ratio >= 0.95,
        ),
        Row(
            "limit_rate 20/s on two workers: most started in 1 s",
            ours["most_in_1s"],
            "calls",
            celery["most_in_1s"],
            "Celery's rate_limit='20/s', same workers",
            None,
            "<= 21",
            ours["most_in_1s"] <= 21,
        ),
        Row(
            f"{ctx.sizes.limits_keys:,} keys at 1/s: latest first call",
            keyed["max_ms"],
            "ms late",
            free["max_ms"],
            "the same calls without limits",
            None,
            "<= 2,000 ms",
            keyed["max_ms"] <= 2000,
        ),
    ]
    details = {"rate": {"ours": ours, "celery": celery}, "keys": {"ours": keyed, "without_limits": free}}
    return {"rows": [row.as_dict() for row in rows], "details": details}
