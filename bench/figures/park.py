"""Parking: one ``apply_async`` at a time against Celery's own countdown, and ``park_many`` against a raw pipeline."""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..app import build
from ..common import PARK_PLAIN_QUEUE, PARK_QUEUE
from ..context import Context
from ..fill import CHUNK, template
from ..report import NOT_IMPLEMENTED, Row, ratio

SCRATCH_ZSET = "bench:scratch:zset"
SCRATCH_HASH = "bench:scratch:hash"
WARMUP = 20
COUNTDOWN = 60


#: The rounds each side's calls are split into, taken in turns (the side that goes first alternating), so that a
#: slow moment of the machine lands on both sides alike; two rounds a side let one land on one side only (the ratio
#: of one run moved 1.42x to 2.01x from run to run on one machine).
RACE_ROUNDS = 10


def race(delayed: Any, plain: Any, n: int) -> tuple[float, float]:
    """Calls/s of ``delayed.apply_async(countdown=60)`` and of ``plain.apply_async(countdown=60)``, one call
    at a time, in :data:`RACE_ROUNDS` rounds each, interleaved."""

    def timed(task: Any, queue: str, count: int) -> float:
        started = time.perf_counter()
        for i in range(count):
            task.apply_async((i,), countdown=COUNTDOWN, queue=queue)
        return time.perf_counter() - started

    timed(delayed, PARK_QUEUE, WARMUP)
    timed(plain, PARK_PLAIN_QUEUE, WARMUP)
    ours = celery = 0.0
    for turn in range(RACE_ROUNDS):
        size = n // RACE_ROUNDS + (1 if turn < n % RACE_ROUNDS else 0)
        if turn % 2:
            celery += timed(plain, PARK_PLAIN_QUEUE, size)
            ours += timed(delayed, PARK_QUEUE, size)
        else:
            ours += timed(delayed, PARK_QUEUE, size)
            celery += timed(plain, PARK_PLAIN_QUEUE, size)
    return n / ours, n / celery


def round_trip_us(ctx: Context, n: int) -> tuple[float, float]:
    """Microseconds of one EVALSHA of an empty script: through redis-py's command layer, and written and
    read on one of its connections directly (what the command layer costs is the difference)."""
    sha = ctx.client.script_load("return 1")
    started = time.perf_counter()
    for _ in range(n):
        ctx.client.evalsha(sha, 0)
    layered = (time.perf_counter() - started) / n * 1e6
    connection: Any = ctx.client.connection_pool.get_connection()
    try:
        started = time.perf_counter()
        for _ in range(n):
            connection.send_command("EVALSHA", sha, 0)
            connection.read_response()
        raw = (time.perf_counter() - started) / n * 1e6
    finally:
        ctx.client.connection_pool.release(connection)
    return layered, raw


def park_single(ctx: Context) -> dict[str, Any]:
    """Calls/s of a delayed task's ``apply_async(countdown=60)`` vs a plain task's, same broker, one at a
    time: without a result backend, and with a Redis one (Celery subscribes to each result when it sends)."""
    n = ctx.sizes.park_single
    rows: list[dict[str, Any]] = []
    details: dict[str, Any] = {"calls": n}
    for name, bench in (
        ("park_single", ctx.bench),
        ("park_single (Redis results)", build(ctx.url, results=True)),
    ):
        ctx.clear(PARK_PLAIN_QUEUE)
        before = bench.rd.stats()["delayed"]
        ctx.client.config_resetstat()  # the park script's time inside Redis: only our side runs EVALSHA
        ours_rate, celery_rate = race(bench.delayed_noop, bench.plain_noop, n)
        script_us = float(ctx.client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
        parked = bench.rd.stats()["delayed"] - before
        queued = int(ctx.client.llen(PARK_PLAIN_QUEUE))
        if parked != n + WARMUP or queued != n + WARMUP:
            raise RuntimeError(f"{name}: expected {n + WARMUP} calls each side, found {parked} parked, {queued} queued")
        ctx.clear(PARK_PLAIN_QUEUE)
        found = ratio(ours_rate, celery_rate)
        ctx.say(f"  {name}: ours {ours_rate:,.0f} calls/s, Celery {celery_rate:,.0f} calls/s")
        ctx.say(f"    a park: {1e6 / ours_rate:,.0f} µs, of which the park script inside Redis {script_us:,.1f} µs")
        rows.append(
            Row(
                name,
                ours_rate,
                "calls/s",
                celery_rate,
                "Celery apply_async(countdown=60)",
                found,
                ">= 2.5x",
                found is not None and found >= 2.5,
            ).as_dict()
        )
        details[f"{name} ours/celery"] = [ours_rate, celery_rate]
        details[f"{name} script_us"] = script_us
    layered, raw = round_trip_us(ctx, n)
    ctx.say(f"  an empty script's EVALSHA: {layered:,.0f} µs through redis-py, {raw:,.0f} µs on its connection")
    details["empty_evalsha_us"] = {"redis_py": layered, "connection": raw}
    return {"rows": rows, "details": details}


def raw_pipeline_rate(ctx: Context, payload: bytes, n: int) -> float:
    """Calls/s of writing ``n`` copies of ``payload``: pipelined ZADD + HSET per call, 1000 calls a round trip."""
    ids = [uuid.uuid4().hex for _ in range(n)]
    ctx.client.unlink(SCRATCH_ZSET, SCRATCH_HASH)
    started = time.perf_counter()
    for start in range(0, n, CHUNK):
        pipe: Any = ctx.client.pipeline(transaction=False)
        for call_id in ids[start : start + CHUNK]:
            pipe.execute_command("ZADD", SCRATCH_ZSET, 1, call_id)
            pipe.execute_command("HSET", SCRATCH_HASH, call_id, payload)
        pipe.execute()
    seconds = time.perf_counter() - started
    written = int(ctx.client.zcard(SCRATCH_ZSET))
    ctx.client.unlink(SCRATCH_ZSET, SCRATCH_HASH)
    if written != n:
        raise RuntimeError(f"the raw pipeline wrote {written} of {n} copies")
    return n / seconds


def park_bulk(ctx: Context) -> dict[str, Any]:
    """Calls/s of ``task.park_many(args_list, countdown=60)``, if the package has it, vs a raw Redis pipeline."""
    n = ctx.sizes.park_bulk
    bench = ctx.bench
    ctx.clear(SCRATCH_ZSET, SCRATCH_HASH)
    payload = template(bench, PARK_QUEUE).payload
    raw_rate = raw_pipeline_rate(ctx, payload, n)
    ctx.say(f"  raw pipelined ZADD+HSET of {len(payload)}-byte payloads: {raw_rate:,.0f} calls/s")
    target = ">= 50,000 calls/s and >= 0.6x"
    details: dict[str, Any] = {"calls": n, "payload_bytes": len(payload), "raw_rate": raw_rate}
    park_many = getattr(bench.delayed_noop, "park_many", None)
    if park_many is None:
        ctx.say("  the delayed task has no park_many: not implemented")
        row = Row("park_bulk", NOT_IMPLEMENTED, "calls/s", raw_rate, "raw pipelined ZADD+HSET", None, target, None)
        return {"rows": [row.as_dict()], "details": details}
    args = [(i,) for i in range(n)]
    park_many(args[:WARMUP], countdown=COUNTDOWN)
    started = time.perf_counter()
    results = park_many(args, countdown=COUNTDOWN)
    seconds = time.perf_counter() - started
    parked = bench.rd.stats()["delayed"]
    if len(results) != n or parked != n + WARMUP:
        raise RuntimeError(f"park_many of {n} calls returned {len(results)} results and left {parked - WARMUP} parked")
    ours_rate = n / seconds
    found = ratio(ours_rate, raw_rate)
    ctx.say(f"  park_many: {ours_rate:,.0f} calls/s")
    ctx.clear()
    row = Row(
        "park_bulk",
        ours_rate,
        "calls/s",
        raw_rate,
        "raw pipelined ZADD+HSET",
        found,
        target,
        ours_rate >= 50_000 and found is not None and found >= 0.6,
    )
    details["ours_seconds"] = seconds
    return {"rows": [row.as_dict()], "details": details}


def send_due_now(ctx: Context) -> dict[str, Any]:
    """Calls/s of a plain task's ``apply_async()`` due now, tracked (``redisdelay_track_due_now``: stored in flight and
    queued in one script), against Celery's own publish of the same call, one at a time, nobody consuming."""
    n = ctx.sizes.park_single
    tracking = build(ctx.url, all_tasks=True, track=True)
    ctx.clear(PARK_QUEUE, PARK_PLAIN_QUEUE)

    def timed(task: Any, queue: str, count: int) -> float:
        started = time.perf_counter()
        for i in range(count):
            task.apply_async((i,), queue=queue)
        return time.perf_counter() - started

    try:
        timed(tracking.plain_noop, PARK_QUEUE, WARMUP)
        timed(ctx.bench.plain_noop, PARK_PLAIN_QUEUE, WARMUP)
        half = n // 2
        ours = timed(tracking.plain_noop, PARK_QUEUE, half) + timed(tracking.plain_noop, PARK_QUEUE, n - half)
        celery = timed(ctx.bench.plain_noop, PARK_PLAIN_QUEUE, half)
        celery += timed(ctx.bench.plain_noop, PARK_PLAIN_QUEUE, n - half)
        tracked = tracking.rd.stats()["inflight"]
        queued = int(ctx.client.llen(PARK_QUEUE)), int(ctx.client.llen(PARK_PLAIN_QUEUE))
        if tracked != n + WARMUP or queued != (n + WARMUP, n + WARMUP):
            raise RuntimeError(f"expected {n + WARMUP} calls each side, found {tracked} tracked, queued {queued}")
    finally:
        tracking.app.close()
        ctx.clear(PARK_QUEUE, PARK_PLAIN_QUEUE)
    ours_rate, celery_rate = n / ours, n / celery
    found = ratio(ours_rate, celery_rate)
    ctx.say(f"  send_due_now: ours {ours_rate:,.0f} calls/s, Celery {celery_rate:,.0f} calls/s")
    row = Row(
        "send_due_now (tracked)",
        ours_rate,
        "calls/s",
        celery_rate,
        "Celery apply_async(), due now",
        found,
        ">= 1.0x",
        found is not None and found >= 1.0,
    )
    return {"rows": [row.as_dict()], "details": {"calls": n, "ours/celery": [ours_rate, celery_rate]}}
