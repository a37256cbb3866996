"""Redis memory per parked call, against a plain Celery message waiting in the broker queue."""

from __future__ import annotations

from typing import Any

from ..common import MEMORY_PLAIN_QUEUE as PLAIN_QUEUE
from ..common import MEMORY_QUEUE as PARK_QUEUE
from ..context import Context
from ..report import Row, ratio

COUNTDOWN = 3600


def redis_memory_per_call(ctx: Context) -> dict[str, Any]:
    """``INFO memory`` used_memory delta / N for N calls parked with ``apply_async``, and for N plain messages."""
    n = ctx.sizes.memory_per_call
    bench = ctx.bench
    ctx.clear(PLAIN_QUEUE)
    bench.delayed_noop.apply_async((0,), countdown=COUNTDOWN, queue=PARK_QUEUE)  # connections and scripts
    bench.plain_noop.apply_async((0,), countdown=COUNTDOWN, queue=PLAIN_QUEUE)
    ctx.clear(PLAIN_QUEUE)

    before = ctx.used_memory()
    ids = [bench.delayed_noop.apply_async((i,), countdown=COUNTDOWN, queue=PARK_QUEUE).id for i in range(n)]
    ours = (ctx.used_memory() - before) / n
    sample = ids[len(ids) // 2]
    payload_bytes = int(ctx.client.hstrlen(bench.rd.keys.payloads, sample))
    meta_bytes = int(ctx.client.hstrlen(bench.rd.keys.meta, sample))
    if bench.rd.stats()["delayed"] != n:
        raise RuntimeError(f"parked {n} calls, found {bench.rd.stats()['delayed']}")
    ctx.clear()

    before = ctx.used_memory()
    for i in range(n):
        bench.plain_noop.apply_async((i,), countdown=COUNTDOWN, queue=PLAIN_QUEUE)
    plain = (ctx.used_memory() - before) / n
    message_bytes = len(ctx.client.lindex(PLAIN_QUEUE, 0) or b"")
    ctx.clear(PLAIN_QUEUE)

    ctx.say(f"  ours {ours:,.0f} B/call (envelope {payload_bytes} B, meta {meta_bytes} B)")
    ctx.say(f"  plain Celery message in the queue: {plain:,.0f} B/call ({message_bytes} B message)")
    row = Row(
        "redis_memory_per_call",
        ours,
        "B/call",
        plain,
        "plain message in the broker queue",
        ratio(ours, plain),
        "(reported)",
        None,
    )
    details = {
        "calls": n,
        "envelope_bytes": payload_bytes,
        "meta_bytes": meta_bytes,
        "plain_message_bytes": message_bytes,
    }
    return {"rows": [row.as_dict()], "details": details}
