"""The app of the drain test (tests/test_drain.py): with the extension, or, with ``REDISDELAY_TEST_PLAIN=1``, the
same app and tasks without it, as after the way out (``celery -A proj redisdelay drain``, then the package removed).

Configured from ``REDISDELAY_TEST_URL`` (a redis:// URL without database), ``REDISDELAY_TEST_BROKER`` (the broker's
URL, that server's database 0 by default) and ``REDISDELAY_TEST_PREFIX``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery

URL = os.environ.get("REDISDELAY_TEST_URL", "redis://127.0.0.1:6379")
PLAIN = os.environ.get("REDISDELAY_TEST_PLAIN") == "1"
QUEUE = "drain"

app = Celery("drain_proj", broker=os.environ.get("REDISDELAY_TEST_BROKER", f"{URL}/8"))
app.conf.update(
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=4,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"max_retries": 1, "interval_start": 0, "interval_step": 0.1},
    redisdelay_url=f"{URL}/9",
    redisdelay_key_prefix=os.environ.get("REDISDELAY_TEST_PREFIX", "drain"),
    redisdelay_all_tasks=True,
)
marks = redis.Redis.from_url(f"{URL}/10")


@app.task(bind=True, name="tests.drain_proj.record", shared=False)
def record(self: Any, key: str, value: int) -> int:
    """Note the run: its id, its value, when it ran (the Redis clock, ms) and the eta the worker saw."""
    seconds, micros = marks.time()
    eta = self.request.eta
    entry = {"id": self.request.id, "value": value, "ms": int(seconds) * 1000 + int(micros) // 1000, "eta": eta}
    marks.rpush(key, json.dumps(entry, default=str))
    return value


if not PLAIN:
    from celery_redisdelay import RedisDelay

    rd = RedisDelay(app)

    @rd.batched(name="tests.drain_proj.gather", size=100, max_wait=3600, shared=False)
    def gather(key: str, items: list[Any]) -> int:
        return len(items)
