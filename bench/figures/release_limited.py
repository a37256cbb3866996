"""Releasing a backlog of due calls under limits: calls of a task limited per key over 1,000 keys, against the same
number of calls of the same task without limits, all released by ``rd.tick()`` in the bench process. Two limited
tasks: one with a rate per key, one with a rate and a concurrency per key (a concurrency costs a read and a write of
the key's count of held slots, and a record of the slots each call holds).

The limits are wide (100,000/s and 1,000 in flight per key), so that they let every call go: the figure measures
what checking them costs the release, not how long the limits hold calls back. Nobody consumes the queue."""

from __future__ import annotations

import time
from typing import Any

from ..common import LIMITED_QUEUE
from ..context import Context
from ..report import Row, ratio

KEYS = 1000
ROUNDS = 2
DEADLINE = 600.0


#: The limited sides: (row label, task name, limits beside the key).
SIDES = (
    ("a rate per key", "bench.rated_noop", {"limit_rate": "100000/s"}),
    ("a rate and a concurrency per key", "bench.limited_noop", {"limit_rate": "100000/s", "limit_concurrency": 1000}),
)


def tasks(ctx: Context) -> tuple[list[Any], Any]:
    """The limited tasks (as SIDES names them) and their unlimited twin, registered once on the bench app."""
    rd, registry = ctx.bench.rd, ctx.bench.app.tasks
    if "bench.unlimited_noop" not in registry:

        def noop(key: int, i: int = 0) -> int:
            return i

        for _, name, limits in SIDES:
            rd.delayed(name=name, queue=LIMITED_QUEUE, limit_key="key:{key}", **limits)(noop)
        rd.delayed(name="bench.unlimited_noop", queue=LIMITED_QUEUE)(noop)
    return [registry[name] for _, name, _ in SIDES], registry["bench.unlimited_noop"]


def script_microseconds(ctx: Context) -> float:
    """Microseconds Redis has spent running scripts so far (its command statistics): what a release costs the
    server, which a busy machine disturbs less than the wall clock."""
    stats: dict[str, Any] = ctx.client.info("commandstats")
    return float(sum(entry["usec"] for command, entry in stats.items() if command.startswith("cmdstat_eval")))


def release_all(ctx: Context, task: Any, n: int) -> tuple[float, float]:
    """Seconds ``rd.tick()`` takes to release ``n`` due calls of ``task``, over KEYS keys (parked first, not
    timed), and the microseconds per call Redis spent in the release scripts."""
    rd, client = ctx.bench.rd, ctx.client
    ctx.clear(LIMITED_QUEUE)
    for i in range(n):
        task.apply_async((i % KEYS, i))
    if rd.stats()["due"] != n:
        raise RuntimeError(f"expected {n} due calls, the store has {rd.stats()['due']}")
    scripts = script_microseconds(ctx)
    started = time.perf_counter()
    while rd.stats()["due"]:
        rd.tick()
        if time.perf_counter() - started > DEADLINE:
            raise TimeoutError(f"the tick did not release {n} calls of {task.name} in {DEADLINE:.0f} s")
    seconds = time.perf_counter() - started
    per_call = (script_microseconds(ctx) - scripts) / n
    queued = int(client.llen(LIMITED_QUEUE))
    if queued != n:
        raise RuntimeError(f"the queue holds {queued} calls of {task.name}, expected {n}")
    ctx.clear(LIMITED_QUEUE)  # and the store: the calls in flight and the limits' slots go
    return seconds, per_call


def release_limited(ctx: Context) -> dict[str, Any]:
    """Calls/s released under each side's limits over KEYS keys, against the same calls without limits; the sides
    take turns over ROUNDS rounds after a warm-up round of each."""
    n = ctx.sizes.release_limited
    limited, unlimited = tasks(ctx)
    seconds = [0.0] * len(limited)
    script_us = [0.0] * len(limited)
    base = base_us = 0.0
    for turn in range(ROUNDS + 1):
        what = f"round {turn}" if turn else "warm-up round (not counted)"
        said = []
        for side, task in enumerate(limited):
            took, us = release_all(ctx, task, n)
            said.append(f"{SIDES[side][0]} {n / took:,.0f} calls/s ({us:.1f} us of scripts per call)")
            if turn:
                seconds[side] += took
                script_us[side] += us / ROUNDS
        without, unlimited_us = release_all(ctx, unlimited, n)
        ctx.say(f"  {what}: {'; '.join(said)}; without limits {n / without:,.0f} calls/s ({unlimited_us:.1f} us)")
        if turn:
            base += without
            base_us += unlimited_us / ROUNDS
    base_rate = ROUNDS * n / base
    rows = []
    for side, took in enumerate(seconds):
        rate = ROUNDS * n / took
        vs = ratio(rate, base_rate)
        rows.append(
            Row(
                f"release under limits ({KEYS:,} keys, {SIDES[side][0]})",
                rate,
                "calls/s",
                base_rate,
                "the same calls without limits",
                vs,
                ">= 0.5x",
                vs is not None and vs >= 0.5,
            ).as_dict()
        )
    return {
        "rows": rows,
        "details": {
            "calls": n,
            "keys": KEYS,
            "rounds": ROUNDS,
            "script_us_per_call": {
                **{SIDES[side][0]: round(us, 2) for side, us in enumerate(script_us)},
                "without limits": round(base_us, 2),
            },
        },
    }
