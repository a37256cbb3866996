"""The Celery app the end-to-end tests run in real worker and beat processes.

Configured from ``REDISDELAY_TEST_URL`` (a redis:// URL without database), set by the test session.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click
import redis
from celery import Celery, signals

from celery_redisdelay import RedisDelay

URL = os.environ.get("REDISDELAY_TEST_URL", "redis://127.0.0.1:6379")
TICK_INTERVAL = 0.2

app = Celery("proj", broker=f"{URL}/0", backend=f"{URL}/1")
app.conf.update(
    redisdelay_url=f"{URL}/0",
    redisdelay_key_prefix="e2e",
    redisdelay_tick_interval=TICK_INTERVAL,
    redisdelay_visibility_timeout=30,
    redisdelay_claim_timeout=5,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)
rd = RedisDelay(app)
_marks = redis.Redis.from_url(f"{URL}/2")
# A preload option of the app's own, as ``celery -A tests.proj --proj-tenant X <command>`` passes it.
app.user_options["preload"].add(click.Option(["--proj-tenant"], default=None, help="A tenant, for the tests."))


@signals.user_preload_options.connect
def _tenant(sender: Any = None, app: Any = None, options: Any = None, **_: Any) -> None:
    if options and options.get("proj_tenant"):
        print(f"tests.proj preload option: tenant {options['proj_tenant']}", file=sys.stderr)


def server_ms() -> int:
    seconds, micros = _marks.time()
    return int(seconds) * 1000 + int(micros) // 1000


@rd.delayed(bind=True)
def record(self: Any, key: str, value: Any = None) -> Any:
    """Note when (by the Redis clock) and with what arguments the call ran."""
    _marks.rpush(key, f"{self.request.id} {server_ms()} {value}")
    return value


@rd.delayed(bind=True, default_retry_delay=2)
def flaky(self: Any, key: str, failures: int) -> int:
    """Fail ``failures`` times, retrying with Celery's ``self.retry`` (which parks the call again)."""
    runs = _marks.incr(key)
    if runs <= failures:
        raise self.retry(countdown=1.5)
    return int(runs)


@rd.delayed(bind=True, timeout=2)
def slow_once(self: Any, key: str, seconds: float) -> int:
    """Sleep on the first delivery (so a test can kill the worker mid-task), return at once after."""
    delivery = _marks.incr(key)
    if delivery == 1:
        _marks.set(f"{key}:started", self.request.id)
        time.sleep(seconds)
    return int(delivery)


@app.task
def plain_add(x: int, y: int) -> int:
    return x + y


@rd.delayed(bind=True, timeout=1)
def heartbeat(self: Any, key: str, seconds: float) -> int:
    """Run for longer than the visibility timeout, touching the deadline as it goes."""
    delivery = _marks.incr(key)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        self.touch(1)
        time.sleep(0.2)
    return int(delivery)


@rd.batched(size=10, max_wait=1.0)
def bind_truck(area: str, parcels: list[Any]) -> int:
    """Bind an area's parcels to one truck; record each batch as it arrived."""
    _marks.rpush(f"trucks:{area}", json.dumps(parcels))
    return len(parcels)


@rd.delayed(bind=True, lock="order:{order_id}", lock_timeout=10, lock_retry=2)
def update_order(self: Any, order_id: str, status: str) -> str:
    """An order update under the order's lock; counts runners to catch two at once."""
    running = _marks.incr(f"order:{order_id}:running")
    try:
        _marks.rpush(f"order:{order_id}:concurrency", running)
        time.sleep(0.05)
        _marks.rpush(f"order:{order_id}:statuses", status)
    finally:
        _marks.decr(f"order:{order_id}:running")
    return status


@rd.delayed(bind=True, lock="order:{order_id}", lock_timeout=3, lock_retry=2, timeout=5)
def hold_order(self: Any, order_id: str, seconds: float) -> int:
    """Hold the order's lock for ``seconds`` on the first delivery (a test kills the worker meanwhile)."""
    delivery = _marks.incr(f"order:{order_id}:holds")
    if delivery == 1:
        _marks.set(f"order:{order_id}:holding", self.request.id)
        time.sleep(seconds)
    return int(delivery)
