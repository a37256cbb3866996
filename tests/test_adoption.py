"""``redisdelay_all_tasks`` on the producer side, against a real redis-server: the app's plain tasks park their
delayed calls without being re-decorated, as a delayed task parks them; calls due now, Celery's own tasks and
tasks that opt out reach the broker exactly as without the extension (compared with an app without it)."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery, Task, shared_task
from kombu import Consumer, Queue

from celery_redisdelay import RedisDelay
from celery_redisdelay.message.marks import ETA_HEADER
from celery_redisdelay.testing import RedisServer, wait_for
from tests.pool_run import pool_worker

MakeApp = Callable[..., tuple[Celery, RedisDelay]]


@pytest.fixture
def queue() -> str:
    return f"adopt-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def adopting(make_app: MakeApp, queue: str) -> tuple[Celery, RedisDelay]:
    return make_app(redisdelay_all_tasks=True, task_default_queue=queue)


def plain_tasks(app: Celery) -> dict[str, Any]:
    """The kinds of plain task a project has: ``@app.task``, a class-based task, a task of the app's own
    ``task_cls``, and one that opts out."""

    @app.task(name="adopt.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    class Report(Task):  # type: ignore[misc]
        name = "adopt.report"

        def run(self, day: str) -> str:
            return day

    report = app.register_task(Report())

    @app.task(name="adopt.kept_out", redisdelay_park=False, shared=False)
    def kept_out(x: int) -> int:
        return x

    return {"add": add, "report": report, "kept_out": kept_out}


def broker_messages(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """Every message waiting in ``queue``'s lists (one per priority step)."""
    lists = [queue] + [f"{queue}\x06\x16{step}" for step in (3, 6, 9)]
    return [json.loads(raw) for key in lists for raw in client.lrange(key, 0, -1)]


def comparable(message: dict[str, Any]) -> dict[str, Any]:
    """A broker message minus what differs between two apps and two instants: the delivery tag (new per
    publish), the app's reply queue, and an eta computed from a countdown (present or not, they agree), which a
    parked call's message keeps for the running task in a private header instead."""
    properties = {k: v for k, v in message["properties"].items() if k not in ("delivery_tag", "reply_to")}
    headers = {k: v for k, v in message["headers"].items() if k != ETA_HEADER}
    headers["eta"] = message["headers"]["eta"] is not None
    return {**message, "properties": properties, "headers": headers}


def test_a_plain_tasks_delayed_calls_are_parked(adopting: tuple[Celery, RedisDelay], client: redis.Redis) -> None:
    app, rd = adopting
    tasks = plain_tasks(app)
    soon = datetime.now(UTC) + timedelta(hours=1)
    parked = [
        tasks["add"].apply_async((1, 2), countdown=30),
        tasks["add"].apply_async((1, 2), eta=soon),
        tasks["add"].s(3, 4).apply_async(countdown=5),
        tasks["report"].apply_async(("monday",), countdown=60),
        app.send_task("adopt.add", (5, 6), countdown=9),
    ]
    for result in parked:
        found = rd.find(result.id)
        assert found is not None and found.state == "delayed", result
    assert client.llen(app.conf.task_default_queue) == 0, "nothing reached the broker"
    assert rd.cancel(parked[0].id)
    assert rd.reschedule(parked[1].id, countdown=1)


@pytest.mark.parametrize("tracking", [None, False], ids=["tracked-by-default", "untracked"])
def test_calls_due_now_and_calls_left_to_celery_are_sent_as_celery_sends_them(
    make_app: MakeApp, queue: str, without: Celery, client: redis.Redis, tracking: bool | None
) -> None:
    """Calls due now go to the queue as Celery sends them, tracked (in the store, in flight) by default and
    untracked with ``redisdelay_track_due_now = False``; a task that opts out keeps Celery's path."""
    app, rd = make_app(redisdelay_all_tasks=True, task_default_queue=queue, redisdelay_track_due_now=tracking)
    ours, theirs = plain_tasks(app), plain_tasks(without)
    past = datetime.now(UTC) - timedelta(minutes=1)
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("add", (1, 2), {}),
        ("add", (1, 2), {"countdown": 0}),
        ("add", (1, 2), {"countdown": -5}),
        ("add", (1, 2), {"eta": past}),
        ("kept_out", (7,), {"countdown": 60}),
        ("report", ("sunday",), {"priority": 3}),
    ]
    released: set[str] = set()  # parked due now: released as Celery's message without its eta (as any parked call)
    for name, args, options in calls:
        call_id = f"same-{uuid.uuid4().hex}"
        ours[name].apply_async(args, task_id=call_id, **options)
        theirs[name].apply_async(args, task_id=call_id, **options)
        found = rd.find(call_id)
        if tracking is None and name != "kept_out":
            # Due now: in flight at once; at an eta already past, parked due now (the next release sends it).
            past_eta = options.get("countdown", 0) < 0 or "eta" in options
            assert found is not None and found.state == ("delayed" if past_eta else "inflight"), (name, options)
            if past_eta:
                released.add(call_id)
        else:
            assert found is None, (name, options)
    assert rd.tick()["released"] == len(released)
    # Every call went to the queue twice, ours and Celery's, alike but for the delivery tag.
    by_id: dict[str, list[dict[str, Any]]] = {}
    for message in broker_messages(client, app.conf.task_default_queue):
        by_id.setdefault(message["headers"]["id"], []).append(comparable(message))
    assert len(by_id) == len(calls)
    for call_id, pair in by_id.items():
        assert len(pair) == 2, pair
        assert (pair[0] == pair[1]) != (call_id in released), pair
    internal = app.tasks["celery.backend_cleanup"].apply_async(countdown=60)
    assert rd.find(internal.id) is None, "Celery's own tasks keep Celery's path"


@pytest.mark.usefixtures("frozen_clock")  # the same instant for Celery's call and ours: the same eta
def test_a_parked_call_is_released_as_the_message_celery_sends_without_its_delay(
    adopting: tuple[Celery, RedisDelay], without: Celery, client: redis.Redis
) -> None:
    app, rd = adopting
    ours, theirs = plain_tasks(app), plain_tasks(without)
    queue = app.conf.task_default_queue
    call_id = f"released-{uuid.uuid4().hex}"
    ours["add"].apply_async((1, 2), task_id=call_id, countdown=0.01, headers={"tenant": "t1"}, priority=0)
    theirs["add"].apply_async((1, 2), task_id=call_id, countdown=0.01, headers={"tenant": "t1"}, priority=0)
    celerys = json.loads(client.rpop(queue))  # type: ignore[arg-type]
    wait = datetime.now(UTC) + timedelta(seconds=1)
    while rd.tick()["released"] == 0:
        assert datetime.now(UTC) < wait, "the parked call was not released"
    released = json.loads(client.rpop(queue))  # type: ignore[arg-type]
    assert released["headers"]["eta"] is None, "due when released: no worker holds it on its timer"
    assert released["headers"][ETA_HEADER] == celerys["headers"]["eta"], "Celery's eta, for the running task"
    assert comparable(released) == {**comparable(celerys), "headers": {**comparable(celerys)["headers"], "eta": False}}


def test_shared_tasks_of_every_app_with_the_setting_are_parked(make_app: MakeApp, queue: str) -> None:
    @shared_task(name="adopt.shared")
    def shared(x: int) -> int:
        return x

    app, rd = make_app(redisdelay_all_tasks=True, task_default_queue=queue)
    call = app.tasks["adopt.shared"].apply_async((1,), countdown=60)
    assert rd.find(call.id) is not None
    other, other_rd = make_app(task_default_queue=queue)
    call = other.tasks["adopt.shared"].apply_async((1,), countdown=60)
    assert other_rd.find(call.id) is None, "an app without the setting sends it as Celery does"


def test_without_the_setting_plain_tasks_are_celerys(make_app: MakeApp, client: redis.Redis, queue: str) -> None:
    app, rd = make_app(task_default_queue=queue)
    tasks = plain_tasks(app)
    call = tasks["add"].apply_async((1, 2), countdown=60)
    assert rd.find(call.id) is None
    assert client.llen(queue) == 1


def test_per_call_limits_apply_to_an_adopted_call(adopting: tuple[Celery, RedisDelay]) -> None:
    app, rd = adopting
    tasks = plain_tasks(app)
    call = tasks["add"].apply_async((1, 2), countdown=60, max_deliveries=3, visibility_timeout=90)
    found = rd.find(call.id)
    assert found is not None
    assert (found.meta["m"], found.meta["r"]) == (3, 90_000)
    keyed = [tasks["add"].apply_async((n, n), countdown=60, unique_key="daily") for n in range(3)]
    assert len({result.id for result in keyed}) == 1, "a unique key holds for a plain task's calls too"


def test_eager_mode_runs_adopted_calls_at_once(make_app: MakeApp, queue: str) -> None:
    app, rd = make_app(redisdelay_all_tasks=True, task_always_eager=True, task_default_queue=queue)
    tasks = plain_tasks(app)
    assert tasks["add"].apply_async((1, 2), countdown=60).get() == 3
    assert rd.stats()["delayed"] == 0


# -- on a real worker -----------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_worker_tracks_adopted_calls_and_parks_their_retries(redis_server: RedisServer) -> None:
    with pool_worker(redis_server, "prefork", redisdelay_all_tasks=True, redisdelay_precise_release=True) as run:
        key, retried, backed = f"{run.prefix}:adopted", f"{run.prefix}:retried", f"{run.prefix}:backoff"
        parked = run.task("plain.record").apply_async((key, "parked"), countdown=0.5)
        shared = run.task("shared.record").apply_async((key, "shared"), countdown=0.5)
        now = run.task("plain.record").apply_async((key, "now"))
        retrying = run.task("plain.retrying").apply_async((retried, 0.5))
        backoff = run.task("plain.autoretry").apply_async((backed, 2))
        wait_for(lambda: len(run.notes(key)) >= 3 and run.notes(retried) and run.notes(backed), 60, "five runs")
        wait_for(run.settled, 30, "every parked call to be acknowledged")
        notes = {note["id"]: note for name in (key, retried, backed) for note in run.notes(name)}
        assert len(notes) == 5
        assert notes[parked.id]["delivery"] == notes[shared.id]["delivery"] == 1, "tracked in flight"
        assert notes[now.id]["delivery"] == 1, "sent due now: tracked in flight (the default in the app mode)"
        assert notes[retrying.id]["delivery"] == 1, "the retry was parked, and tracked when it ran"
        assert (notes[retrying.id]["runs"], notes[backoff.id]["runs"]) == (2, 3), "each retry ran once"
        assert notes[backoff.id]["delivery"] == 1
        stats = run.rd.stats()
        assert stats["dead"] == 0


def celery_alone(run: Any) -> Celery:
    """A producer of the same tasks without the extension (another service, or the deploy before ours)."""
    app = Celery("alone", broker=run.conf["broker_url"], set_as_current=False)
    app.conf.task_default_queue = run.conf["task_default_queue"]
    return app


@pytest.mark.e2e
@pytest.mark.parametrize("setting", ["redisdelay_all_tasks", "redisdelay_park_received"])
def test_a_worker_parks_the_eta_messages_it_receives(redis_server: RedisServer, setting: str) -> None:
    with pool_worker(redis_server, "prefork", redisdelay_precise_release=True, **{setting: True}) as run:
        alone = celery_alone(run)
        key = f"{run.prefix}:received"
        later = alone.send_task("plain.record", (key, "later"), countdown=3)
        explicit = alone.send_task("pools.record", (key, "a delayed task's, sent by name"), countdown=3)
        near = alone.send_task("plain.record", (key, "near"), countdown=0.2)
        for call in (later, explicit):
            wait_for(lambda call=call: run.rd.find(call.id), 20, f"the worker to park {call.id}")
        broker = redis.Redis.from_url(run.conf["broker_url"])
        # Every message has left the queue: the two parked, and ``near`` held (or run) by the worker. On a busy
        # machine the worker may fetch ``near`` after it parked the other two.
        wait_for(lambda: broker.llen(run.conf["task_default_queue"]) == 0, 20, "the worker to fetch all three")
        held = {json.loads(raw)[0]["headers"]["id"] for raw in broker.hvals("unacked")}
        assert not held & {later.id, explicit.id}, "acknowledged: kombu's copy went with the park"
        assert run.rd.find(near.id) is None, "an eta nearer than redisdelay_park_received_after stays Celery's"
        wait_for(lambda: len(run.notes(key)) >= 3, 30, "three runs")
        wait_for(run.settled, 30, "the parked calls to be acknowledged")
        notes = {note["id"]: note for note in run.notes(key)}
        assert len(run.notes(key)) == 3 and set(notes) == {later.id, explicit.id, near.id}
        assert notes[later.id]["delivery"] == notes[explicit.id]["delivery"] == 1
        broker.close()
        alone.close()


# -- a received message, parked ---------------------------------------------------------------------------------


@contextlib.contextmanager
def received(app: Celery, queue: str) -> Iterator[Any]:
    """The next message of ``queue`` as a worker's consumer receives it, unacknowledged (kombu restores it
    when the block ends, unless it was taken meanwhile)."""
    got: list[Any] = []
    with (
        app.connection_for_read() as connection,
        Consumer(connection, [Queue(queue)], callbacks=[lambda _body, message: got.append(message)]),
    ):
        connection.drain_events(timeout=5)
        assert len(got) == 1
        yield got[0]


def test_a_received_eta_message_is_stored_as_the_call_celery_would_send_now(
    adopting: tuple[Celery, RedisDelay], without: Celery, client: redis.Redis
) -> None:
    from celery_redisdelay.message.received import envelope_of
    from celery_redisdelay.store.calls import CONFLICT, STORED
    from celery_redisdelay.worker.received import ReceivedParking

    app, rd = adopting
    ours, theirs = plain_tasks(app), plain_tasks(without)
    queue = app.conf.task_default_queue
    call_id = f"received-{uuid.uuid4().hex}"
    theirs["add"].apply_async((1, 2), task_id=call_id, countdown=60, headers={"tenant": "t1"}, expires=600)
    parking = ReceivedParking(rd.depot, rd.rules_of)
    rules = rd.rules_of(ours["add"])
    assert rules is not None
    with received(without, queue) as message:
        sent_eta = message.headers["eta"]
        # kombu's copy of this delivery (the hash is the server's: other tests' workers may hold their own)
        assert client.hexists("unacked", message.delivery_tag)
        due = parking.due_ms(message)
        assert due is not None
        assert parking.take(message, rules, due) == STORED
        assert not client.hexists("unacked", message.delivery_tag), "kombu's copy went in the same script"
        assert parking.take(message, rules, due) == CONFLICT, "taken twice, it is one call"
        message.ack()
    assert client.llen(queue) == 0
    found = rd.find(call_id)
    assert found is not None and found.state == "delayed" and found.score_ms == due

    # Released, it is the message Celery sends for the same call without a delay.
    theirs["add"].apply_async((1, 2), task_id=call_id, headers={"tenant": "t1"}, expires=600)
    celerys = json.loads(client.rpop(queue))  # type: ignore[arg-type]
    assert rd.reschedule(call_id, countdown=0) and rd.tick()["released"] == 1
    released = json.loads(client.rpop(queue))  # type: ignore[arg-type]
    assert released["headers"].pop(ETA_HEADER) == sent_eta is not None, "the eta the message came with"
    assert {**released["headers"], "expires": None} == {**celerys["headers"], "expires": None}
    assert released["headers"]["expires"] is not None
    assert released["body"] == celerys["body"]
    assert comparable(released)["properties"] == comparable(celerys)["properties"]

    # A broker that keeps no raw message (not a kombu virtual transport) gives the same envelope.
    theirs["add"].apply_async((1, 2), countdown=60, priority=5, headers={"tenant": "t1"})
    with received(without, queue) as message:
        by_raw = envelope_of(message)
        del message._raw
        assert envelope_of(message) == by_raw
    # kombu restored the unacknowledged message to its queue when the consumer closed: it comes again.
    assert parking.take(message, rules, due) == CONFLICT
    assert rd.find(message.headers["id"]) is None and len(broker_messages(client, queue)) == 1


def test_which_received_messages_are_parked(adopting: tuple[Celery, RedisDelay], without: Celery) -> None:
    from celery_redisdelay.worker.received import ReceivedParking

    app, rd = adopting
    theirs = plain_tasks(without)
    parking = ReceivedParking(rd.depot, rd.rules_of)
    queue = app.conf.task_default_queue
    cases = [
        ({"countdown": 60}, True),
        ({"countdown": 0.5}, False),  # nearer than redisdelay_park_received_after: Celery's
        ({}, False),  # no eta
        ({"countdown": 60, "expires": datetime.now(UTC) - timedelta(seconds=1)}, False),  # expired: Celery drops it
    ]
    for options, parked in cases:
        theirs["add"].apply_async((1, 2), **options)
        with received(without, queue) as message:
            assert (parking.due_ms(message) is not None) is parked, options
            message.ack()
    from celery.worker.state import revoked

    call = theirs["add"].apply_async((1, 2), countdown=60)
    revoked.add(call.id)
    try:
        with received(without, queue) as message:
            assert parking.due_ms(message) is None, "revoked in this worker: Celery drops it"
    finally:
        revoked.discard(call.id)
    assert rd.rules_of(app.tasks["celery.backend_cleanup"]) is None
    assert rd.rules_of(plain_tasks(app)["kept_out"]) is None


# -- redisdelay adopt: eta messages waiting in the queues ---------------------------------------------------------


def adopt_command(rd: RedisDelay, *args: str) -> dict[str, Any]:
    from click.testing import CliRunner

    from celery_redisdelay.cli import redisdelay

    result = CliRunner().invoke(redisdelay, ["adopt", *args, "--json"], obj=SimpleNamespace(app=rd.app))
    assert result.exit_code == 0, result.output
    loaded: dict[str, Any] = json.loads(result.stdout)
    return loaded


@pytest.mark.parametrize("store_apart", [False, True], ids=["store-is-broker", "store-apart"])
def test_adopt_moves_the_eta_messages_waiting_in_the_queues(
    make_app: MakeApp, redis_server: RedisServer, client: redis.Redis, queue: str, store_apart: bool
) -> None:
    conf: dict[str, Any] = {"redisdelay_all_tasks": True, "task_default_queue": queue}
    if store_apart:
        conf["redisdelay_url"] = f"{redis_server.url}/6"
    app, rd = make_app(**conf)
    assert rd.fast_release is not store_apart
    plain_tasks(app)
    alone = Celery("alone", broker=f"{redis_server.url}/0", set_as_current=False)
    alone.conf.task_default_queue = queue
    waiting = [alone.send_task("adopt.add", (n, n), countdown=600, priority=n % 2 * 5).id for n in range(7)]
    left = [
        alone.send_task("adopt.add", (1, 1)).id,  # no eta
        alone.send_task("adopt.add", (1, 1), countdown=0.5).id,  # due too soon to be worth parking
        alone.send_task("adopt.kept_out", (1,), countdown=600).id,  # opted out
        alone.send_task("another.service.task", (1,), countdown=600).id,  # not the app's
    ]
    alone.close()

    dry = adopt_command(rd, "--dry-run")
    assert (dry["examined"], dry["adopted"], dry["dry_run"]) == (11, 7, True)
    assert rd.stats()["delayed"] == 0 and len(broker_messages(client, queue)) == 11

    done = adopt_command(rd)
    assert (done["adopted"], done["known"], done["gone"], done["finished"]) == (7, 0, 0, True)
    assert all(rd.find(call_id) is not None for call_id in waiting)
    assert sorted(message["headers"]["id"] for message in broker_messages(client, queue)) == sorted(left)
    assert adopt_command(rd)["adopted"] == 0, "nothing left to move"


def test_adopt_needs_a_redis_broker(make_app: MakeApp, redis_server: RedisServer) -> None:
    from click.testing import CliRunner

    from celery_redisdelay.cli import redisdelay

    _, rd = make_app(broker_url="memory://", redisdelay_url=f"{redis_server.url}/0")
    result = CliRunner().invoke(redisdelay, ["adopt"], obj=SimpleNamespace(app=rd.app))
    assert result.exit_code == 1
    assert "adopt reads the queues of a Redis broker" in result.output


@pytest.mark.e2e
@pytest.mark.slow  # the same path as the worker tests above, at scale
def test_ten_thousand_eta_messages_from_a_producer_without_the_extension(redis_server: RedisServer) -> None:
    # A service without the extension sends 10,000 calls with countdowns of 10 to 30 s. The worker parks them as
    # they arrive and holds nothing; it is SIGKILLed once half are parked, and a new one takes over. Every call
    # runs once, after its eta, but for a run the kill cut short, a dead letter by the task's contract (it
    # acknowledges early; tests/test_contract.py): kombu gives back what the killed worker held unacknowledged
    # (after the broker's visibility timeout, 15 s here), and the store takes each message once.
    count = 10_000
    with pool_worker(
        redis_server,
        "prefork",
        redisdelay_all_tasks=True,
        redisdelay_precise_release=True,
        broker_transport_options={"visibility_timeout": 15},
    ) as run:
        alone = celery_alone(run)
        key = f"{run.prefix}:many"
        record = alone.signature("plain.record")
        before = run.rss_bytes()
        etas: dict[str, float] = {}
        killed_at = count // 2
        rss_at_kill = 0
        killed_ms = 0.0

        def parked() -> int:
            # Parked so far: still parked, released and not acknowledged, or run (the first are due after
            # 10 s, so on a slow machine some leave the delay set before the last of the half is parked).
            stats = run.rd.stats()
            return int(stats["delayed"] + stats["inflight"] + run.marks.llen(key))

        for n in range(count):
            countdown = 10 + n % 21
            # Celery reads its clock inside apply_async, so the call's eta is no earlier than this clock's plus
            # the countdown: read after the call, a stall of the sender would move the bound past the real eta.
            sent_ms = time.time() * 1000
            call = record.clone(args=(key, n)).apply_async(countdown=countdown)
            etas[call.id] = sent_ms + countdown * 1000
            if n == killed_at:
                wait_for(lambda: parked() >= killed_at, 60, f"{killed_at} calls to be parked")
                rss_at_kill = run.rss_bytes()
                killed_ms = time.time() * 1000 + 1000  # the notes' clock: the kill's, give or take a second
                run.restart_after_kill()
        alone.close()

        # Counted by id, not by runs: a call the kill caught runs twice, so the runs can reach the count while a
        # message the killed worker held still waits for kombu to give it back (the visibility timeout, then
        # kombu's next restore pass, every 10 s).
        def missing() -> set[str]:
            return set(etas) - {note["id"] for note in run.notes(key)} - cut_short()

        def cut_short() -> set[str]:
            # A run the SIGKILL cut short (plain.record acknowledges early) is a dead letter, not run again.
            dead = run.rd.dead_letters(limit=1000)
            return {entry.id for entry in dead if str(entry.meta.get("why", "")).startswith("worker lost:")}

        wait_for(lambda: not missing(), 180, f"{count} calls to run", interval=1)
        wait_for(run.settled, 60, "every call to be acknowledged")
        notes = run.notes(key)
        assert not missing() and {note["id"] for note in notes} <= set(etas), f"lost: {sorted(missing())[:5]}"
        first: dict[str, float] = {}
        for note in notes:
            first.setdefault(note["id"], note["at_ms"])
        # A "worker lost" dead letter is a run the kill cut short in its body (one per pool process at most), or a run
        # that ended just before the kill, its acknowledgement still in the worker's outbox (it wrote its note).
        dead = cut_short()
        assert len(dead - set(first)) <= 2, "no more runs cut short than the killed worker had pool processes"
        assert all(first[call_id] <= killed_ms for call_id in dead & set(first)), "a dead letter the kill did not make"
        assert run.rd.stats()["dead"] == len(dead), "no other dead letter"
        # A call runs twice only if the SIGKILL caught its first run or the acknowledgement of it: on a slow machine
        # the first calls fall due (10 s) before the last of the half is parked.
        twice = {note["id"] for note in notes if note["at_ms"] > first[note["id"]]}
        assert all(first[call_id] <= killed_ms for call_id in twice), "a call ran twice that the kill did not catch"
        # Before the eta its message carries, or before the earliest eta its sending allows.
        early = [
            note
            for note in notes
            if note["at_ms"] < datetime.fromisoformat(note["eta"]).timestamp() * 1000 - 1000
            or note["at_ms"] < etas[note["id"]] - 1000
        ]
        assert early == [], f"a call ran before its eta: {[(note, etas[note['id']]) for note in early]}"
        assert rss_at_kill - before < 15 * 1024 * 1024, f"the worker grew by {(rss_at_kill - before) / 2**20:.1f} MB"
