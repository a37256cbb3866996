"""The example project's Celery app: delayed calls parked in the same Redis as the broker.

Run it yourself with a Redis on ``$REDISDELAY_DEMO_URL`` (default ``redis://127.0.0.1:6379/0``)::

    celery -A example_project.app worker --loglevel=INFO
    celery -A example_project.app beat --loglevel=INFO

or run everything at once, on an embedded Redis, with ``python3 dev.py demo``.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_redisdelay import RedisDelay

URL = os.environ.get("REDISDELAY_DEMO_URL", "redis://127.0.0.1:6379/0")

# ``include`` makes the worker import the tasks module, so every task is registered.
app = Celery("example_project", broker=URL, backend=URL, include=["example_project.tasks"])
app.conf.update(
    redisdelay_tick_interval=0.2,  # beat releases due calls and sweeps timed-out ones 5 times a second
    worker_prefetch_multiplier=1,  # a worker takes one message at a time, so released calls spread out
    broker_connection_retry_on_startup=True,
    result_expires=3600,
)
rd = RedisDelay(app)
