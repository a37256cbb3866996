"""The Celery app the RabbitMQ tests run in real workers: RabbitMQ as the broker, Redis as the store.

Configured from the environment the test sets: ``REDISDELAY_TEST_URL`` (a redis:// URL without database),
``REDISDELAY_TEST_AMQP`` (the broker), ``REDISDELAY_TEST_QUEUE`` (the queue's name), ``REDISDELAY_TEST_QUEUE_TYPE``
(``classic`` or ``quorum``), ``REDISDELAY_TEST_ACKS_LATE`` (``1``: every task acknowledges late) and
``REDISDELAY_TEST_PREFIX`` (the store's key prefix).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import time
from typing import Any

import redis
from celery import Celery
from kombu import Exchange, Queue

from celery_redisdelay import RedisDelay
from celery_redisdelay.message.marks import request_delivery

URL = os.environ.get("REDISDELAY_TEST_URL", "redis://127.0.0.1:6379")
QUEUE = os.environ.get("REDISDELAY_TEST_QUEUE", "rabbit")
QUEUE_TYPE = os.environ.get("REDISDELAY_TEST_QUEUE_TYPE", "classic")

app = Celery("rabbit_proj", broker=os.environ.get("REDISDELAY_TEST_AMQP"), backend=f"{URL}/1")
app.conf.update(
    redisdelay_url=f"{URL}/0",
    redisdelay_key_prefix=os.environ.get("REDISDELAY_TEST_PREFIX", "rabbit"),
    redisdelay_all_tasks=True,
    redisdelay_tick_interval=0.2,
    redisdelay_lease=float(os.environ.get("REDISDELAY_TEST_LEASE", "30")),
    redisdelay_lease_renewal=float(os.environ.get("REDISDELAY_TEST_LEASE", "30")) / 3,
    task_acks_late=os.environ.get("REDISDELAY_TEST_ACKS_LATE") == "1",
    task_default_queue=QUEUE,
    task_queues=[
        Queue(
            QUEUE,
            Exchange(QUEUE),
            routing_key=QUEUE,
            durable=True,
            queue_arguments={"x-queue-type": QUEUE_TYPE}
            if QUEUE_TYPE == "quorum"
            else {"x-queue-type": "classic", "x-max-priority": 9},
        )
    ],
    worker_prefetch_multiplier=4,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)
if os.environ.get("REDISDELAY_TEST_CLAIM_TIMEOUT"):
    app.conf.redisdelay_claim_timeout = float(os.environ["REDISDELAY_TEST_CLAIM_TIMEOUT"])
if os.environ.get("REDISDELAY_TEST_QUEUE_TIMEOUT"):
    app.conf.redisdelay_queue_timeout = float(os.environ["REDISDELAY_TEST_QUEUE_TIMEOUT"])
rd = RedisDelay(app)
marks = redis.Redis.from_url(f"{URL}/2")

# A test that times out sends SIGUSR2 to the worker and its pool processes (RabbitSetup.dump_stacks): each writes the
# stack of every thread to its stderr, the worker's output, so that a run stuck somewhere says where.
faulthandler.register(signal.SIGUSR2, all_threads=True)

# The extension's own lines (a delivery dropped as stale, a call held back or given back) in the workers' output, beside
# Celery's: a test that fails prints it. Once a process (the tests import this module again for each setup).
_ours = logging.getLogger("celery_redisdelay")
if not any(getattr(handler, "rabbit_proj", False) for handler in _ours.handlers):
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s"))
    _handler.rabbit_proj = True  # type: ignore[attr-defined]
    _ours.addHandler(_handler)
    _ours.setLevel(logging.INFO)
    _ours.propagate = False


def server_ms() -> int:
    seconds, micros = marks.time()
    return int(seconds) * 1000 + int(micros) // 1000


def note(key: str, request: Any, value: Any) -> None:
    """What the run saw, as JSON on the list ``key``: when it ran (the Redis clock) and what its request said."""
    info = request.delivery_info or {}
    headers = request.headers or {}
    entry = {
        "id": request.id,
        "ms": server_ms(),
        "value": value,
        "eta": request.eta,
        "expires": request.expires,
        "priority": info.get("priority"),
        "custom": headers.get("x-custom") if isinstance(headers, dict) else None,
        "retries": request.retries,
        "pid": os.getpid(),
        "delivery": request_delivery(request),  # the store's number of the delivery that ran
        "redelivered": bool(info.get("redelivered")),  # the broker's own redelivery
        "worker": request.hostname,
    }
    marks.rpush(key, json.dumps(entry))


@app.task(bind=True, shared=False)
def record(self: Any, key: str, value: Any = None) -> Any:
    """A plain task (parked by ``redisdelay_all_tasks``): note the run."""
    note(key, self.request, value)
    return value


@rd.delayed(bind=True, shared=False)
def record_delayed(self: Any, key: str, value: Any = None) -> Any:
    """A ``@rd.delayed`` task: note the run."""
    note(key, self.request, value)
    return value


@rd.delayed(bind=True, shared=False, limit_concurrency=2)
def limited(self: Any, key: str, seconds: float) -> None:
    """Under a fleet-wide concurrency limit: note when the run started (the note's own time is its end)."""
    start = server_ms()
    time.sleep(seconds)
    note(key, self.request, start)


@rd.delayed(bind=True, shared=False, limit_rate="10/s")
def rated(self: Any, key: str, n: int) -> None:
    """Under a fleet-wide rate limit: note the run."""
    note(key, self.request, n)


@app.task(bind=True, shared=False)
def flaky(self: Any, key: str, failures: int) -> int:
    """Fail ``failures`` times, retrying with a countdown (the retry is parked)."""
    runs = int(marks.incr(key))
    if runs <= failures:
        raise self.retry(countdown=1)
    note(f"{key}:done", self.request, runs)
    return runs


@app.task(bind=True, shared=False)
def add(self: Any, x: int, y: int) -> int:
    return x + y


@app.task(bind=True, shared=False)
def total(self: Any, values: list[int], key: str) -> int:
    """A chord's body: note the sum."""
    note(key, self.request, sum(values))
    return sum(values)


@app.task(bind=True, shared=False)
def sleeper(self: Any, key: str, seconds: float) -> int:
    """Note each start, then sleep (a test kills the worker meanwhile)."""
    note(f"{key}:started", self.request, None)
    time.sleep(seconds)
    note(key, self.request, None)
    return 1
