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
from celery_redisdelay.testing.rabbitmq import INSTALL_HINT, RabbitMQServer, RabbitMQUnavailable

from ..context import Context
from ..report import SKIPPED, Row, ratio

ROUNDS = 2
SIZE, QUICK_SIZE = 5000, 500


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
