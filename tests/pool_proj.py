"""A Celery app for the tests that run the extension under each of Celery's pools (``tests/test_pools.py``).

Configured from ``REDISDELAY_POOL_CONF`` (JSON of ``app.conf``, and ``marks_url``: where the tasks note what
they did); the worker loads it with ``--pool=...``, and the test process builds the same app with
:func:`make_app` to park calls.
Under gevent and eventlet, Celery patches the standard library before this module is imported.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import redis
from celery import Celery, shared_task, signals
from celery.exceptions import Reject
from kombu import Exchange, Queue

from celery_redisdelay import Abandon, RedisDelay
from tests import topology_proj

ENV = "REDISDELAY_POOL_CONF"


class Notes:
    """Where the tasks note what they did: a client per process (made in the process that uses it)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._clients: dict[int, redis.Redis] = {}

    def client(self) -> redis.Redis:
        client = self._clients.get(os.getpid())
        if client is None:
            client = self._clients[os.getpid()] = redis.Redis.from_url(self.url)
        return client

    def add(self, rd: RedisDelay, key: str, request: Any, **fields: Any) -> None:
        found = rd.find(request.id) if request.id else None
        delivery = int(found.meta.get("d", 0)) if found is not None else 0
        note = {
            "id": request.id,
            "pid": os.getpid(),
            "delivery": delivery,
            "phase": found.meta.get("s") if found is not None else None,  # as the store sees the call then
            "once": found.meta.get("c") if found is not None else None,
            "at_ms": time.time() * 1000,
            "eta": getattr(request, "eta", None),  # the message's own, to tell an early run from a late send
            **fields,
        }
        self.client().rpush(key, json.dumps(note))


#: Where each app's tasks note what they did (for the shared task, which runs in every app).
NOTES: dict[Celery, Notes] = {}


@shared_task(name="shared.record", bind=True)
def shared_record(self: Any, key: str, value: Any = None) -> Any:
    """A ``@shared_task``: note the call in its app's notes."""
    app = self._get_app()
    NOTES[app].add(RedisDelay.of(app), key, self.request, value=value)
    return value


def hold_the_store_lock_at_each_fork(rd: RedisDelay) -> None:
    """Fault injection: every fork of this process happens while another of its threads holds the lock of
    the store's connection pool, as the worker's precise releaser thread may hold it when Celery forks a
    pool process. Only the process that calls this is affected (its pool processes do not fork)."""
    pool = rd.client.connection_pool
    wanted, taken, leave = threading.Semaphore(0), threading.Event(), threading.Event()
    parent = os.getpid()

    def holder() -> None:
        while True:
            wanted.acquire()
            with pool._lock:
                taken.set()
                leave.wait()
                leave.clear()

    threading.Thread(target=holder, name="holds-the-store-lock", daemon=True).start()

    def before() -> None:
        if os.getpid() == parent:
            wanted.release()
            taken.wait(10)
            taken.clear()

    def after_in_parent() -> None:
        if os.getpid() == parent:
            leave.set()

    os.register_at_fork(before=before, after_in_parent=after_in_parent)


def stall_the_loop_on(task_name: str, notes: Notes, key: str) -> None:
    """Fault injection: the first worker to receive a call of ``task_name`` gets its event loop stuck there (in
    a ``task_received`` handler, in the loop's thread) until ``key`` is set in the notes."""

    def on_received(request: Any = None, **_: Any) -> None:
        if getattr(request, "name", None) == task_name and notes.client().set(f"{key}:taken", 1, nx=True):
            while not notes.client().get(key):
                time.sleep(0.1)

    signals.task_received.connect(on_received, weak=False)


def make_app(conf: dict[str, Any], name: str = "pool_proj") -> tuple[Celery, RedisDelay]:
    """The app with ``conf`` and its tasks. Besides Celery's settings, ``conf`` may hold ``marks_url`` (where
    the tasks note what they did), ``topic_queue`` (a queue name: the plain tasks go there through a topic
    exchange), ``hold_store_lock_at_fork`` (see :func:`hold_the_store_lock_at_each_fork`,
    done in a worker's main process) and ``stall_loop_on`` (a task's name and a key, see
    :func:`stall_the_loop_on`)."""
    conf = dict(conf)
    notes = Notes(conf.pop("marks_url", "redis://127.0.0.1:6379/2"))
    hold_lock = conf.pop("hold_store_lock_at_fork", False)
    stall = conf.pop("stall_loop_on", None)
    topic = conf.pop("topic_queue", None)
    app, rd = topology_proj.make_app(conf, name)  # the same defaults as the topology tests
    if topic:  # a queue bound to a topic exchange, the plain tasks routed there: no call of theirs is sent by send.lua
        app.conf.task_queues = [Queue(topic, Exchange(f"{topic}-exchange", type="topic"), routing_key=f"{topic}.#")]
        app.conf.task_routes = {"plain.*": {"queue": topic, "routing_key": f"{topic}.calls"}}
    if hold_lock:
        signals.worker_init.connect(lambda **_: hold_the_store_lock_at_each_fork(rd), weak=False)
    if stall:
        signals.worker_init.connect(lambda **_: stall_the_loop_on(stall[0], notes, stall[1]), weak=False)

    @rd.delayed(name="pools.record", bind=True)
    def record(self: Any, key: str, value: Any = None) -> Any:
        """Note the call: its id, the process that ran it, its delivery."""
        notes.add(rd, key, self.request, value=value)
        return value

    @rd.delayed(name="pools.park_from_task", bind=True)
    def park_from_task(self: Any, key: str, countdown: float) -> str:
        """Park another call from inside a task; it notes itself under ``key`` when it runs."""
        child = record.apply_async((key, "parked by a task"), countdown=countdown)
        notes.add(rd, key, self.request, parked=child.id)
        return str(child.id)

    @rd.delayed(name="pools.touching", bind=True, timeout=2)
    def touching(self: Any, key: str, seconds: float) -> bool:
        """Run longer than the 2 s visibility timeout, heartbeating with ``self.touch()``."""
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            assert self.touch(2)
            time.sleep(0.3)
        notes.add(rd, key, self.request)
        return True

    def sleep_noted(task: Any, key: str, seconds: float) -> float:
        """Note the start (with the worker running it), sleep ``seconds`` (or what ``<key>:sleep`` says, when
        set), note the end."""
        notes.add(rd, key, task.request, at="start", worker=task.request.hostname)
        told = notes.client().get(f"{key}:sleep")
        time.sleep(float(told) if told is not None else seconds)
        notes.add(rd, key, task.request, at="end", worker=task.request.hostname)
        return seconds

    @rd.delayed(name="pools.sleep", bind=True)
    def sleep(self: Any, key: str, seconds: float) -> float:
        return sleep_noted(self, key, seconds)

    @rd.delayed(name="pools.abandon_once", bind=True, timeout=1)
    def abandon_once(self: Any, key: str) -> int:
        """Abandon the first delivery (the sweep brings it back after the 1 s timeout), finish the second."""
        runs = int(notes.client().incr(f"{key}:runs"))
        if runs == 1:
            raise Abandon("the first delivery is abandoned on purpose")
        info = self.request.delivery_info or {}
        notes.add(
            rd,
            key,
            self.request,
            runs=runs,
            redelivered=info.get("redelivered"),
            count=self.request.get("x-delivery-count"),
        )
        return runs

    @rd.delayed(name="pools.reject_once", bind=True, acks_late=True)
    def reject_once(self: Any, key: str) -> int:
        """Reject the first delivery with requeue (``Reject(requeue=True)``, which needs ``acks_late``), note the
        next."""
        runs = int(notes.client().incr(f"{key}:runs"))
        if runs == 1:
            raise Reject("the first delivery is rejected on purpose", requeue=True)
        notes.add(rd, key, self.request, runs=runs, worker=self.request.hostname)
        return runs

    # Plain tasks: parked by redisdelay_all_tasks, or by the worker that receives their eta messages.
    @app.task(name="plain.record", bind=True, shared=False)
    def plain_record(self: Any, key: str, value: Any = None) -> Any:
        notes.add(rd, key, self.request, value=value)
        return value

    @app.task(name="plain.sleep", bind=True, shared=False)
    def plain_sleep(self: Any, key: str, seconds: float) -> float:
        """``pools.sleep`` as a plain task: its calls due now are tracked only with redisdelay_track_due_now."""
        return sleep_noted(self, key, seconds)

    @app.task(name="plain.sleep_late", bind=True, shared=False, acks_late=True)
    def plain_sleep_late(self: Any, key: str, seconds: float) -> float:
        """``plain.sleep`` acknowledged late (Celery's at-least-once setting)."""
        return sleep_noted(self, key, seconds)

    @app.task(name="plain.retrying", bind=True, shared=False)
    def plain_retrying(self: Any, key: str, countdown: float) -> int:
        """Retry once with ``countdown``, then note the run."""
        runs = int(notes.client().incr(f"{key}:runs"))
        if runs == 1:
            raise self.retry(countdown=countdown)
        notes.add(rd, key, self.request, runs=runs)
        return runs

    @app.task(
        name="plain.autoretry",
        bind=True,
        shared=False,
        autoretry_for=(ValueError,),
        retry_backoff=1,
        retry_jitter=False,
        max_retries=3,
    )
    def plain_autoretry(self: Any, key: str, failures: int) -> int:
        """Fail ``failures`` times (Celery retries with a backoff), then note the run."""
        runs = int(notes.client().incr(f"{key}:runs"))
        if runs <= failures:
            raise ValueError(f"failure {runs} of {failures}, on purpose")
        notes.add(rd, key, self.request, runs=runs)
        return runs

    NOTES[app] = notes

    @app.task(name="pools.hang", shared=False)
    def hang() -> None:
        """Block on a lock nobody will release, as a pool process forked with an inherited held lock does."""
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()

    @rd.delayed(name="pools.locked", bind=True, lock="pools:{order}", lock_timeout=30, lock_retry=5)
    def locked(self: Any, key: str, order: int) -> None:
        """Hold the order's lock while running (a busy lock defers the call)."""
        notes.add(rd, key, self.request, order=order)

    # Limits (tests/test_limits.py): each run notes when it started and ended, under ``key``.
    def limited_run(self: Any, key: str, seconds: float, **fields: Any) -> None:
        note = {"id": self.request.id, "task": self.name, "start": time.time() * 1000, **fields}
        time.sleep(seconds)
        note["end"] = time.time() * 1000
        notes.client().rpush(key, json.dumps(note))

    @rd.delayed(name="limits.rated", bind=True, limit_rate="20/s")
    def rated(self: Any, key: str, n: int) -> None:
        limited_run(self, key, 0, n=n)

    @rd.delayed(name="limits.concurrent", bind=True, limit_concurrency=3)
    def concurrent(self: Any, key: str, seconds: float) -> None:
        limited_run(self, key, seconds)

    @rd.delayed(name="limits.keyed", bind=True, limit_rate="1/s", limit_key="tenant:{tenant}")
    def keyed(self: Any, key: str, tenant: int, n: int) -> None:
        limited_run(self, key, 0, tenant=tenant, n=n)

    @rd.delayed(name="limits.quota_a", bind=True, limit_quota="shared")
    def quota_a(self: Any, key: str, seconds: float) -> None:
        limited_run(self, key, seconds)

    @rd.delayed(name="limits.quota_b", bind=True, limit_quota="shared")
    def quota_b(self: Any, key: str, seconds: float) -> None:
        limited_run(self, key, seconds)

    return app, rd


app, rd = make_app(json.loads(os.environ.get(ENV) or '{"broker_url": "redis://127.0.0.1:6379/0"}'))
