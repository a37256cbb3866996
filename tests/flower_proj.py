"""The Celery app the Flower test runs in a real worker that sends events (``-E``), with Flower watching it.

Configured from ``REDISDELAY_TEST_URL`` (a redis:// URL without database), set by the test.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_redisdelay import RedisDelay

URL = os.environ.get("REDISDELAY_TEST_URL", "redis://127.0.0.1:6379")

app = Celery("flower_proj", broker=f"{URL}/6", backend=f"{URL}/7")
app.conf.update(
    redisdelay_url=f"{URL}/6",
    redisdelay_key_prefix="flower",
    redisdelay_all_tasks=True,
    redisdelay_tick_interval=0.2,
    task_default_queue="flower",
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)
rd = RedisDelay(app)


@app.task
def echo(value: int) -> int:
    return value
