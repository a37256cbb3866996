"""Releasing to RabbitMQ: calls/s of ``rd.tick()`` publishing due calls to a real RabbitMQ node, each confirmed by
the broker before the store counts it released (``release/confirms.py``), against Celery's own ``send_task`` of the
same number of calls to the same node: as Celery sends (no confirms), and with ``confirm_publish`` (the same word
from the broker, a round trip per call). The sides take turns over two rounds after a warm-up of each; the queue is
emptied between them. Reported, no target: what confirms cost, and where it is paid.

``e2e_rabbitmq``: delayed calls end to end on one RabbitMQ node, ours against plain Celery. N calls (5,000; ``--quick``
300) are sent with one eta, 10 s (``--quick`` 2 s) after the first send, so that every call is a real delayed call: ours
parked in Redis (the bench's redis-server) with ``apply_async(eta=...)`` and released to RabbitMQ as they fall due by
the releaser in our worker at the package's default (``redisdelay_precise_release``: each worker releases at a tick's
pace, ``redisdelay_tick_interval`` 1 s), each release confirmed by the broker; plain Celery's the same ``apply_async``
of a plain task in an app without the extension, an eta message its worker takes at once and holds in memory until due.
Each side has one ``-P prefork -c 2`` worker at Celery's default prefetch multiplier (4), on its own queue of the same
node, running throughout. The task is a no-op that first records its start (``<id> <Redis ms>``: a TIME and an RPUSH on
the bench's Redis). Per side, by the Redis clock: the drain rate (calls over the time from the due time to the last
start), lateness p50/p99/max (start minus due time), and the growth of the worker's main process RSS (its largest
sample, every 0.25 s during the measured rounds, over its settled RSS after the warm-up). The sides take turns over two
rounds after a warm-up of each (N/10, at least 50 calls); the rates and percentiles are over the two rounds. Rows: drain
rate and p99 lateness, ours against plain Celery's; reported, no target.

Skipped, saying why, without Debian's ``rabbitmq-server``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from kombu import Connection

from celery_redisdelay import RedisDelay
from celery_redisdelay.testing import CeleryProcess, wait_for
from celery_redisdelay.testing.rabbitmq import INSTALL_HINT, RabbitMQServer, RabbitMQUnavailable

from ..common import ENV_PRECISE, ENV_URL, PRECISE_ON, server_ms
from ..context import Context
from ..marks import read_marks
from ..processes import ROOT
from ..report import SKIPPED, Row, percentile, ratio
from .burst import Sampler
from .worker_memory import COUNTDOWN, settled_rss

ROUNDS = 2
SIZE, QUICK_SIZE = 5000, 500
MEMORY_CALLS = 5000
E2E_CALLS, QUICK_E2E_CALLS = 5000, 300
#: Seconds from the first call sent to the due time: time to send them all (and for Celery's worker to take them).
E2E_LEAD, QUICK_E2E_LEAD = 10.0, 2.0


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


def _solo_worker(
    ctx: Context,
    rabbit: RabbitMQServer,
    name: str,
    queue: str,
    pool: str = "solo",
    *,
    plain: bool = False,
    precise: bool = False,
) -> CeleryProcess:
    """A worker of ``bench.rabbit_app`` on ``queue`` (``pool`` as ``--pool`` says: ``solo``, or ``prefork -c 2``);
    ``plain``: the app without the extension; ``precise``: its releaser releases each call as it falls due."""
    env = {"REDISDELAY_BENCH_URL": ctx.url, "REDISDELAY_BENCH_AMQP": rabbit.url, "PYTHONPATH": str(ROOT)}
    if plain:
        env["REDISDELAY_BENCH_RABBIT_PLAIN"] = "1"
    if precise:
        env[ENV_PRECISE] = PRECISE_ON
    argv = ["worker", "--loglevel=INFO", f"--pool={pool}", f"--hostname={name}@%h", f"--queues={queue}"]
    if pool == "prefork":
        argv.append("--concurrency=2")
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    process = CeleryProcess("bench.rabbit_app", argv, env, str(ROOT)).start()

    def ready() -> bool:
        if process.process is not None and process.process.poll() is not None:
            raise RuntimeError(f"worker {name} exited: {process.output()[-2000:]}")
        return "ready." in process.output()

    try:
        wait_for(ready, 90, f"worker {name}")
    except BaseException:
        process.stop()
        process.remove_files()
        raise
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


def _e2e_round(ctx: Context, send: Callable[[str, int, datetime], None], n: int, lead: float) -> dict[str, Any]:
    """Send ``n`` calls due ``lead`` s after the first through ``send(key, n, eta)``; wait for them to start (every one,
    or none more for 30 s); their lateness in ms by the Redis clock, and what did not run once."""
    client = ctx.client
    key = f"bench:rabbit-e2e:{uuid.uuid4().hex}"
    due_ms = server_ms(client) + round(lead * 1000)
    began = time.perf_counter()
    send(key, n, datetime.fromtimestamp(due_ms / 1000, tz=UTC))
    sent = time.perf_counter() - began
    if server_ms(client) >= due_ms:
        raise RuntimeError(f"sending {n} calls took {sent:.1f} s, past their due time; raise E2E_LEAD")
    seen, since = -1, time.monotonic()
    while True:  # a lost call must be reported, not wait forever
        count = int(client.llen(key))
        if count != seen:
            seen, since = count, time.monotonic()
        if (count >= n and time.monotonic() - since >= 0.5) or time.monotonic() - since >= 30 + lead:
            break
        time.sleep(0.05)
    marks = read_marks(client, key)
    client.unlink(key)
    ids = [mark.call_id for mark in marks]
    late = [float(mark.ms - due_ms) for mark in marks]
    return {
        "late": late,
        "drain_seconds": max(max(late, default=0.0) / 1000, 0.001),
        "sent_seconds": sent,
        "missing": n - len(set(ids)),
        "duplicates": len(ids) - len(set(ids)),
        "early": sum(1 for value in late if value < 0),
    }


def e2e_rabbitmq(ctx: Context) -> dict[str, Any]:
    """Delayed calls end to end on RabbitMQ: ours (parked in Redis, released by the worker's releaser)
    against plain Celery's eta tasks (held by the worker), one ``-P prefork -c 2`` worker each at prefetch 4."""
    try:
        rabbit = RabbitMQServer()
    except RabbitMQUnavailable:
        row = Row("e2e on RabbitMQ", SKIPPED, "calls/s", None, f"no RabbitMQ ({INSTALL_HINT})")
        return {"rows": [row.as_dict()], "details": {}}
    n = QUICK_E2E_CALLS if ctx.quick else E2E_CALLS
    lead = QUICK_E2E_LEAD if ctx.quick else E2E_LEAD
    rabbit.start()
    ctx.say(f"  RabbitMQ started in {rabbit.startup_seconds:.1f} s")
    os.environ.update({"REDISDELAY_BENCH_AMQP": rabbit.url, ENV_URL: ctx.url})
    from .. import rabbit_app

    app = rabbit_app.app
    app.close()  # a producer pool of an earlier figure's node
    app.conf.broker_url = rabbit.url
    app.conf.redisdelay_url = f"{ctx.url}/0"
    rd = rabbit_app.rd
    ctx.client.unlink(*rd.keys.store_keys)

    def send_ours(key: str, count: int, eta: datetime) -> None:
        for i in range(count):
            rabbit_app.delayed_stamp.apply_async((key, i), eta=eta)

    def send_plain(key: str, count: int, eta: datetime) -> None:
        with app.producer_or_acquire() as producer:
            for i in range(count):
                rabbit_app.plain_stamp.apply_async((key, i), eta=eta, producer=producer)

    sends = {"ours": send_ours, "plain": send_plain}
    workers: dict[str, CeleryProcess] = {}
    late: dict[str, list[float]] = {side: [] for side in sends}
    drain = dict.fromkeys(sends, 0.0)
    odd = {side: {"missing": 0, "duplicates": 0, "early": 0} for side in sends}
    idle: dict[str, float] = {}
    samplers: dict[str, Sampler] = {}
    rss: dict[str, float] = {}
    try:
        workers["ours"] = _solo_worker(ctx, rabbit, "bench-rabbit-e2e-ours", rabbit_app.OURS_QUEUE, "prefork")
        workers["plain"] = _solo_worker(
            ctx, rabbit, "bench-rabbit-e2e-plain", rabbit_app.PLAIN_QUEUE, "prefork", plain=True
        )
        for turn in range(ROUNDS + 1):
            size = n if turn else max(50, n // 10)
            if turn == 1:  # each worker's RSS settled after its warm-up, then its largest over the rounds
                for side, worker in workers.items():
                    idle[side] = settled_rss(worker, minimum=2.0, deadline=30)
                    samplers[side] = Sampler(worker.pid)
            for side, send in sends.items():
                found = _e2e_round(ctx, send, size, lead)
                ran = len(found["late"])
                ctx.say(
                    f"  {side} {'round ' + str(turn) if turn else 'warm-up'}: {size:,} calls sent in "
                    f"{found['sent_seconds']:.2f} s, drained at {ran / found['drain_seconds']:,.0f} calls/s, "
                    f"p50 {percentile(found['late'], 50) if ran else float('nan'):,.0f} ms, "
                    f"p99 {percentile(found['late'], 99) if ran else float('nan'):,.0f} ms"
                    + "".join(f", {found[what]} {what}" for what in odd[side] if found[what])
                )
                if turn:
                    late[side] += found["late"]
                    drain[side] += found["drain_seconds"]
                    for what in odd[side]:
                        odd[side][what] += found[what]
        for side, sampler in samplers.items():
            rss[side] = sampler.stop() - idle[side]
        left = rd.stats()
    finally:
        for sampler in samplers.values():
            sampler.stop()
        for worker in workers.values():
            worker.stop()
            worker.remove_files()
        app.close()
        ctx.client.unlink(*rd.keys.store_keys)
        rabbit.stop()
    sides: dict[str, dict[str, Any]] = {}
    for side in sends:
        values = late[side] or [float("nan")]
        sides[side] = {
            "drain_per_s": len(late[side]) / drain[side],
            "p50_ms": percentile(values, 50),
            "p99_ms": percentile(values, 99),
            "max_ms": max(values),
            "rss_growth_mb": rss[side],
            "idle_rss_mb": idle[side],
            **odd[side],
        }
        ctx.say(
            f"  {side}: {sides[side]['drain_per_s']:,.0f} calls/s, p50 {sides[side]['p50_ms']:,.0f} ms, "
            f"p99 {sides[side]['p99_ms']:,.0f} ms, max {sides[side]['max_ms']:,.0f} ms, worker RSS "
            f"{rss[side]:+.1f} MB" + "".join(f", {count} {what}" for what, count in odd[side].items() if count)
        )
    ours, plain = sides["ours"], sides["plain"]
    baseline = "plain Celery's eta tasks, same node"
    rows = [
        Row(
            f"e2e on RabbitMQ, {n:,} calls due at once (prefetch 4): drain rate",
            ours["drain_per_s"],
            "calls/s",
            plain["drain_per_s"],
            baseline,
            ratio(ours["drain_per_s"], plain["drain_per_s"]),
            "reported",
        ),
        Row(
            f"e2e on RabbitMQ, {n:,} calls due at once (prefetch 4): p99 lateness",
            ours["p99_ms"],
            "ms",
            plain["p99_ms"],
            baseline,
            ratio(ours["p99_ms"], plain["p99_ms"]),
            "reported",
        ),
    ]
    details = {
        "calls": n,
        "rounds": ROUNDS,
        "lead_seconds": lead,
        "pool": "prefork",
        "concurrency": 2,
        "prefetch_multiplier": 4,
        "task": "no-op after recording its start (TIME + RPUSH on the bench's Redis)",
        "startup_seconds": rabbit.startup_seconds,
        "store_after": {"delayed": left["delayed"], "inflight": left["inflight"]},
        **sides,
    }
    return {"rows": [row.as_dict() for row in rows], "details": details}
