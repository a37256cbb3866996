"""Releasing a backlog of due calls: ``rd.tick()`` against a ``send_task`` loop, a raw Lua mover, and the least an
at-least-once mover does (the raw mover, keeping each call in flight with a deadline instead of forgetting it)."""

from __future__ import annotations

import time
from typing import Any

from ..common import RELEASE_QUEUE, SEND_QUEUE
from ..context import Context
from ..fill import park_copies, template, write_copies
from ..report import Row, ratio

RAW_ZSET = "bench:raw:delayed"
RAW_HASH = "bench:raw:payloads"
RAW_QUEUE = "bench:raw:queue"
RAW_INFLIGHT = "bench:raw:inflight"
RAW_BATCH = 1000
DEADLINE = 600.0
ROUNDS = 2

#: The least a releaser must do per call: take due ids, read the payload, push it, forget the call.
RAW_MOVER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(ids) do
    local payload = redis.call('HGET', KEYS[2], id)
    if payload then
        redis.call('LPUSH', KEYS[3], payload)
    end
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
end
return #ids
"""

#: The least an at-least-once releaser does per call: take due ids, push each payload, and move the id in flight
#: with a deadline, keeping its payload for a delivery again (what a lost call is brought back from).
AT_LEAST_ONCE_MOVER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local deadline = now + tonumber(ARGV[2])
for _, id in ipairs(ids) do
    local payload = redis.call('HGET', KEYS[2], id)
    if payload then
        redis.call('LPUSH', KEYS[3], payload)
    end
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[4], deadline, id)
end
return #ids
"""


def release_backlog(ctx: Context, tpl: Any, n: int) -> tuple[float, int]:
    """Seconds ``rd.tick()`` takes to release a backlog of ``n`` due calls, and the ticks it took."""
    bench, client = ctx.bench, ctx.client
    rd = bench.rd
    ctx.clear(RELEASE_QUEUE)
    started = time.perf_counter()
    park_copies(bench, client, tpl, n, 0)
    ctx.say(f"  {n:,} due calls in the store in {time.perf_counter() - started:.1f} s")
    if rd.stats()["due"] != n:
        raise RuntimeError(f"expected {n} due calls, the store has {rd.stats()['due']}")
    ticks = released = 0
    started = time.perf_counter()
    while True:
        report = rd.tick()
        ticks += 1
        released += report["released"]
        if rd.stats()["due"] == 0:
            break
        if time.perf_counter() - started > DEADLINE:
            raise TimeoutError(f"the tick released {released} of {n} calls in {DEADLINE:.0f} s")
    seconds = time.perf_counter() - started
    queued = int(client.llen(RELEASE_QUEUE))
    if released != n or queued != n:
        raise RuntimeError(f"the tick reported {released} released, the queue holds {queued}, expected {n}")
    ctx.clear(RELEASE_QUEUE)
    return seconds, ticks


def raw_backlog(ctx: Context, tpl: Any, n: int, script: str = RAW_MOVER) -> float:
    """Seconds a Lua mover (the raw one, or the at-least-once one) takes to move a backlog of ``n`` copies of the
    same payload."""
    client = ctx.client
    write_copies(client, tpl, n, 0, zset=RAW_ZSET, payloads=RAW_HASH, meta=None)
    mover = client.register_script(script)
    moved = 0
    queue_ms = round(ctx.bench.rd.settings.queue_timeout * 1000)
    started = time.perf_counter()
    while True:
        count = int(mover(keys=[RAW_ZSET, RAW_HASH, RAW_QUEUE, RAW_INFLIGHT], args=[RAW_BATCH, queue_ms]))
        moved += count
        if count == 0:
            break
    seconds = time.perf_counter() - started
    if moved != n or int(client.llen(RAW_QUEUE)) != n:
        raise RuntimeError(f"the raw mover moved {moved} of {n} calls")
    ctx.clear(RAW_ZSET, RAW_HASH, RAW_QUEUE, RAW_INFLIGHT)
    return seconds


def release(ctx: Context) -> dict[str, Any]:
    """Calls/s of ``rd.tick()`` releasing N due calls to the broker, vs ``send_task`` and a raw Lua mover;
    ours and the raw mover take turns over ROUNDS rounds, so that a slow moment of the machine does not
    land on one side only."""
    n = ctx.sizes.release
    bench = ctx.bench
    rd = bench.rd
    ctx.clear(RELEASE_QUEUE, SEND_QUEUE, RAW_ZSET, RAW_HASH, RAW_QUEUE, RAW_INFLIGHT)
    tpl = template(bench, RELEASE_QUEUE)
    ours_seconds = raw_seconds = alo_seconds = 0.0
    ticks = 0
    round_ratios = []
    for turn in range(ROUNDS + 1):
        seconds, took = release_backlog(ctx, tpl, n)
        raw = raw_backlog(ctx, tpl, n)
        alo = raw_backlog(ctx, tpl, n, AT_LEAST_ONCE_MOVER)
        what = f"round {turn}" if turn else "warm-up round (not counted)"
        ctx.say(
            f"  {what}: rd.tick() {n / seconds:,.0f} calls/s ({took} ticks), raw mover {n / raw:,.0f} calls/s, "
            f"at-least-once mover {n / alo:,.0f} calls/s"
        )
        if not turn:
            # Redis takes the memory the first round fills (the pushed messages) from the system page by
            # page; after it, both sides run on memory Redis has already, as a running Redis does.
            continue
        ours_seconds += seconds
        raw_seconds += raw
        alo_seconds += alo
        ticks += took
        round_ratios.append(raw / seconds)
    ours = ROUNDS * n / ours_seconds
    raw_rate = ROUNDS * n / raw_seconds
    alo_rate = ROUNDS * n / alo_seconds

    m = ctx.sizes.release_send_task
    app = bench.app
    for i in range(20):
        app.send_task("bench.plain_noop", args=(i,), queue=SEND_QUEUE)
    started = time.perf_counter()
    for i in range(m):
        app.send_task("bench.plain_noop", args=(i,), queue=SEND_QUEUE)
    send_rate = m / (time.perf_counter() - started)
    ctx.say(f"  send_task loop: {send_rate:,.0f} calls/s")
    ctx.clear(SEND_QUEUE)

    vs_send = ratio(ours, send_rate)
    vs_raw = ratio(ours, raw_rate)
    vs_alo = ratio(ours, alo_rate)
    rows = [
        Row(
            "release",
            ours,
            "calls/s",
            send_rate,
            "send_task loop",
            vs_send,
            ">= 40x and >= 100,000 calls/s",
            vs_send is not None and vs_send >= 40 and ours >= 100_000,
        ),
        Row(
            "release vs raw mover",
            ours,
            "calls/s",
            raw_rate,
            "raw Lua mover",
            vs_raw,
            ">= 0.85x",
            vs_raw is not None and vs_raw >= 0.85,
        ),
        Row(
            "release vs at-least-once mover",
            ours,
            "calls/s",
            alo_rate,
            "raw mover + in-flight ZADD",
            vs_alo,
            ">= 0.9x",
            vs_alo is not None and vs_alo >= 0.9,
        ),
    ]
    details = {
        "calls": n,
        "rounds": ROUNDS,
        "round_ratios": round_ratios,
        "ticks": ticks,
        "ours_seconds": ours_seconds,
        "fast_release": getattr(rd, "fast_release", None),  # the package's path that pushes in the script
        "release_batch": rd.settings.release_batch,
        "send_task_calls": m,
        "raw_batch": RAW_BATCH,
    }
    return {"rows": [row.as_dict() for row in rows], "details": details}
