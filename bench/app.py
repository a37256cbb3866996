"""The Celery app the benchmarks run, in the bench process and in the worker, beat and releaser it starts.

Configured from the environment, which ``python -m bench`` sets for every process it starts:

``REDISDELAY_BENCH_URL``
    ``redis://host:port`` without a database; the broker and the call store use database 0.
``REDISDELAY_BENCH_TICK``
    ``redisdelay_tick_interval`` in seconds (default 1.0).
``REDISDELAY_BENCH_PRECISE``
    ``1`` sets ``redisdelay_precise_release=True`` (for the precise releaser, when the package has one); ``off``
    sets it False (the app's workers release nothing); otherwise the package's default (every worker releases).
``REDISDELAY_BENCH_PARK_RECEIVED``
    ``1`` sets ``redisdelay_park_received=True`` (a worker parks the eta messages it receives).
``REDISDELAY_BENCH_RESULTS``
    ``1`` gives the app a Redis result backend (database 1) and keeps its tasks' results.
``REDISDELAY_BENCH_PREFETCH``
    ``worker_prefetch_multiplier`` (default 1).
``REDISDELAY_BENCH_LEASE``
    ``redisdelay_lease`` in seconds, renewed every third of it (default: the package's, 30 and 10).
``REDISDELAY_BENCH_ALL_TASKS``
    ``1`` sets ``redisdelay_all_tasks=True`` (every task's delayed calls are parked).
``REDISDELAY_BENCH_TRACK``
    ``1`` sets ``redisdelay_track_due_now=True`` (with all tasks: their calls due now are tracked too); otherwise a
    bench app with all tasks sets it False, whatever the package's default.
``REDISDELAY_BENCH_WORKER_LOST``
    ``redisdelay_worker_lost`` (``dead_letter`` or ``run_again``); unset, the package's default for each task.

The bench process builds further apps with :func:`build` (for example one with precise release on to
park calls for the precise releaser); tasks are named explicitly, so every app and worker agree.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery
from kombu import Exchange, Queue

from celery_redisdelay import RedisDelay

from .common import (
    DEFAULT_QUEUE,
    ENV_ALL_TASKS,
    ENV_KOMBU_UNACKED,
    ENV_LEASE,
    ENV_PARK_RECEIVED,
    ENV_PRECISE,
    ENV_PREFETCH,
    ENV_RESULTS,
    ENV_TICK,
    ENV_TRACK,
    ENV_URL,
    ENV_WORKER_LOST,
    KEY_PREFIX,
    PRECISE_OFF,
    PRECISE_ON,
    QUEUES,
    incr_io,
)
from .marks import record_mark


@dataclass
class BenchApp:
    """A Celery app with celery-redisdelay and the benchmark's tasks."""

    url: str
    app: Celery
    rd: RedisDelay
    delayed_noop: Any  # @rd.delayed: parks
    plain_noop: Any  # @app.task: Celery's own countdown, the baseline
    stamp: Any  # @rd.delayed: records when it starts, by the Redis clock
    plain_stamp: Any  # @app.task: the same, for Celery's own calls
    sleeper: Any  # @rd.delayed: records its start (with its worker), then sleeps
    plain_sleeper: Any  # @app.task(acks_late=True): the same, for Celery's own calls
    plain_incr: Any  # @app.task: one INCR on the bench's Redis, through a client made once per process


def build(
    url: str,
    *,
    tick_interval: float = 1.0,
    precise: bool = False,
    releasing: bool = True,
    set_as_current: bool = False,
    store_url: str | None = None,
    shards: int = 1,
    results: bool = False,
    park_received: bool = False,
    prefetch: int = 1,
    lease: float | None = None,
    all_tasks: bool = False,
    kombu_unacked: bool = False,
    track: bool = False,
    worker_lost: str | None = None,
) -> BenchApp:
    """A benchmark app on the Redis at ``url`` (no database in the URL).

    ``store_url`` puts the call store elsewhere (a ``redis+cluster://`` URL, say; the broker stays at
    ``url``), ``shards`` sets ``redisdelay_shards``, ``results`` gives the app a Redis result backend
    (database 1) and keeps the results of its tasks. ``precise`` sets ``redisdelay_precise_release=True``,
    ``releasing=False`` sets it False; neither leaves the package's default.
    """
    backend = f"{url}/1" if results else None
    app: Any = Celery("bench", broker=f"{url}/0", backend=backend, set_as_current=set_as_current)
    conf: dict[str, Any] = {
        "redisdelay_url": store_url or f"{url}/0",
        "redisdelay_shards": shards,
        "redisdelay_key_prefix": KEY_PREFIX,
        "redisdelay_tick_interval": tick_interval,
        "task_default_queue": DEFAULT_QUEUE,
        "task_queues": [Queue(name, Exchange(name), routing_key=name) for name in QUEUES],
        "task_ignore_result": not results,
        "worker_prefetch_multiplier": prefetch,
        "worker_hijack_root_logger": False,
        "broker_connection_retry_on_startup": True,
    }
    if precise:
        conf["redisdelay_precise_release"] = True
    elif not releasing:
        conf["redisdelay_precise_release"] = False
    if park_received:
        conf["redisdelay_park_received"] = True
    if all_tasks:  # tracked or not as asked, not by the default (which tracks where it can)
        conf.update(redisdelay_all_tasks=True, redisdelay_track_due_now=track)
    if kombu_unacked:
        conf["redisdelay_skip_unacked"] = False
    if lease is not None:
        conf.update(redisdelay_lease=lease, redisdelay_lease_renewal=lease / 3)
    if worker_lost:
        conf["redisdelay_worker_lost"] = worker_lost
    app.conf.update(conf)
    rd = RedisDelay(app)
    marks = redis.Redis.from_url(f"{url}/0")

    @rd.delayed(name="bench.delayed_noop")
    def delayed_noop(i: int = 0) -> int:
        return i

    def plain(i: int = 0) -> int:
        return i

    plain_noop = app.task(name="bench.plain_noop", shared=False)(plain)

    def incr(i: int = 0) -> int:
        return incr_io(f"{url}/0", i)

    plain_incr = app.task(name="bench.plain_incr", shared=False)(incr)

    def record_start(self: Any, key: str, i: int = 0) -> None:
        """Mark its start (:mod:`bench.marks`) as the first thing the call does."""
        record_mark(marks, key, self.request.id)

    stamp = rd.delayed(name="bench.stamp", bind=True)(record_start)
    plain_stamp = app.task(name="bench.plain_stamp", bind=True, shared=False)(record_start)

    def sleep(self: Any, key: str, seconds: float) -> None:
        """Mark its start with its worker (:mod:`bench.marks`), then sleep ``seconds`` unless ``<key>:awake`` is set."""
        record_mark(marks, key, self.request.id, self.request.hostname)
        ends = time.monotonic() + seconds
        while time.monotonic() < ends and not marks.exists(f"{key}:awake"):
            time.sleep(0.1)

    # The limits figure: a rate for the whole fleet, Celery's per-worker rate_limit, and a rate per key.
    rd.delayed(name="bench.rated_stamp", bind=True, limit_rate="20/s")(record_start)
    app.task(name="bench.plain_rated_stamp", bind=True, shared=False, rate_limit="20/s")(record_start)
    rd.delayed(name="bench.keyed_stamp", bind=True, limit_rate="1/s", limit_key="key:{i}")(record_start)

    sleeper = rd.delayed(name="bench.sleeper", bind=True)(sleep)
    plain_sleeper = app.task(name="bench.plain_sleeper", bind=True, shared=False, acks_late=True)(sleep)
    return BenchApp(url, app, rd, delayed_noop, plain_noop, stamp, plain_stamp, sleeper, plain_sleeper, plain_incr)


def from_environment() -> BenchApp:
    return build(
        os.environ.get(ENV_URL, "redis://127.0.0.1:6379"),
        tick_interval=float(os.environ.get(ENV_TICK, "1.0")),
        precise=os.environ.get(ENV_PRECISE) == PRECISE_ON,
        releasing=os.environ.get(ENV_PRECISE) != PRECISE_OFF,
        park_received=os.environ.get(ENV_PARK_RECEIVED) == "1",
        results=os.environ.get(ENV_RESULTS) == "1",
        prefetch=int(os.environ.get(ENV_PREFETCH, "1")),
        lease=float(os.environ[ENV_LEASE]) if os.environ.get(ENV_LEASE) else None,
        all_tasks=os.environ.get(ENV_ALL_TASKS) == "1",
        kombu_unacked=os.environ.get(ENV_KOMBU_UNACKED) == "1",
        track=os.environ.get(ENV_TRACK) == "1",
        worker_lost=os.environ.get(ENV_WORKER_LOST) or None,
        set_as_current=True,
    )


bench = from_environment()
app = bench.app
rd = bench.rd
