"""``tests.rabbit_proj``'s app without the extension, to compare with: the same broker, queue and ``record`` task.

Configured from the same environment (see :mod:`tests.rabbit_proj`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery
from kombu import Exchange, Queue

URL = os.environ.get("REDISDELAY_TEST_URL", "redis://127.0.0.1:6379")
QUEUE = os.environ.get("REDISDELAY_TEST_QUEUE", "rabbit")

app = Celery("rabbit_plain_proj", broker=os.environ.get("REDISDELAY_TEST_AMQP"))
app.conf.update(
    task_default_queue=QUEUE,
    task_queues=[Queue(QUEUE, Exchange(QUEUE), routing_key=QUEUE, durable=True)],
    worker_prefetch_multiplier=4,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
marks = redis.Redis.from_url(f"{URL}/2")


@app.task(bind=True, name="tests.rabbit_proj.record", shared=False)
def record(self: Any, key: str, value: Any = None) -> Any:
    marks.rpush(key, json.dumps({"id": self.request.id, "value": value, "pid": os.getpid()}))
    return value
