"""What pauses cost the release: a backlog of due calls released by ``rd.tick()`` while 100 other tasks are paused
(the pauses match none of the calls), against the same backlog with no pause. The issue's target: at least 0.9x.
The calls are those of ``release_limited``'s task without limits, over its 1,000 keys; nobody consumes the queue."""

from __future__ import annotations

from typing import Any

from ..context import Context
from ..report import Row, ratio
from .release_limited import release_all, tasks

PAUSES = 100
ROUNDS = 2
TARGET = 0.9


def release_paused(ctx: Context) -> dict[str, Any]:
    """Calls/s released with PAUSES pauses that match nothing, against none; the sides take turns over ROUNDS rounds
    after a warm-up round of each."""
    n = ctx.sizes.release_limited
    _, task = tasks(ctx)
    rd = ctx.bench.rd
    names = [f"bench.paused_elsewhere_{i}" for i in range(PAUSES)]
    seconds = {"paused": 0.0, "none": 0.0}
    script_us = {"paused": 0.0, "none": 0.0}
    for turn in range(ROUNDS + 1):
        for name in names:
            rd.pause(task=name, reason="bench: matches no call")
        paused, paused_us = release_all(ctx, task, n)
        for name in names:
            rd.resume(task=name)
        rd.tick()  # the ended pauses are forgotten
        if rd.paused():
            raise RuntimeError(f"{len(rd.paused())} pauses left after the resume")
        none, none_us = release_all(ctx, task, n)
        ctx.say(
            f"  {'round ' + str(turn) if turn else 'warm-up'}: {PAUSES} pauses {n / paused:,.0f} calls/s "
            f"({paused_us:.1f} us of scripts per call), none {n / none:,.0f} calls/s ({none_us:.1f} us)"
        )
        if turn:
            seconds["paused"] += paused
            seconds["none"] += none
            script_us["paused"] += paused_us / ROUNDS
            script_us["none"] += none_us / ROUNDS
    rate, base = ROUNDS * n / seconds["paused"], ROUNDS * n / seconds["none"]
    found = ratio(rate, base)
    row = Row(
        f"release with {PAUSES} pauses that match no call",
        rate,
        "calls/s",
        base,
        "the same calls, no pause",
        found,
        f">= {TARGET}x",
        found is not None and found >= TARGET,
    )
    details = {"calls": n, "pauses": PAUSES, "rounds": ROUNDS, "script_us_per_call": script_us}
    return {"rows": [row.as_dict()], "details": details}
