"""The store's load when every worker releases (issue 51): idle workers, each with its precise releaser thread (the
package's default, ``redisdelay_precise_release`` None), against the same workers with it off.

A fresh redis-server of its own (nothing else on it), and 10 [2] idle workers of the bench's app (``--pool threads
--concurrency 1``, no beat) for 60 [5] s after they settle, first with ``redisdelay_precise_release=False`` (the
baseline: workers that release nothing), then with the default. Over each window, from the server's INFO: commands
per second (``total_commands_processed``; Redis 7 counts there, and in the command statistics, each command a script
runs as well: the ``TYPE`` checks of the store's scripts among them), Redis CPU seconds per second (``used_cpu_sys +
used_cpu_user``, shown in ms/s), and the command statistics of EVALSHA (calls/s and the time spent in it) and BZPOPMIN;
the difference per worker. Every command's statistics are in the details.

Then exactness under that load: 2,000 [200] calls of ``bench.stamp`` parked with due times spread evenly over the next
10 [3] s (an absolute eta each, so each call's due time is known exactly), run by the 10 releasing workers. Each must
run once and none before its due time: the starts each call recorded (Redis clock) give the calls that ran once, the
duplicates (runs past the first), the missing ones, the early ones, and the lateness (start - due) p50, p99 and max.
"""

from __future__ import annotations

import math
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import redis

from celery_redisdelay.testing import RedisServer, wait_for

from ..app import build
from ..common import DEFAULT_QUEUE, server_ms
from ..context import Context
from ..marks import read_marks
from ..processes import Processes
from ..report import Row, ratio
from ..server_load import exactness, snapshot, window

WORKERS, QUICK_WORKERS = 10, 2
WINDOW, QUICK_WINDOW = 60.0, 5.0  # seconds measured per side
SETTLE = 5.0  # seconds from the last worker ready to the window (their start-up commands stay out of it)
CALLS, QUICK_CALLS = 2000, 200  # calls of the exactness check
SPREAD, QUICK_SPREAD = 10.0, 3.0  # seconds their due times are spread over
LEAD = 2.0  # seconds from the first call parked to the first due time
GRACE = 3.0  # seconds waited after the last start, for a duplicate to show
COMMANDS = ("evalsha", "bzpopmin")


def start_workers(processes: Processes, count: int, *, releasing: bool) -> list[Any]:
    """``count`` idle workers of the bench's app (threads pool, concurrency 1), started side by side."""
    side = "releasing" if releasing else "quiet"
    workers = [
        processes.worker(f"bench-rel-{side}-{i}", queues=DEFAULT_QUEUE, pool="threads", releasing=releasing, wait=False)
        for i in range(count)
    ]
    for worker in workers:
        processes.wait_ready(worker)
    processes.say(f"  {count} workers ready ({'each releasing' if releasing else 'redisdelay_precise_release=False'})")
    return workers


def measure_window(ctx: Context, client: redis.Redis, seconds: float, label: str) -> dict[str, Any]:
    time.sleep(SETTLE)
    before = snapshot(client)
    time.sleep(seconds)
    load = window(before, snapshot(client))
    by_command = load["by_command"]
    ctx.say(
        f"  {label}: {load['commands_per_s']:,.1f} commands/s, Redis CPU {load['cpu_ms_per_s']:.2f} ms/s; "
        + ", ".join(f"{name} {by_command.get(name, {}).get('calls_per_s', 0.0):.1f}/s" for name in COMMANDS)
    )
    return load


def park_spread(client: redis.Redis, url: str, count: int, spread: float) -> tuple[str, dict[str, int]]:
    """Park ``count`` calls of ``bench.stamp`` due evenly over ``spread`` s from ``LEAD`` s on: (marks key, due ms
    of each call id). Each call gets an absolute eta; its due time is the eta in ms, as the producer scores it."""
    parker = build(url)
    marks = f"bench:releasing:{uuid.uuid4().hex}"
    due_ms: dict[str, int] = {}
    try:
        start = server_ms(client) + LEAD * 1000
        with parker.app.producer_or_acquire() as producer:
            for i in range(count):
                eta = datetime.fromtimestamp((start + spread * 1000 * i / count) / 1000, tz=UTC)
                call_id = parker.stamp.apply_async((marks, i), eta=eta, producer=producer).id
                due_ms[call_id] = math.floor(eta.timestamp() * 1000)
    finally:
        parker.app.close()
    return marks, due_ms


def workers_releasing(ctx: Context) -> dict[str, Any]:
    """Commands/s and Redis CPU of idle workers releasing vs not releasing, then exactness under that load."""
    count = QUICK_WORKERS if ctx.quick else WORKERS
    seconds = QUICK_WINDOW if ctx.quick else WINDOW
    calls, spread = (QUICK_CALLS, QUICK_SPREAD) if ctx.quick else (CALLS, SPREAD)
    server = RedisServer().start()
    processes = Processes(server.url, ctx.say)
    client = redis.Redis.from_url(f"{server.url}/0")
    details: dict[str, Any] = {"workers": count, "pool": "threads", "concurrency": 1, "window_s": seconds}
    try:
        ctx.say(f"  redis-server {server.version()} of its own on {server.url}")
        workers = start_workers(processes, count, releasing=False)
        quiet = measure_window(ctx, client, seconds, f"{count} workers, redisdelay_precise_release=False")
        for worker in workers:
            processes.stop(worker)
        start_workers(processes, count, releasing=True)
        busy = measure_window(ctx, client, seconds, f"{count} workers releasing")
        before = snapshot(client)
        parking = time.perf_counter()
        marks, due_ms = park_spread(client, server.url, calls, spread)
        details["park_seconds"] = time.perf_counter() - parking  # past LEAD, the last calls were parked already due
        wait_for(lambda: client.llen(marks) >= calls, LEAD + spread + 120, f"{calls} calls to start", 0.1)
        time.sleep(GRACE)
        during = window(before, snapshot(client))
        check = exactness(due_ms, read_marks(client, marks))
        ctx.say(
            f"  exactness, {calls:,} calls over {spread:.0f} s: ran once {check['ran_once']:,}, duplicates "
            f"{check['duplicates']}, missing {check['missing']}, early {check['early']}; lateness p50 "
            f"{check['p50_ms']:.1f} ms, p99 {check['p99_ms']:.1f} ms, max {check['max_ms']:.0f} ms"
        )
    finally:
        processes.stop_all()
        client.close()
        server.stop()
    details.update(not_releasing=quiet, releasing=busy, exactness=check, exactness_load=during, spread_s=spread)
    rows = load_rows(count, quiet, busy) + exactness_rows(check)
    return {"rows": [row.as_dict() for row in rows], "details": details}


def load_rows(count: int, quiet: dict[str, Any], busy: dict[str, Any]) -> list[Row]:
    """Both sides' commands/s, Redis CPU and EVALSHA/BZPOPMIN calls/s, and the difference per releasing worker."""
    baseline = f"{count} workers not releasing"
    rows = [
        Row(
            f"workers_releasing: commands/s, {count} idle workers",
            busy["commands_per_s"],
            "cmd/s",
            quiet["commands_per_s"],
            baseline,
            ratio(busy["commands_per_s"], quiet["commands_per_s"]),
        ),
        Row(
            f"workers_releasing: Redis CPU, {count} idle workers",
            busy["cpu_ms_per_s"],
            "ms/s",
            quiet["cpu_ms_per_s"],
            baseline,
            ratio(busy["cpu_ms_per_s"], quiet["cpu_ms_per_s"]),
        ),
    ]
    for name in COMMANDS:
        ours = busy["by_command"].get(name, {}).get("calls_per_s", 0.0)
        base = quiet["by_command"].get(name, {}).get("calls_per_s", 0.0)
        rows.append(Row(f"workers_releasing: {name.upper()} calls/s", ours, "cmd/s", base, baseline, ratio(ours, base)))
    ours = busy["by_command"].get("evalsha", {}).get("usec_per_s", 0.0)
    base = quiet["by_command"].get("evalsha", {}).get("usec_per_s", 0.0)
    rows.append(Row("workers_releasing: time in EVALSHA", ours, "µs/s", base, baseline, ratio(ours, base)))
    rows.append(
        Row(
            "workers_releasing: commands/s per releasing worker",
            (busy["commands_per_s"] - quiet["commands_per_s"]) / count,
            "cmd/s",
        )
    )
    rows.append(
        Row(
            "workers_releasing: Redis CPU per releasing worker",
            (busy["cpu_ms_per_s"] - quiet["cpu_ms_per_s"]) / count,
            "ms/s",
        )
    )
    return rows


def exactness_rows(check: dict[str, Any]) -> list[Row]:
    calls = check["calls"]
    rows = [
        Row("workers_releasing exactness: ran once", check["ran_once"], "calls", target=f"= {calls:,}"),
        Row("workers_releasing exactness: duplicate runs", check["duplicates"], "calls", target="0"),
        Row("workers_releasing exactness: early runs", check["early"], "calls", target="0"),
        Row("workers_releasing exactness: missing", check["missing"], "calls", target="0"),
    ]
    for row, wanted in zip(rows, (calls, 0, 0, 0), strict=True):
        row.met = row.ours == wanted
    for name in ("p50", "p99", "max"):
        value = check[f"{name}_ms"]
        if value is not None:  # None: no call ran (the figure has failed waiting for them before)
            rows.append(Row(f"workers_releasing exactness: lateness {name}", value, "ms"))
    return rows
