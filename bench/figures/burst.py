"""The burst: N calls due at one instant, drained by one worker (``--pool prefork --concurrency 2``).

Three sides, each on a fresh worker: ours (delayed calls parked with one eta, released by the precise releaser
in the worker), Celery's own eta path (plain calls with the same eta: the worker prefetches them all and holds
them in memory until then), and celery-redis-plus when it is installed (plain calls on its transport, which
keeps an eta more than 60 s away in Redis and moves due messages every 60 s, up to 60 s early; the calls are
given a due time 75 s ahead so that they take its native path).

Per side, by the Redis clock: lateness (from the due time to each call's start) p50, p99 and max; the drain
rate (N over the time from the due time to the last start); the growth of the worker's main process RSS (its
largest sample, every 0.25 s from before the calls were sent to the last start, over its idle RSS); and the
Redis memory per call while the calls wait (``used_memory`` after sending over before, per call).

Targets (issue 30): our p99 at most 1.2x Celery's own, and our worker RSS growth at most 5 MB.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from celery_redisdelay.testing import CeleryProcess, wait_for

from ..common import BURST_PLAIN_QUEUE as PLAIN_QUEUE
from ..common import BURST_QUEUE as OURS_QUEUE
from ..common import ENV_URL, server_ms
from ..context import Context
from ..marks import read_marks
from ..processes import rss_mb
from ..report import SKIPPED, Row, percentile, ratio
from .worker_memory import settled_rss

#: Seconds from the first call sent to the due time: time to send them all and for Celery's worker to prefetch.
LEAD = 20.0  # at prefetch 4 Celery's side took 14 s to send 5,000 on a busy machine
QUICK_LEAD = 3.0
#: celery-redis-plus stores only an eta more than 60 s away; 75 s takes its native path.
PEER_LEAD = 75.0
P99_TARGET = 1.2
RSS_TARGET_MB = 5.0


class Sampler:
    """The largest RSS of a process, sampled every 0.25 s by a thread until :meth:`stop`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.largest = rss_mb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.largest = max(self.largest, rss_mb(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(5)
        return self.largest


def peer_available(ctx: Context) -> str | None:
    """Why celery-redis-plus cannot be measured here, or None when it can."""
    if importlib.util.find_spec("celery_redis_plus") is None:
        return "celery-redis-plus not installed (pip install --no-deps --ignore-requires-python celery-redis-plus)"
    version = str(ctx.client.info("server")["redis_version"])
    if int(version.split(".")[0]) < 7:
        return f"celery-redis-plus needs Redis 7 (BZMPOP); this server is {version}"
    return None


def one_side(ctx: Context, worker: CeleryProcess, send: Any, n: int, lead: float, label: str) -> dict[str, Any]:
    """Send ``n`` calls due ``lead`` s from now through ``send(key, i, eta)``, then time their starts."""
    client = ctx.client
    idle = settled_rss(worker, minimum=2.0, deadline=30)
    before = ctx.used_memory()
    sampler = Sampler(worker.pid)
    key = f"bench:burst:{uuid.uuid4().hex}"
    due_ms = server_ms(client) + round(lead * 1000)
    eta = datetime.fromtimestamp(due_ms / 1000, tz=UTC)
    started = time.perf_counter()
    for i in range(n):
        send(key, i, eta)
    sent = time.perf_counter() - started
    if server_ms(client) >= due_ms:
        raise RuntimeError(f"{label}: sending {n} calls took {sent:.1f} s, past their due time; raise LEAD")
    waiting = (ctx.used_memory() - before) / n
    wait_for(lambda: client.llen(key) >= n, lead + 600, f"{n} calls of the burst to start ({label})", 0.1)
    largest = sampler.stop()
    marks = read_marks(client, key)
    client.unlink(key)
    late = [float(mark.ms - due_ms) for mark in marks]
    last = max(late)
    result = {
        "calls": n,
        "p50_ms": percentile(late, 50),
        "p99_ms": percentile(late, 99),
        "max_ms": last,
        "drain_per_s": n / max(last / 1000, 0.001),
        "rss_growth_mb": largest - idle,
        "redis_bytes_per_call": waiting,
        "sent_seconds": sent,
    }
    ctx.say(
        f"  {label}: p50 {result['p50_ms']:,.0f} ms, p99 {result['p99_ms']:,.0f} ms, max {last:,.0f} ms, "
        f"{result['drain_per_s']:,.0f} calls/s, worker RSS {result['rss_growth_mb']:+.1f} MB, "
        f"Redis {waiting:,.0f} B/call"
    )
    return result


#: Celery's default prefetch multiplier first (what users run), then 1 (the setting that flatters us least).
PREFETCHES = (4, 1)


def burst(ctx: Context) -> dict[str, Any]:
    """N calls due at one instant: lateness, drain rate, worker RSS and Redis bytes, ours vs Celery (vs a peer), at
    Celery's default prefetch (4) and at 1."""
    n = ctx.sizes.burst
    lead = QUICK_LEAD if ctx.quick else LEAD
    table: list[Row] = []
    details: dict[str, Any] = {"calls": n}
    for prefetch in PREFETCHES[:1] if ctx.quick else PREFETCHES:  # --quick: Celery's default prefetch alone
        sides = ours_and_celerys(ctx, n, lead, prefetch)
        if prefetch == PREFETCHES[-1]:  # the peer once, at 1, the prefetch its own app used
            sides["celery-redis-plus"] = peers(ctx, n)
        table += rows(n, sides, prefetch)
        details[f"prefetch {prefetch}"] = sides
    return {"rows": [row.as_dict() for row in table], "details": details}


def ours_and_celerys(ctx: Context, n: int, lead: float, prefetch: int) -> dict[str, Any]:
    """Our side and Celery's eta path, each on a fresh ``-P prefork -c 2`` worker with this prefetch multiplier."""
    bench, processes = ctx.bench, ctx.processes
    ctx.clear(OURS_QUEUE, PLAIN_QUEUE)
    sides: dict[str, Any] = {}
    worker = processes.worker(
        f"bench-burst-{prefetch}", queues=OURS_QUEUE, concurrency=2, precise=True, prefetch=prefetch
    )
    try:
        sides["ours"] = one_side(
            ctx,
            worker,
            lambda key, i, eta: bench.stamp.apply_async((key, i), eta=eta, queue=OURS_QUEUE),
            n,
            lead,
            f"ours, prefetch {prefetch}",
        )
    finally:
        processes.stop(worker)
    worker = processes.worker(f"bench-burst-plain-{prefetch}", queues=PLAIN_QUEUE, concurrency=2, prefetch=prefetch)
    try:
        with bench.app.producer_or_acquire() as producer:
            sides["celery"] = one_side(
                ctx,
                worker,
                lambda key, i, eta: bench.plain_stamp.apply_async(
                    (key, i), eta=eta, queue=PLAIN_QUEUE, producer=producer
                ),
                n,
                lead,
                f"Celery's eta, prefetch {prefetch}",
            )
    finally:
        processes.stop(worker)
    ctx.clear(OURS_QUEUE, PLAIN_QUEUE)
    return sides


def peers(ctx: Context, n: int) -> dict[str, Any] | str:
    """celery-redis-plus's side (prefetch 1), or why it cannot be measured here."""
    why_not = peer_available(ctx) if not ctx.quick else "not measured with --quick (its calls wait 75 s)"
    if why_not is not None:
        ctx.say(f"  celery-redis-plus: {why_not}")
        return why_not
    os.environ[ENV_URL] = ctx.url  # the peer's app reads its Redis from the bench's environment
    from .. import peer_app

    processes = ctx.processes
    worker = processes.worker("bench-burst-peer", queues=peer_app.PEER_QUEUE, concurrency=2, app="bench.peer_app")
    try:
        return one_side(
            ctx,
            worker,
            lambda key, i, eta: peer_app.stamp.apply_async((key, i), eta=eta),
            n,
            PEER_LEAD,
            "celery-redis-plus",
        )
    finally:
        processes.stop(worker)
        peer_app.app.close()


def rows(n: int, sides: dict[str, Any], prefetch: int) -> list[Row]:
    ours, celery, peer = sides["ours"], sides["celery"], sides.get("celery-redis-plus")
    found = ratio(ours["p99_ms"], celery["p99_ms"])
    table = [
        Row(
            f"burst of {n:,} (prefetch {prefetch}): p99 lateness",
            ours["p99_ms"],
            "ms",
            celery["p99_ms"],
            "Celery's own eta, same worker",
            found,
            f"<= {P99_TARGET}x",
            found is not None and found <= P99_TARGET,
        ),
        Row(
            f"burst of {n:,} (prefetch {prefetch}): p50 lateness",
            ours["p50_ms"],
            "ms",
            celery["p50_ms"],
            "Celery's own eta",
            None,
        ),
        Row(
            f"burst of {n:,} (prefetch {prefetch}): drain rate",
            ours["drain_per_s"],
            "calls/s",
            celery["drain_per_s"],
            "Celery's own eta",
            ratio(ours["drain_per_s"], celery["drain_per_s"]),
        ),
        Row(
            f"burst of {n:,} (prefetch {prefetch}): worker RSS growth",
            ours["rss_growth_mb"],
            "MB",
            celery["rss_growth_mb"],
            "Celery's own eta",
            None,
            f"<= {RSS_TARGET_MB:.0f} MB",
            ours["rss_growth_mb"] <= RSS_TARGET_MB,
        ),
        Row(
            f"burst of {n:,} (prefetch {prefetch}): Redis bytes per waiting call",
            ours["redis_bytes_per_call"],
            "B/call",
            celery["redis_bytes_per_call"],
            "Celery's own eta (kombu's unacked copy)",
            ratio(ours["redis_bytes_per_call"], celery["redis_bytes_per_call"]),
        ),
    ]
    for name, key, unit in (
        ("p99 lateness", "p99_ms", "ms"),
        ("drain rate", "drain_per_s", "calls/s"),
        ("worker RSS growth", "rss_growth_mb", "MB"),
        ("Redis bytes per waiting call", "redis_bytes_per_call", "B/call"),
    ):
        label = f"burst of {n:,} (prefetch {prefetch}): {name}, celery-redis-plus"
        if peer is None:
            continue
        if isinstance(peer, str):
            table.append(Row(label, SKIPPED, unit, target=f"skipped: {peer}"[:60]))
        else:
            table.append(Row(label, peer[key], unit, ours[key], "ours, same run", ratio(peer[key], ours[key])))
    return table
