"""The bench's plain tasks in an app without the extension: the baseline of the all-tasks row of ``e2e_throughput``
(``celery -A bench.plain_app worker``). Same broker, queues and task names as :mod:`bench.app`, which it does not
import (that module installs the extension). Configured from the same environment."""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery
from kombu import Exchange, Queue

from .common import DEFAULT_QUEUE, ENV_PREFETCH, ENV_URL, QUEUES, incr_io
from .marks import record_mark

url = os.environ.get(ENV_URL, "redis://127.0.0.1:6379")
app: Any = Celery("bench-plain", broker=f"{url}/0", set_as_current=True)
app.conf.update(
    task_default_queue=DEFAULT_QUEUE,
    task_queues=[Queue(name, Exchange(name), routing_key=name) for name in QUEUES],
    task_ignore_result=True,
    worker_prefetch_multiplier=int(os.environ.get(ENV_PREFETCH, "1")),
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
marks = redis.Redis.from_url(f"{url}/0")


def noop(i: int = 0) -> int:
    return i


def record_start(self: Any, key: str, i: int = 0) -> None:
    """Mark its start (:mod:`bench.marks`) as the first thing the call does (as ``bench.plain_stamp``)."""
    record_mark(marks, key, self.request.id)


def incr(i: int = 0) -> int:
    """One INCR on the bench's Redis, as ``bench.plain_incr`` of :mod:`bench.app`."""
    return incr_io(f"{url}/0", i)


plain_noop = app.task(name="bench.plain_noop", shared=False)(noop)
plain_incr = app.task(name="bench.plain_incr", shared=False)(incr)
plain_stamp = app.task(name="bench.plain_stamp", bind=True, shared=False)(record_start)
