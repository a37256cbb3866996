"""The bench's app on RabbitMQ, with the store on the bench's Redis (``celery -A bench.rabbit_app worker``): a delayed
task and a plain one, for ``release_rabbitmq``'s worker memory. Configured from ``$REDISDELAY_BENCH_URL`` (the store)
and ``$REDISDELAY_BENCH_AMQP`` (the broker)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from celery_redisdelay import RedisDelay

from .common import ENV_URL

ENV_AMQP = "REDISDELAY_BENCH_AMQP"
OURS_QUEUE, PLAIN_QUEUE = "bench-rabbit-ours", "bench-rabbit-plain"

url = os.environ.get(ENV_URL, "redis://127.0.0.1:6379")
app: Any = Celery("bench-rabbit", broker=os.environ.get(ENV_AMQP), set_as_current=False)
app.conf.update(
    redisdelay_url=f"{url}/0",
    redisdelay_key_prefix="bench-rabbit",
    task_queues=[Queue(name, Exchange(name), routing_key=name) for name in (OURS_QUEUE, PLAIN_QUEUE)],
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
rd = RedisDelay(app)


@rd.delayed(name="bench.rabbit_delayed_noop", queue=OURS_QUEUE)
def delayed_noop(i: int = 0) -> int:
    return i


def _noop(i: int = 0) -> int:
    return i


#: Celery's own countdown, the baseline (Celery's decorator is untyped).
plain_noop: Any = app.task(name="bench.rabbit_plain_noop", queue=PLAIN_QUEUE)(_noop)
