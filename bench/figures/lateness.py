"""Lateness: from a call's due time to its start on a worker, with a small and a large parked backlog.

Measured for the beat tick (worker + beat, ``redisdelay_tick_interval=1.0``) and, when the package has one,
for the precise releaser (the same worker, beat stopped, ``celery redisdelay releaser`` started with
``redisdelay_precise_release=True``); then for the precise releaser as a greenlet of a ``--pool gevent``
worker (``redisdelay_precise_release=True``), which also runs the calls. The calls record the Redis server
time when they start; their due time is their score in the store right after parking, so both ends use one
clock.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from celery_redisdelay.testing import wait_for

from ..app import BenchApp, build
from ..common import DEFAULT_QUEUE, server_ms
from ..context import Context
from ..fill import Template, park_copies, template
from ..marks import read_marks
from ..processes import mem_available_bytes
from ..report import NOT_IMPLEMENTED, Row, percentile, ratio

TICK_INTERVAL = 1.0
LEAD = 1.5  # seconds from parking to the first due time, so every score is read while still parked
FAR_FUTURE_MS = 30 * 24 * 3600 * 1000  # background calls are due in 30 days
HEADROOM = 2.0  # the large background must fit in MemAvailable this many times over
TICK_SLACK_MS = 50.0
PRECISE_P50_MS, PRECISE_P99_MS = 5.0, 20.0
GROWTH = 1.3  # the large-backlog p99 at most this many times the small-backlog p99


def measure(ctx: Context, parker: BenchApp, label: str) -> dict[str, Any]:
    """Park calls due over the spread, wait for all to start, and return their lateness percentiles (ms)."""
    count, spread = ctx.sizes.lateness_calls, ctx.sizes.lateness_spread
    client, keys = ctx.client, ctx.bench.rd.keys
    marks = f"bench:lateness:{uuid.uuid4().hex}"
    ids = [parker.stamp.apply_async((marks, i), countdown=LEAD + spread * i / count).id for i in range(count)]
    scores = client.zmscore(keys.delayed, ids)
    if any(score is None for score in scores):
        raise RuntimeError(f"{label}: calls were released before their due time was read; raise LEAD")
    wait_for(lambda: client.llen(marks) >= count, LEAD + spread + 60, f"{count} calls to start ({label})", 0.1)
    started = {mark.call_id: mark.ms for mark in read_marks(client, marks)}
    client.unlink(marks)
    late = [started[call_id] - float(due or 0) for call_id, due in zip(ids, scores, strict=True)]
    result = {
        "calls": count,
        "p50_ms": percentile(late, 50),
        "p99_ms": percentile(late, 99),
        "max_ms": max(late),
        "min_ms": min(late),
    }
    ctx.say(f"  {label}: p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, min {result['min_ms']:.0f} ms")
    return result


def fill_background(ctx: Context, tpl: Template, count: int) -> None:
    if count <= 0:
        return
    started = time.perf_counter()
    park_copies(ctx.bench, ctx.client, tpl, count, server_ms(ctx.client) + FAR_FUTURE_MS)
    total = ctx.bench.rd.stats()["delayed"]
    ctx.say(f"  background: +{count:,} parked calls in {time.perf_counter() - started:.1f} s ({total:,} in all)")


def fitting_large(ctx: Context, small: int, per_call: float) -> int:
    """The large background size that fits in available memory with headroom (the wanted size if it does)."""
    wanted = ctx.sizes.lateness_large
    available = mem_available_bytes()
    if (wanted - small) * per_call * HEADROOM <= available:
        return wanted
    fits = small + int(available / HEADROOM / per_call) // 1000 * 1000
    ctx.say(f"  only {available / 2**30:.1f} GiB available: background scaled down from {wanted:,} to {fits:,}")
    return max(small, fits)


def _rows(mode: str, small: int, large: int, runs: dict[str, Any]) -> list[Row]:
    """The table rows of one mode: p50 and p99 per background size, and the large/small p99 ratio."""
    if mode == "precise":
        p50_target, p99_target = f"< {PRECISE_P50_MS:.0f} ms", f"< {PRECISE_P99_MS:.0f} ms"
    else:
        p50_target, p99_target = "", f"<= {TICK_INTERVAL * 1000 + TICK_SLACK_MS:.0f} ms"

    def p50_met(value: float) -> bool | None:
        return value < PRECISE_P50_MS if mode == "precise" else None

    def p99_met(value: float) -> bool:
        if mode == "precise":
            return value < PRECISE_P99_MS
        return value <= TICK_INTERVAL * 1000 + TICK_SLACK_MS

    rows: list[Row] = []
    for size, run in ((small, runs.get("small")), (large, runs.get("large"))):
        if run is None:
            rows.append(Row(f"lateness {mode} p50 (bg {size:,})", NOT_IMPLEMENTED, "ms", target=p50_target))
            rows.append(Row(f"lateness {mode} p99 (bg {size:,})", NOT_IMPLEMENTED, "ms", target=p99_target))
            continue
        rows.append(Row(f"lateness {mode} p50 (bg {size:,})", run["p50_ms"], "ms", target=p50_target))
        rows[-1].met = p50_met(run["p50_ms"])
        rows.append(Row(f"lateness {mode} p99 (bg {size:,})", run["p99_ms"], "ms", target=p99_target))
        rows[-1].met = p99_met(run["p99_ms"])
    name = f"lateness {mode} p99 (bg {large:,} vs {small:,})"
    if runs.get("small") is None or runs.get("large") is None:
        rows.append(Row(name, NOT_IMPLEMENTED, "ms", target=f"<= {GROWTH}x"))
    else:
        ours, base = runs["large"]["p99_ms"], runs["small"]["p99_ms"]
        found = ratio(ours, base)
        met = found is not None and found <= GROWTH
        rows.append(Row(name, ours, "ms", base, f"p99 with bg {small:,}", found, f"<= {GROWTH}x", met))
    return rows


def _gevent_rows(small: int, run: dict[str, Any]) -> list[Row]:
    """p50 and p99 of the precise releaser in a gevent worker, against the same targets."""
    rows: list[Row] = []
    for name, target, bound in (("p50", PRECISE_P50_MS, "p50_ms"), ("p99", PRECISE_P99_MS, "p99_ms")):
        label = f"lateness precise in gevent {name} (bg {small:,})"
        if "small" not in run:
            rows.append(Row(label, NOT_IMPLEMENTED, "ms", target=f"< {target:.0f} ms"))
            continue
        value = run["small"][bound]
        rows.append(Row(label, value, "ms", target=f"< {target:.0f} ms", met=value < target))
    return rows


def lateness(ctx: Context) -> dict[str, Any]:
    """p50/p99 of due time -> task start, beat tick and precise releaser, with a small and a large backlog."""
    sizes, processes, client = ctx.sizes, ctx.processes, ctx.client
    small = sizes.lateness_small
    ctx.clear()
    has_releaser = processes.has_releaser()
    ctx.say(f"  precise releaser: {'found' if has_releaser else NOT_IMPLEMENTED}")
    tpl = template(ctx.bench, DEFAULT_QUEUE)

    before = ctx.used_memory()
    fill_background(ctx, tpl, small)
    per_call = max(1.0, (ctx.used_memory() - before) / small)
    large = fitting_large(ctx, small, per_call)

    # One worker (prefork, 2 processes) runs the calls in both modes; it runs no releaser of its own.
    tick: dict[str, Any] = {}
    precise: dict[str, Any] = {}
    in_gevent: dict[str, Any] = {}
    worker = processes.worker("bench-late", queues=DEFAULT_QUEUE, concurrency=2, tick_interval=TICK_INTERVAL)
    try:
        beat = processes.beat(tick_interval=TICK_INTERVAL)
        try:
            tick["small"] = measure(ctx, ctx.bench, f"tick, bg {small:,}")
            fill_background(ctx, tpl, large - small)
            tick["large"] = measure(ctx, ctx.bench, f"tick, bg {large:,}")
        finally:
            processes.stop(beat)
        if has_releaser:
            # The releaser alone, without beat; the calls are parked by an app with precise release on too.
            parker = build(ctx.url, precise=True)
            releaser = processes.releaser()
            try:
                precise["large"] = measure(ctx, parker, f"precise, bg {large:,}")
                ctx.clear()
                fill_background(ctx, tpl, small)
                precise["small"] = measure(ctx, parker, f"precise, bg {small:,}")
            finally:
                processes.stop(releaser)
                parker.app.close()
    finally:
        processes.stop(worker)
    if has_releaser:
        # The precise releaser in a gevent worker: a greenlet beside the tasks' greenlets (bg small still parked).
        parker = build(ctx.url, precise=True)
        greenlets = processes.worker(
            "bench-late-gevent", queues=DEFAULT_QUEUE, pool="gevent", concurrency=10, precise=True
        )
        try:
            in_gevent["small"] = measure(ctx, parker, f"precise in a gevent worker, bg {small:,}")
        finally:
            processes.stop(greenlets)
            parker.app.close()
    ctx.clear()
    client.unlink(DEFAULT_QUEUE)

    rows = _rows("tick", small, large, tick) + _rows("precise", small, large, precise) + _gevent_rows(small, in_gevent)
    details = {
        "tick_interval_s": TICK_INTERVAL,
        "background_small": small,
        "background_large": large,
        "background_large_wanted": sizes.lateness_large,
        "background_bytes_per_call": per_call,
        "tick": tick,
        "precise": precise if has_releaser else NOT_IMPLEMENTED,
        "precise_in_gevent_worker": in_gevent if has_releaser else NOT_IMPLEMENTED,
    }
    return {"rows": [row.as_dict() for row in rows], "details": details}
