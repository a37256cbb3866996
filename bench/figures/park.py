"""Parking: one ``apply_async`` at a time against Celery's own countdown, and ``park_many`` against a raw pipeline."""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..app import PARK_PLAIN_QUEUE, PARK_QUEUE
from ..context import Context
from ..fill import CHUNK, template
from ..report import NOT_IMPLEMENTED, Row, ratio

SCRATCH_ZSET = "bench:scratch:zset"
SCRATCH_HASH = "bench:scratch:hash"
WARMUP = 20
COUNTDOWN = 60


def park_single(ctx: Context) -> dict[str, Any]:
    """Calls/s of a delayed task's ``apply_async(countdown=60)`` vs a plain task's, same broker, one at a time."""
    n = ctx.sizes.park_single
    delayed, plain = ctx.bench.delayed_noop, ctx.bench.plain_noop
    ctx.clear(PARK_PLAIN_QUEUE)

    def ours(count: int) -> float:
        started = time.perf_counter()
        for i in range(count):
            delayed.apply_async((i,), countdown=COUNTDOWN, queue=PARK_QUEUE)
        return time.perf_counter() - started

    def celery(count: int) -> float:
        started = time.perf_counter()
        for i in range(count):
            plain.apply_async((i,), countdown=COUNTDOWN, queue=PARK_PLAIN_QUEUE)
        return time.perf_counter() - started

    ours(WARMUP)
    celery(WARMUP)
    # Two rounds each, interleaved, so a slow moment of the machine does not land on one side only.
    half = n // 2
    ours_seconds = ours(half)
    celery_seconds = celery(half)
    ours_seconds += ours(n - half)
    celery_seconds += celery(n - half)
    parked = ctx.bench.rd.stats()["delayed"]
    queued = int(ctx.client.llen(PARK_PLAIN_QUEUE))
    if parked != n + WARMUP or queued != n + WARMUP:
        raise RuntimeError(f"expected {n + WARMUP} calls each side, found {parked} parked and {queued} queued")
    ctx.clear(PARK_PLAIN_QUEUE)
    ours_rate, celery_rate = n / ours_seconds, n / celery_seconds
    found = ratio(ours_rate, celery_rate)
    ctx.say(f"  ours {ours_rate:,.0f} calls/s, Celery {celery_rate:,.0f} calls/s")
    row = Row(
        "park_single",
        ours_rate,
        "calls/s",
        celery_rate,
        "Celery apply_async(countdown=60)",
        found,
        ">= 1.5x",
        found is not None and found >= 1.5,
    )
    details = {"calls": n, "ours_seconds": ours_seconds, "celery_seconds": celery_seconds}
    return {"rows": [row.as_dict()], "details": details}


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
    target = ">= 50,000 calls/s and >= 0.5x"
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
        ours_rate >= 50_000 and found is not None and found >= 0.5,
    )
    details["ours_seconds"] = seconds
    return {"rows": [row.as_dict()], "details": details}
