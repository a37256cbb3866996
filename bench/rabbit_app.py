"""The bench's app on RabbitMQ, with the store on the bench's Redis (``celery -A bench.rabbit_app worker``): delayed
tasks and plain ones, for the RabbitMQ figures' workers (``bench/figures/rabbitmq.py``). Configured from
``$REDISDELAY_BENCH_URL`` (the store, and the list the stamp tasks record their starts in) and
``$REDISDELAY_BENCH_AMQP`` (the broker); ``$REDISDELAY_BENCH_PRECISE=1`` sets ``redisdelay_precise_release=True`` (the
worker's releaser releases each call as it falls due, not at a tick's pace). With ``$REDISDELAY_BENCH_RABBIT_PLAIN=1``
the app is plain Celery: the extension is not installed (no releaser, no hooks in its worker) and only the plain tasks
exist, for a baseline worker."""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery
from kombu import Exchange, Queue

from celery_redisdelay import RedisDelay

from .common import ENV_PRECISE, ENV_URL, PRECISE_ON
from .marks import record_mark

ENV_AMQP = "REDISDELAY_BENCH_AMQP"
ENV_RABBIT_PLAIN = "REDISDELAY_BENCH_RABBIT_PLAIN"
OURS_QUEUE, PLAIN_QUEUE = "bench-rabbit-ours", "bench-rabbit-plain"
#: Plain Celery: the app without the extension.
WITHOUT_EXTENSION = os.environ.get(ENV_RABBIT_PLAIN) == "1"

url = os.environ.get(ENV_URL, "redis://127.0.0.1:6379")
app: Any = Celery("bench-rabbit", broker=os.environ.get(ENV_AMQP), set_as_current=False)
app.conf.update(
    task_queues=[Queue(name, Exchange(name), routing_key=name) for name in (OURS_QUEUE, PLAIN_QUEUE)],
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)  # worker_prefetch_multiplier: Celery's default (4)
if not WITHOUT_EXTENSION:
    app.conf.update(redisdelay_url=f"{url}/0", redisdelay_key_prefix="bench-rabbit")
    if os.environ.get(ENV_PRECISE) == PRECISE_ON:
        app.conf.redisdelay_precise_release = True
marks = redis.Redis.from_url(f"{url}/0")


def _noop(i: int = 0) -> int:
    return i


def record_start(self: Any, key: str, i: int = 0) -> None:
    """Mark its start (:mod:`bench.marks`) as the first thing the call does (a no-op besides)."""
    record_mark(marks, key, self.request.id)


#: Celery's own countdown, the baseline (Celery's decorator is untyped).
plain_noop: Any = app.task(name="bench.rabbit_plain_noop", queue=PLAIN_QUEUE)(_noop)
plain_stamp: Any = app.task(name="bench.rabbit_plain_stamp", bind=True, queue=PLAIN_QUEUE)(record_start)

if not WITHOUT_EXTENSION:
    rd = RedisDelay(app)

    @rd.delayed(name="bench.rabbit_delayed_noop", queue=OURS_QUEUE)
    def delayed_noop(i: int = 0) -> int:
        return i

    delayed_stamp = rd.delayed(name="bench.rabbit_delayed_stamp", bind=True, queue=OURS_QUEUE)(record_start)
