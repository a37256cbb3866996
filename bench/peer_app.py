"""celery-redis-plus, a peer measured beside us (the ``burst`` and ``e2e_due_now`` figures): a plain Celery app on
its kombu transport.

celery-redis-plus is not a dependency: install it into the bench's virtualenv to measure it
(``pip install --no-deps --ignore-requires-python celery-redis-plus``; it declares Python 3.13 and runs on
3.11). Its transport needs Redis 7 (BZMPOP). The app uses database 2 of the bench's Redis, so its keys stay
apart from kombu's own transport in database 0; the calls record their starts in database 0, as ours do.
Configured from ``REDISDELAY_BENCH_URL`` like :mod:`bench.app`.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import redis
from celery import Celery

from .common import ENV_PREFETCH, ENV_URL, incr_io
from .marks import record_mark

PEER_QUEUE = "bench-burst-peer"
PEER_DB = 2

importlib.import_module("celery_redis_plus")  # registers the valkey:// transport

url = os.environ.get(ENV_URL, "redis://127.0.0.1:6379")
app: Any = Celery("bench-peer", broker=f"valkey{url.removeprefix('redis')}/{PEER_DB}", set_as_current=True)
app.conf.update(
    task_default_queue=PEER_QUEUE,
    task_ignore_result=True,
    worker_prefetch_multiplier=int(os.environ.get(ENV_PREFETCH, "1")),
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
marks = redis.Redis.from_url(f"{url}/0")


def record_start(self: Any, key: str, i: int = 0) -> None:
    """Mark its start (:mod:`bench.marks`) as the first thing the call does (as ``bench.stamp``)."""
    record_mark(marks, key, self.request.id)


def noop(i: int = 0) -> int:
    return i


stamp = app.task(name="bench.peer_stamp", bind=True, shared=False)(record_start)


def incr(i: int = 0) -> int:
    """One INCR on the bench's Redis (database 0, as ours), as ``bench.plain_incr`` of :mod:`bench.app`."""
    return incr_io(f"{url}/0", i)


noop_task = app.task(name="bench.peer_noop", shared=False)(noop)
incr_task = app.task(name="bench.peer_incr", shared=False)(incr)
