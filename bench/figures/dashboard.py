"""The dashboard's pages with a million parked calls, against a raw read of the same page.

The store is filled with copies of two real parked calls (nine in ten of ``bench.delayed_noop``, one
in ten of ``bench.stamp``), due over the coming weeks a thousand at a time. Each page is requested
through the WSGI app in this process (Flask's test client: routing, the Redis reads, the template), so
the figure is the server's time per page without the network. The baseline is what a page cannot do
without: one ``ZRANGE`` of its 50 entries and one ``HMGET`` of their metadata, in one pipeline.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ..common import DEFAULT_QUEUE, server_ms
from ..context import Context
from ..fill import template, write_copies
from ..processes import mem_available_bytes
from ..report import Row, ratio

ROUNDS = 15  # timed requests per page, after WARM_UP
WARM_UP = 2
TARGET_MS = 250.0  # "well under a second"
PER_CALL_BYTES = 1600  # Redis memory a copy takes, with room (redis_memory_per_call measures ~1,480)
STEP_MS = 60_000  # the due times of successive thousands, a minute apart
PAGES = (
    ("list, oldest first", "/calls/delayed"),
    ("list, newest first", "/calls/delayed?order=newest"),
    ("list, a task 1 in 10", "/calls/delayed?task=bench.stamp"),
    ("list, a task 1 in 10, newest first", "/calls/delayed?task=bench.stamp&order=newest"),
    ("list, {deep:,} calls in", "/calls/delayed?cursor={deep}"),
    ("overview", "/"),
)
#: Reported, not held to the target: reads its whole scan bound of 10,000 entries and their payloads.
WORST = ("list, argument search finding nothing", "/calls/delayed?q=no-such-text")


def median_ms(action: Callable[[], Any], rounds: int = ROUNDS) -> float:
    for _ in range(WARM_UP):
        action()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def fill(ctx: Context, count: int) -> None:
    """``count`` parked calls, one in ten of ``bench.stamp``, due a minute apart per thousand."""
    bench, keys = ctx.bench, ctx.bench.rd.keys
    noop = template(bench, DEFAULT_QUEUE)
    stamp = template(bench, DEFAULT_QUEUE, bench.stamp, ("bench:dashboard", 0))
    start = server_ms(ctx.client) + 3_600_000
    for round_ in range(count // 1000):
        score = start + round_ * STEP_MS
        for tpl, copies, offset in ((noop, 900, 0), (stamp, 100, STEP_MS // 2)):
            write_copies(
                ctx.client, tpl, copies, score + offset, zset=keys.delayed, payloads=keys.payloads, meta=keys.meta
            )


def dashboard(ctx: Context) -> dict[str, Any]:
    """Median ms per page of the dashboard with ``ctx.sizes.dashboard`` parked calls."""
    from celery_redisdelay.web import create_app

    wanted = ctx.sizes.dashboard
    fits = int(mem_available_bytes() / 2 / PER_CALL_BYTES) // 1000 * 1000
    count = max(1000, min(wanted, fits))
    if count < wanted:
        ctx.say(f"  only room for {count:,} parked calls of the {wanted:,} wanted")
    ctx.clear()
    started = time.perf_counter()
    fill(ctx, count)
    parked = ctx.bench.rd.stats()["delayed"]
    ctx.say(f"  {parked:,} parked calls written in {time.perf_counter() - started:.1f} s")

    client = create_app(ctx.bench.rd).test_client()
    keys = ctx.bench.rd.keys

    def raw_page() -> None:
        members: Any = ctx.client.zrange(keys.delayed, 0, 49, withscores=True)
        ctx.client.hmget(keys.meta, [member for member, _ in members])

    baseline = median_ms(raw_page)
    ctx.say(f"  baseline (raw ZRANGE + HMGET of 50): {baseline:.2f} ms")
    deep = parked * 9 // 10
    rows: list[dict[str, Any]] = []
    pages: dict[str, float] = {}
    for label, url in (*PAGES, WORST):
        held = (label, url) != WORST
        label, url = label.format(deep=deep), url.format(deep=deep)

        def get(url: str = url) -> None:
            response = client.get(url)
            if response.status_code != 200:
                raise RuntimeError(f"GET {url} answered {response.status_code}")

        took = median_ms(get, ROUNDS if held else 3)
        ctx.say(f"  {label}: {took:.1f} ms")
        pages[url] = took
        rows.append(
            Row(
                f"dashboard {label} ({parked:,} parked)",
                took,
                "ms",
                baseline,
                "raw ZRANGE+HMGET of the page",
                ratio(took, baseline),
                f"< {TARGET_MS:.0f} ms" if held else "(reported)",
                took < TARGET_MS if held else None,
            ).as_dict()
        )
    ctx.clear()
    return {"rows": rows, "details": {"parked": parked, "baseline_ms": baseline, "pages_ms": pages}}
