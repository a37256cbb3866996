"""Releasing to RabbitMQ: calls/s of ``rd.tick()`` publishing due calls to a real RabbitMQ node, each confirmed by
the broker before the store counts it released (``release/confirms.py``), against Celery's own ``send_task`` of the
same number of calls to the same node: as Celery sends (no confirms), and with ``confirm_publish`` (the same word
from the broker, a round trip per call). The sides take turns over two rounds after a warm-up of each; the queue is
emptied between them. Reported, no target: what confirms cost, and where it is paid.

Skipped, saying why, without Debian's ``rabbitmq-server``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from celery import Celery
from kombu import Connection

from celery_redisdelay import RedisDelay
from celery_redisdelay.testing import CeleryProcess, wait_for
from celery_redisdelay.testing.rabbitmq import INSTALL_HINT, RabbitMQServer, RabbitMQUnavailable

from ..context import Context
from ..processes import ROOT
from ..report import SKIPPED, Row, ratio
from .worker_memory import COUNTDOWN, settled_rss

ROUNDS = 2
SIZE, QUICK_SIZE = 5000, 500
MEMORY_CALLS = 5000


def _noop(i: int) -> int:
    return i


def _apps(rabbit: RabbitMQServer, url: str, queue: str) -> tuple[Celery, RedisDelay, Celery, Celery]:
    ours = Celery("bench_rabbit", broker=rabbit.url, set_as_current=False)
    ours.conf.update(
        redisdelay_url=f"{url}/0",
        redisdelay_key_prefix=f"bench-rabbit-{uuid.uuid4().hex[:6]}",
        redisdelay_precise_release=False,
        task_default_queue=queue,
    )
    rd = RedisDelay(ours)
    plain = Celery("bench_rabbit_plain", broker=rabbit.url, set_as_current=False)
    plain.conf.task_default_queue = queue
    confirmed = Celery("bench_rabbit_confirmed", broker=rabbit.url, set_as_current=False)
    confirmed.conf.update(task_default_queue=queue, broker_transport_options={"confirm_publish": True})
    return ours, rd, plain, confirmed


def _purge(rabbit: RabbitMQServer, queue: str) -> None:
    with Connection(rabbit.url) as connection:
        connection.default_channel.queue_purge(queue)


def _release(rd: RedisDelay, task: Any, n: int) -> float:
    """Park ``n`` calls due now, then seconds for ticks to release them all."""
    task.park_many([(i,) for i in range(n)], countdown=0)
    began = time.perf_counter()
    while rd.stats()["delayed"]:
        rd.tick()
    return time.perf_counter() - began


def _send(app: Celery, n: int) -> float:
    """Seconds for ``n`` of Celery's ``send_task``, one at a time, on one producer."""
    began = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for i in range(n):
            app.send_task("bench.rabbit_noop", (i,), producer=producer)
    return time.perf_counter() - began


def release_rabbitmq(ctx: Context) -> dict[str, Any]:
    try:
        rabbit = RabbitMQServer()
    except RabbitMQUnavailable:
        row = Row("release to RabbitMQ", SKIPPED, "calls/s", None, f"no RabbitMQ ({INSTALL_HINT})")
        return {"rows": [row.as_dict()], "details": {}}
    n = QUICK_SIZE if ctx.quick else SIZE
    queue = "bench-rabbit"
    rabbit.start()
    ctx.say(f"  RabbitMQ started in {rabbit.startup_seconds:.1f} s")
    ours, rd, plain, confirmed = _apps(rabbit, ctx.url, queue)
    try:
        task = rd.delayed(name="bench.rabbit_noop")(_noop)
        with Connection(rabbit.url) as connection:
            ours.amqp.queues[queue](connection.default_channel).declare()
        seconds = {"ours": 0.0, "plain": 0.0, "confirmed": 0.0}
        for turn in range(ROUNDS + 1):
            took = {"ours": _release(rd, task, n)}
            _purge(rabbit, queue)
            took["plain"] = _send(plain, n)
            _purge(rabbit, queue)
            took["confirmed"] = _send(confirmed, n)
            _purge(rabbit, queue)
            ctx.say(
                f"  {'round ' + str(turn) if turn else 'warm-up'}: "
                + ", ".join(f"{side} {n / value:,.0f} calls/s" for side, value in took.items())
            )
            if turn:
                for side, value in took.items():
                    seconds[side] += value
        rate = {side: ROUNDS * n / value for side, value in seconds.items()}
    finally:
        for app in (ours, plain, confirmed):
            app.close()
        ctx.client.unlink(*rd.keys.store_keys)
        rabbit.stop()
    rows = [
        Row(
            "release to RabbitMQ, confirmed",
            rate["ours"],
            "calls/s",
            rate["plain"],
            "Celery's send_task, unconfirmed",
            ratio(rate["ours"], rate["plain"]),
        ),
        Row(
            "release to RabbitMQ, confirmed",
            rate["ours"],
            "calls/s",
            rate["confirmed"],
            "Celery's send_task with confirm_publish",
            ratio(rate["ours"], rate["confirmed"]),
        ),
    ]
    return {
        "rows": [row.as_dict() for row in rows],
        "details": {"calls": n, "rounds": ROUNDS, "startup_seconds": rabbit.startup_seconds},
    }


def _settled_depth(rabbit: RabbitMQServer, connection: Any, queue: str, deadline: float) -> int:
    """The messages left in ``queue`` once a worker stops taking them: none, or the same for 5 s (Celery raises its
    prefetch one eta task at a time), or what is left at ``deadline`` seconds."""
    began, seen, since = time.monotonic(), -1, time.monotonic()
    while True:
        depth = rabbit.queue_depth(connection, queue)
        now = time.monotonic()
        if depth != seen:
            seen, since = depth, now
        if depth == 0 or now - since >= 5 or now - began >= deadline:
            return depth
        time.sleep(0.5)


def _solo_worker(ctx: Context, rabbit: RabbitMQServer, name: str, queue: str) -> CeleryProcess:
    env = {"REDISDELAY_BENCH_URL": ctx.url, "REDISDELAY_BENCH_AMQP": rabbit.url, "PYTHONPATH": str(ROOT)}
    argv = ["worker", "--loglevel=INFO", "--pool=solo", f"--hostname={name}@%h", f"--queues={queue}"]
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    process = CeleryProcess("bench.rabbit_app", argv, env, str(ROOT)).start()
    wait_for(lambda: "ready." in process.output(), 90, f"worker {name}")
    return process


def worker_memory_rabbitmq(ctx: Context) -> dict[str, Any]:
    """RSS growth of a solo worker on RabbitMQ with MEMORY_CALLS calls parked for an hour, against a plain worker
    holding as many of Celery's countdown tasks (RabbitMQ hands them all over: Celery raises its prefetch for each
    eta task it holds)."""
    try:
        rabbit = RabbitMQServer()
    except RabbitMQUnavailable:
        row = Row("worker RSS on RabbitMQ", SKIPPED, "MB", None, f"no RabbitMQ ({INSTALL_HINT})")
        return {"rows": [row.as_dict()], "details": {}}
    import os

    from .. import rabbit_app

    n = QUICK_SIZE if ctx.quick else MEMORY_CALLS
    rabbit.start()
    os.environ.update({"REDISDELAY_BENCH_AMQP": rabbit.url})
    app = rabbit_app.app
    app.conf.broker_url = rabbit.url
    app.conf.redisdelay_url = f"{ctx.url}/0"
    processes: list[CeleryProcess] = []
    settle = 2.0 if ctx.quick else 5.0
    try:
        ours = _solo_worker(ctx, rabbit, "bench-rabbit-ours", rabbit_app.OURS_QUEUE)
        processes.append(ours)
        plain = _solo_worker(ctx, rabbit, "bench-rabbit-plain", rabbit_app.PLAIN_QUEUE)
        processes.append(plain)
        ours_idle = settled_rss(ours, minimum=settle, deadline=30)
        rabbit_app.delayed_noop.park_many([(i,) for i in range(n)], countdown=COUNTDOWN)
        ours_after = settled_rss(ours, minimum=settle, deadline=30)
        plain_idle = settled_rss(plain, minimum=settle, deadline=30)
        with app.producer_or_acquire() as producer:
            for i in range(n):
                rabbit_app.plain_noop.apply_async((i,), countdown=COUNTDOWN, producer=producer)
        with Connection(rabbit.url) as connection:
            left = _settled_depth(rabbit, connection, rabbit_app.PLAIN_QUEUE, deadline=180)
        held = n - left
        plain_after = settled_rss(plain, minimum=settle, deadline=120)
        parked = rabbit_app.rd.stats()["delayed"]
    finally:
        for process in processes:
            process.stop()
            process.remove_files()
        ctx.client.unlink(*rabbit_app.rd.keys.store_keys)
        rabbit.stop()
    ours_growth, plain_growth = ours_after - ours_idle, plain_after - plain_idle
    ctx.say(
        f"  ours: {ours_idle:.1f} -> {ours_after:.1f} MB with {parked:,} parked; plain Celery: {plain_idle:.1f} -> "
        f"{plain_after:.1f} MB holding {held:,} of {n:,} countdown tasks (the rest still in the queue)"
    )
    row = Row(
        f"worker RSS growth on RabbitMQ, {n:,} calls an hour away",
        ours_growth,
        "MB",
        plain_growth,
        f"Celery holding {held:,} of them (prefetched eta tasks)",
        ratio(ours_growth, plain_growth),
    )
    return {"rows": [row.as_dict()], "details": {"calls": n, "parked": parked, "plain_held": held}}
