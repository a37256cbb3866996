"""Recovery: how soon a SIGKILLed worker's calls run again on another worker, with the default lease.

A worker (``--pool prefork --concurrency 1``, ``worker_prefetch_multiplier`` 60, the precise releaser in it)
runs a 20 s call and holds 50 more it prefetched, all due now. A second worker is started, idle, and the
first is SIGKILLed with its pool process. Timed, by the Redis clock, from the kill to the start of each call
on the second worker. Ours: delayed calls under the default lease (30 s, renewed every 10 s). The baseline:
the same calls as plain ``@app.task`` calls (the long one ``acks_late``, so Celery can deliver it again at
all), on the same two workers; they come back when kombu restores them after the broker's
``visibility_timeout`` (an hour by default), so the baseline is watched for a bounded window and reports how
many came back in it. Target: every call again within 45 s, none lost, none run twice but the one that had
started.

``long_run``: one call running 3 minutes on a live worker under the default lease: the number of times it
started (target: 1).

With ``--quick``: 10 prefetched calls, a 3 s lease, the baseline watched for 5 s and a 9 s long run, a smoke
test of the figures rather than their numbers.
"""

from __future__ import annotations

import time
import uuid
from statistics import median
from typing import Any

from celery_redisdelay.testing import wait_for

from ..app import BenchApp, build
from ..common import RECOVERY_QUEUE, server_ms
from ..context import Context
from ..marks import Mark, read_marks
from ..report import Row

TARGET_SECONDS = 45.0
LONG_SECONDS = 20.0
PREFETCH = 60
#: How long the baseline is watched after the kill for its calls to come back.
BASELINE_WINDOW = 75.0
#: The lease of a --quick run (s).
QUICK_LEASE = 3.0


def on_second(mark: Mark) -> bool:
    """Whether the start was on the second worker (the sleeper tasks mark their worker)."""
    return (mark.worker or "").startswith("recovery-second@")


def one_side(
    ctx: Context,
    app: BenchApp,
    *,
    ours: bool,
    prefetched: int,
    window: float,
    lease: float | None,
    tracked: bool = False,
) -> dict[str, Any]:
    """Run the scenario once; per call, the seconds from the kill to its start on the second worker. ``tracked``:
    ours are the plain task's calls due now, tracked (``app`` and the workers with ``redisdelay_track_due_now``)."""
    key = f"bench:recovery:{uuid.uuid4().hex}"
    task = app.sleeper if ours and not tracked else app.plain_sleeper

    def worker(name: str) -> Any:
        return ctx.processes.worker(
            name,
            queues=RECOVERY_QUEUE,
            concurrency=1,
            precise=True,
            prefetch=PREFETCH,
            lease=lease,
            all_tasks=tracked,
            track=tracked,
        )

    first = worker("recovery-first")
    long = task.apply_async((key, LONG_SECONDS), queue=RECOVERY_QUEUE).id
    wait_for(lambda: any(mark.call_id == long for mark in read_marks(ctx.client, key)), 60, "the long call to start")
    quick = [task.apply_async((key, 0.0), queue=RECOVERY_QUEUE).id for _ in range(prefetched)]
    wait_for(lambda: ctx.client.llen(RECOVERY_QUEUE) == 0 and app.rd.stats()["delayed"] == 0, 60, "the prefetch")
    if ours:

        def all_held() -> bool:
            return all(str(held_by(app, call_id)).startswith("recovery-first@") for call_id in quick)

        wait_for(all_held, 60, "the first worker to hold every call")
    second = worker("recovery-second")
    killed_ms = server_ms(ctx.client)
    ctx.processes.stop(first, kill=True)
    ctx.client.set(f"{key}:awake", 1)  # the long call, run again, ends at once
    wanted = {long, *quick}

    def again() -> set[str]:
        return {mark.call_id for mark in read_marks(ctx.client, key) if on_second(mark)}

    deadline = time.monotonic() + window
    while time.monotonic() < deadline and again() < wanted:
        time.sleep(0.2)
    recovered = {
        mark.call_id: (mark.ms - killed_ms) / 1000
        for mark in read_marks(ctx.client, key)
        if on_second(mark) and mark.call_id in wanted
    }
    runs: dict[str, int] = {}
    for mark in read_marks(ctx.client, key):
        runs[mark.call_id] = runs.get(mark.call_id, 0) + 1
    ctx.processes.stop(second)
    ctx.client.unlink(key, f"{key}:awake")
    seconds = sorted(recovered.values())
    return {
        "calls": len(wanted),
        "recovered": len(recovered),
        "p50_seconds": round(median(seconds), 1) if seconds else None,
        "max_seconds": round(seconds[-1], 1) if seconds else None,
        "twice": sorted(call_id for call_id, count in runs.items() if count > 1),
        "long": long,
        "long_ran_twice": runs.get(long, 0) > 1,
        "window_seconds": window,
    }


def held_by(app: BenchApp, call_id: str) -> str | None:
    found = app.rd.find(call_id)
    return None if found is None else found.meta.get("h")


def recovery(ctx: Context) -> dict[str, Any]:
    return recovery_of(ctx, tracked=False)


def recovery_due_now(ctx: Context) -> dict[str, Any]:
    """The same with a plain task's calls due now, tracked: the long one running and six prefetched."""
    return recovery_of(ctx, tracked=True)


def recovery_of(ctx: Context, *, tracked: bool) -> dict[str, Any]:
    prefetched, lease, window = (10, QUICK_LEASE, 5.0) if ctx.quick else (50, None, BASELINE_WINDOW)
    if tracked:
        prefetched = 6
    app = build(ctx.url, precise=True, prefetch=PREFETCH, all_tasks=tracked, track=tracked)
    plain = build(ctx.url, precise=True, prefetch=PREFETCH) if tracked else app
    try:
        ours = one_side(ctx, app, ours=True, prefetched=prefetched, window=120.0, lease=lease, tracked=tracked)
        ctx.say(f"  ours: {ours}")
        celerys = one_side(ctx, plain, ours=False, prefetched=prefetched, window=window, lease=lease)
        ctx.say(f"  Celery's: {celerys}")
    finally:
        app.app.close()
        if plain is not app:
            plain.app.close()
        ctx.clear(RECOVERY_QUEUE, "unacked", "unacked_index")
    # None lost, all back in time, and only the run the kill cut short ran twice.
    met = (
        ours["recovered"] == ours["calls"]
        and ours["max_seconds"] is not None
        and ours["max_seconds"] <= TARGET_SECONDS
        and set(ours["twice"]) <= ({ours["long"]} if ours["long_ran_twice"] else set())
    )
    all_back = celerys["recovered"] == celerys["calls"]
    kind = "calls due now, tracked," if tracked else "calls"
    row = Row(
        f"recovery ({ours['calls']} {kind} of a SIGKILLed worker, {lease or 30:g} s lease)",
        ours["max_seconds"] if ours["max_seconds"] is not None else "none back",
        "s, the last",
        celerys["max_seconds"] if all_back else None,
        f"plain Celery: {celerys['recovered']} of {celerys['calls']} back within {window:.0f} s",
        None,
        f"all <= {TARGET_SECONDS:.0f} s",
        met,
    )
    return {"rows": [row.as_dict()], "details": {"ours": ours, "celery": celerys}}


def long_run(ctx: Context) -> dict[str, Any]:
    return long_run_of(ctx, tracked=False)


def long_run_due_now(ctx: Context) -> dict[str, Any]:
    """A plain task's call due now, tracked, running 75 s on a live worker under the default lease."""
    return long_run_of(ctx, tracked=True)


def long_run_of(ctx: Context, *, tracked: bool) -> dict[str, Any]:
    seconds, lease = (9.0, QUICK_LEASE) if ctx.quick else (75.0 if tracked else 180.0, None)
    app = build(ctx.url, precise=True, all_tasks=tracked, track=tracked)
    key = f"bench:long:{uuid.uuid4().hex}"
    worker = ctx.processes.worker(
        "long-run", queues=RECOVERY_QUEUE, concurrency=1, precise=True, lease=lease, all_tasks=tracked, track=tracked
    )
    task = app.plain_sleeper if tracked else app.sleeper
    try:
        call = task.apply_async((key, seconds), queue=RECOVERY_QUEUE).id
        wait_for(lambda: app.rd.find(call) is None, seconds + 120, "the long run to be acknowledged", interval=1.0)
        started = [mark for mark in read_marks(ctx.client, key) if mark.call_id == call]
    finally:
        ctx.processes.stop(worker)
        app.app.close()
        ctx.client.unlink(key)
    row = Row(
        f"long_run ({seconds:.0f} s run{', due now, tracked' if tracked else ''}, {lease or 30:g} s lease)",
        len(started),
        "starts",
        1,
        "exactly once",
        None,
        "1 start",
        len(started) == 1,
    )
    return {"rows": [row.as_dict()], "details": {"seconds": seconds, "starts": len(started)}}
