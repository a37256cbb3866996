"""The Celery app of the conformance suite: each task twice, as ``@app.task`` and as ``@rd.delayed``.

With ``REDISDELAY_CONFORMANCE_MODE=all-tasks`` the app has ``redisdelay_all_tasks`` on, and the second variant of
each task is a plain task the setting adopts (``@app.task``, or ``@shared_task`` for every other one), while
the first opts out (``redisdelay_park=False``): the same suite then compares Celery with the whole-app mode.
``tracked`` is the same with ``redisdelay_track_due_now``: the store is then the broker's database (tracking needs
it), so the second variant's calls due now are tracked too.

``tests/test_conformance.py`` runs the same call on both and compares what a real worker did: which
deliveries ran with which request, the result state and value, callbacks, events. The tasks record
each run in Redis (database 2) under the call's id.

The set-up is the harder one on purpose: the broker on database 3 with kombu's ``global_keyprefix``,
the store on database 4 (so releases go through the pipeline to the broker's lists), results on
database 5, task events on.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import redis
from celery import Celery, shared_task
from celery.exceptions import Reject, SoftTimeLimitExceeded
from kombu import Exchange, Queue

from celery_redisdelay import RedisDelay

URL = os.environ.get("REDISDELAY_TEST_URL", "redis://127.0.0.1:6379")
MODE_ENV = "REDISDELAY_CONFORMANCE_MODE"
MODE = os.environ.get(MODE_ENV, "delayed")  # or "all-tasks", or "tracked"
ALL_TASKS = MODE in ("all-tasks", "tracked")
TRACKED = MODE == "tracked"
PREFIX = "pfx:"
QUEUES = ("conf", "conf.routed", "conf.bound")
BOUND_EXCHANGE, BOUND_KEY = "conf.exchange", "conf.key"


class ConformanceApp(Celery):  # type: ignore[misc]
    """Celery whose clock a task can stop in its own thread (:meth:`clock_at`): ``app.now()`` is what Celery, and
    the extension as Celery does, add a countdown to for the message's eta, so two calls made at the same stopped
    instant get the same eta."""

    _stopped = threading.local()

    def now(self) -> datetime:
        at: datetime | None = getattr(self._stopped, "at", None)
        return at.astimezone(self.timezone) if at is not None else super().now()

    @contextmanager
    def clock_at(self, at: datetime) -> Iterator[None]:
        self._stopped.at = at
        try:
            yield
        finally:
            self._stopped.at = None


app = ConformanceApp("conformance", broker=f"{URL}/3", backend=f"{URL}/5")
app.conf.update(
    broker_transport_options={"global_keyprefix": PREFIX},
    redisdelay_url=f"{URL}/4",
    redisdelay_key_prefix="conf",
    redisdelay_tick_interval=0.2,
    redisdelay_visibility_timeout=30,
    task_default_queue="conf",
    task_queues=[
        Queue("conf"),
        Queue("conf.routed"),
        Queue("conf.bound", Exchange(BOUND_EXCHANGE, type="direct"), routing_key=BOUND_KEY),
    ],
    worker_prefetch_multiplier=1,
    worker_send_task_events=True,
    redisdelay_all_tasks=ALL_TASKS,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)
if TRACKED:
    app.conf.update(redisdelay_url=f"{URL}/3", redisdelay_track_due_now=True)
rd = RedisDelay(app)
marks = redis.Redis.from_url(f"{URL}/2")

#: The two variants of every task: ``plain.<name>`` and ``delayed.<name>``.
VARIANTS = ("plain", "delayed")


def server_ms() -> int:
    seconds, micros = marks.time()
    return int(seconds) * 1000 + int(micros) // 1000


def observe(task: Any, **extra: Any) -> None:
    """Record this run of ``task``: what the worker gave it in its request, and when it ran."""
    r = task.request
    headers = {k: v for k, v in (r.headers or {}).items() if k not in ("stamped_headers", "stamps")}
    seen = {
        "args": r.args,
        "kwargs": r.kwargs,
        "retries": r.retries,
        "eta": r.eta,
        "expires": r.expires,
        "exchange": (r.delivery_info or {}).get("exchange"),
        "routing_key": (r.delivery_info or {}).get("routing_key"),
        "priority": (r.delivery_info or {}).get("priority"),
        "headers": headers,
        "timelimit": list(r.timelimit or (None, None)),
        "shadow": r.shadow,
        "ignore_result": r.ignore_result,
        "root_is_self": r.root_id == r.id,
        "has_parent": r.parent_id is not None,
        "in_group": r.group is not None,
        "in_chord": r.chord is not None,
        "callbacks": len(r.callbacks or ()),
        "errbacks": len(r.errbacks or ()),
        "at_ms": server_ms(),
        **extra,
    }
    marks.rpush(f"runs:{r.id}", json.dumps(seen, default=str))


_registered = [0]


def both(**options: Any) -> Callable[[Callable[..., Any]], dict[str, Any]]:
    """Register a function as ``plain.<name>`` (``@app.task``) and ``delayed.<name>`` (``@rd.delayed``, or in
    all-tasks mode a plain task the setting adopts), with the same options; returns both tasks by variant."""

    def register(function: Callable[..., Any]) -> dict[str, Any]:
        name = function.__name__
        if not ALL_TASKS:
            return {
                "plain": app.task(name=f"plain.{name}", bind=True, **options)(function),
                "delayed": rd.delayed(name=f"delayed.{name}", bind=True, **options)(function),
            }
        _registered[0] += 1
        plain = app.task(name=f"plain.{name}", bind=True, shared=False, redisdelay_park=False, **options)(function)
        if _registered[0] % 2:
            shared_task(name=f"delayed.{name}", bind=True, **options)(function)
            adopted = app.tasks[f"delayed.{name}"]
        else:
            adopted = app.task(name=f"delayed.{name}", bind=True, shared=False, **options)(function)
        return {"plain": plain, "delayed": adopted}

    return register


@both()
def echo(self: Any, value: Any = None, **kwargs: Any) -> Any:
    observe(self)
    return value


@both(autoretry_for=(ValueError,), retry_backoff=1, retry_jitter=False, max_retries=3)
def flaky(self: Any, token: str, failures: int) -> int:
    """Raise ValueError ``failures`` times (Celery retries it through ``autoretry_for``); each variant
    counts its own failures under the same token."""
    observe(self)
    if marks.incr(f"flaky:{token}:{self.name}") <= failures:
        raise ValueError(f"failure {self.request.retries}")
    return self.request.retries


@both()
def retry_once(self: Any, at: str, countdown: float) -> int:
    """Retry once with ``countdown``, the app's clock stopped at ``at``: both variants' retries get one eta."""
    observe(self)
    if self.request.retries == 0:
        with app.clock_at(datetime.fromisoformat(at)):
            raise self.retry(countdown=countdown)
    return int(self.request.retries)


@both()
def fail(self: Any, message: str) -> None:
    observe(self)
    raise KeyError(message)


@both(acks_late=True)
def late(self: Any, value: Any) -> Any:
    observe(self)
    return value


@both(acks_late=True, acks_on_failure_or_timeout=False)
def late_failing(self: Any, token: str) -> None:
    """Fail: with ``acks_on_failure_or_timeout`` False Celery rejects the message without requeue; it runs no more."""
    observe(self)
    marks.incr(f"failing:{token}:{self.name}")
    raise KeyError(token)


@both(acks_late=True, reject_on_worker_lost=True)
def lost_then_requeued(self: Any, token: str) -> str:
    """Kill its own pool process on the first delivery: Celery requeues the message (acks_late)."""
    observe(self)
    if marks.incr(f"lost:{token}:{self.name}") == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return "second"


@both()
def lost(self: Any, token: str) -> str:
    """Kill its own pool process: without acks_late Celery records WorkerLostError and runs it no more."""
    observe(self)
    marks.incr(f"lost:{token}:{self.name}")
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@both(soft_time_limit=0.5)
def soft_limited(self: Any) -> str:
    observe(self)
    try:
        time.sleep(5)
    except SoftTimeLimitExceeded:
        return "soft limit"
    return "not limited"


@both(time_limit=1)
def hard_limited(self: Any) -> str:
    observe(self)
    time.sleep(5)
    return "not limited"


@both()
def rejects(self: Any, requeue: bool) -> None:
    observe(self)
    raise Reject("no", requeue=requeue)


@both(ignore_result=True)
def no_result(self: Any, value: Any) -> Any:
    observe(self)
    return value


@both()
def add(self: Any, x: int, y: int = 0) -> int:
    observe(self)
    return x + y


@both()
def total(self: Any, values: list[int]) -> int:
    observe(self)
    return sum(values)


@app.task(bind=True, name="callback")
def callback(self: Any, *args: Any) -> None:
    """A link or link_error target: records what it was called with under its caller's token."""
    observe(self)


@app.task(bind=True, name="barrier")
def barrier(self: Any) -> None:
    observe(self)
