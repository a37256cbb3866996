"""What the history costs the release, ack and park paths: the same scripts with and without their per-minute
count.

Every script counts each change twice, in the running ``counters`` and in the current minute of ``history``
(one more ``HINCRBY`` per total a script touches, not per call). The baseline is the package's own scripts with
the history writes taken out of history.lua's ``count`` and ``release.lua`` (nothing else differs), run by the
same store on the same Redis in the same run. Rounds alternate (with, without, without, with, ...) so a slow
moment of the machine lands on both. Two figures per path: the Redis time per call, from ``INFO commandstats``
(what the scripts cost the server), and the wall time per call (what the releaser or the worker waits). The
noise is how far rounds of the same scripts differ from each other: the history must cost no more than that.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery_redisdelay.store import scripts as store_scripts
from celery_redisdelay.store.calls import CallStore, text

from ..common import RELEASE_QUEUE
from ..context import Context
from ..fill import park_copies, template
from ..report import Row, ratio

ROUNDS = 4  # per side, after a warm-up round of each
MOST_CALLS = 20_000
#: The history's writes, as they stand in the scripts: taken out for the baseline.
HISTORY_WRITES = {
    "history": (
        """    if not history_minute then
        history_minute = string.format('%d', math.floor(now_ms() / 60000))
    end
    redis.call('HINCRBY', HISTORY, history_minute .. ':' .. name, n)
"""
    ),
    "release": "redis.call('HSET', HISTORY, 'released_at', string.format('%d', now))",
}


PACKAGE_SOURCE = store_scripts.source


def without_history(name: str) -> str:
    """The source of script ``name`` with the history's writes taken out (the sweep's pruning stays: it is
    off the release and ack paths)."""
    text = PACKAGE_SOURCE(name)
    expected = {"history"} if "local function count(" in text else set()
    if name == "release":
        expected.add("release")
    for part in expected:
        if HISTORY_WRITES[part] not in text:
            raise RuntimeError(f"{name}.lua writes the history differently now: update bench/figures/history.py")
        text = text.replace(HISTORY_WRITES[part], "")
    return text


@contextmanager
def scripts_of(store: CallStore, history: bool) -> Iterator[None]:
    """Run ``store`` on the package's scripts, or (``history`` False) on the baseline's."""
    if history:
        yield
        return
    kept = store._scripts
    store_scripts.source = without_history  # type: ignore[assignment]
    try:
        store._scripts = store_scripts.Scripts(store.client, [key.encode() for key in store.keys.store_keys])
    finally:
        store_scripts.source = PACKAGE_SOURCE
    try:
        yield
    finally:
        store._scripts = kept


def evalsha_usec(client: Any) -> float:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec", 0))


def one_round(ctx: Context, tpl: Any, n: int, history: bool) -> dict[str, float]:
    """Release ``n`` due calls with ticks, acknowledge each, then park a tenth as many: Redis µs and wall µs per
    call, each path."""
    rd, client = ctx.bench.rd, ctx.client
    ctx.clear(RELEASE_QUEUE)
    park_copies(ctx.bench, client, tpl, n, 0)
    out: dict[str, float] = {}
    with scripts_of(rd.store, history):
        client.config_resetstat()
        started = time.perf_counter()
        while rd.stats()["due"]:
            rd.tick()
        out["release_wall"] = (time.perf_counter() - started) / n * 1e6
        out["release_redis"] = evalsha_usec(client) / n
        members: list[bytes] = client.zrange(rd.keys.inflight, 0, -1)  # type: ignore[assignment]
        ids = [text(member) for member in members]
        if len(ids) != n:
            raise RuntimeError(f"{len(ids)} of {n} calls in flight after the release")
        client.config_resetstat()
        started = time.perf_counter()
        for call_id in ids:
            rd.store.ack(call_id)
        out["ack_wall"] = (time.perf_counter() - started) / n * 1e6
        out["ack_redis"] = evalsha_usec(client) / n
        # A park counts too (calls parked per minute): one apply_async at a time, an hour away.
        parks = max(1, n // 10)
        task = ctx.bench.delayed_noop
        client.config_resetstat()
        started = time.perf_counter()
        for i in range(parks):
            task.apply_async((i,), countdown=3600)
        out["park_wall"] = (time.perf_counter() - started) / parks * 1e6
        out["park_redis"] = evalsha_usec(client) / parks
    ctx.clear(RELEASE_QUEUE)
    return out


def spread(values: list[float]) -> float:
    """How far rounds of the same side differ: (largest - smallest) / median."""
    return (max(values) - min(values)) / statistics.median(values)


def history_cost(ctx: Context) -> dict[str, Any]:
    """Redis time per call of the release and the ack, with the history and without it."""
    n = min(ctx.sizes.release, MOST_CALLS)
    tpl = template(ctx.bench, RELEASE_QUEUE)
    rounds: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    order = [True, False] + [side for turn in range(ROUNDS) for side in ((False, True) if turn % 2 else (True, False))]
    for index, history in enumerate(order):
        measured = one_round(ctx, tpl, n, history)
        counted = index >= 2  # the first round of each side warms up
        if counted:
            rounds[history].append(measured)
        ctx.say(
            f"  {'with' if history else 'without'} history{'' if counted else ' (warm-up)'}: release "
            f"{measured['release_redis']:.2f} µs/call in Redis ({measured['release_wall']:.1f} wall), ack "
            f"{measured['ack_redis']:.2f} µs ({measured['ack_wall']:.1f} wall), park {measured['park_redis']:.2f} µs "
            f"({measured['park_wall']:.1f} wall)"
        )
    rows, details = [], {"calls": n, "rounds": ROUNDS, "measured": {"with": rounds[True], "without": rounds[False]}}
    for path in ("release", "ack", "park"):
        for where, unit in (("redis", "µs/call in Redis"), ("wall", "µs/call, wall")):
            field = f"{path}_{where}"
            with_history = statistics.median(r[field] for r in rounds[True])
            without = statistics.median(r[field] for r in rounds[False])
            noise = max(spread([r[field] for r in rounds[side]]) for side in (True, False))
            cost = ratio(with_history, without)
            details[field] = {"with_us": with_history, "without_us": without, "cost": cost, "noise": noise}
            rows.append(
                Row(
                    f"history cost: {path} ({where})",
                    with_history,
                    unit,
                    without,
                    "the same scripts without the history",
                    cost,
                    f"<= 1 + noise ({1 + noise:.2f}x)",
                    cost is not None and cost <= 1 + noise,
                )
            )
    return {"rows": [row.as_dict() for row in rows], "details": details}
