"""``redisdelay_track_due_now``: in the app mode, a plain task's call due now goes through the store, in flight and
pushed onto its queue in one script, and is tracked from there as a released call. Against a real redis-server,
compared with the same calls of an app without the extension, and on real workers."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from celery import Celery, shared_task

from celery_redisdelay import RedisDelay
from celery_redisdelay.errors import ConfigurationError, PayloadError, StoreUnavailableError
from celery_redisdelay.testing import RedisServer, wait_for
from tests.pool_run import pool_worker
from tests.test_adoption import broker_messages, comparable, plain_tasks
from tests.test_chaos import LosingReplies, losing_replies

MakeApp = Callable[..., tuple[Celery, RedisDelay]]
TRACKING = {"redisdelay_all_tasks": True, "redisdelay_track_due_now": True}


@pytest.fixture
def queue() -> str:
    return f"track-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def tracking(make_app: MakeApp, queue: str) -> tuple[Celery, RedisDelay]:
    return make_app(task_default_queue=queue, **TRACKING)


def tag(message: dict[str, Any]) -> str:
    return str(message["properties"]["delivery_tag"])


@pytest.mark.usefixtures("frozen_clock")  # the same instant for Celery's call and ours: the same expiry
def test_calls_due_now_are_in_flight_and_queued_as_celery_sends_them(
    tracking: tuple[Celery, RedisDelay], without: Celery, client: redis.Redis
) -> None:
    app, rd = tracking
    ours, theirs = plain_tasks(app), plain_tasks(without)
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("add", (1, 2), {}),
        ("add", (3, 4), {}),  # the second call of a kind leaves a template ...
        ("add", (5, 6), {}),  # ... and the next ones are rendered from it, without Celery
        ("add", ([7], {"x": 1}), {}),
        ("add", (3, 4), {"countdown": 0}),
        ("add", (5, 6), {"priority": 3}),
        ("add", (7, 8), {"expires": 600, "headers": {"tenant": "t1"}}),
        ("report", ("sunday",), {"link": theirs["add"].s(1)}),
    ]
    for name, args, options in calls:
        call_id = f"same-{uuid.uuid4().hex}"
        ours[name].apply_async(args, task_id=call_id, **options)
        theirs[name].apply_async(args, task_id=call_id, **options)
        found = rd.find(call_id)
        assert found is not None and found.state == "inflight", (name, options, found)
        assert found.meta["s"] == "queued" and found.meta["d"] == 1
    by_id: dict[str, list[dict[str, Any]]] = {}
    for message in broker_messages(client, app.conf.task_default_queue):
        by_id.setdefault(message["headers"]["id"], []).append(message)
    assert len(by_id) == len(calls)
    for call_id, pair in by_id.items():
        assert len(pair) == 2 and comparable(pair[0]) == comparable(pair[1]), pair
        assert f"{call_id}.1" in {tag(m) for m in pair}, "ours carries the store's first delivery tag"
    assert rd.stats()["inflight"] == len(calls) and rd.stats()["delayed"] == 0


def test_every_way_of_calling_a_task_due_now_is_tracked(
    make_app: MakeApp, queue: str, client: redis.Redis, redis_server: RedisServer
) -> None:
    @shared_task(name="track.shared")
    def shared(x: int) -> int:
        return x

    app, rd = make_app(task_default_queue=queue, **TRACKING)
    tasks = plain_tasks(app)
    with app.connection_for_write() as connection:
        ids = [
            tasks["add"].delay(1, 2).id,
            tasks["add"].s(1, 2).delay().id,
            app.send_task("adopt.add", (1, 2)).id,
            app.tasks["track.shared"].delay(1).id,
            tasks["add"].apply_async((1, 2), connection=connection).id,
        ]
        with app.producer_or_acquire() as producer:
            ids.append(tasks["add"].apply_async((1, 2), producer=producer).id)
    for call_id in ids:
        found = rd.find(call_id)
        assert found is not None and found.state == "inflight", call_id
    queued = {m["headers"]["id"]: tag(m) for m in broker_messages(client, queue)}
    assert queued == {call_id: f"{call_id}.1" for call_id in ids}


def test_a_task_or_a_call_opts_out_and_keeps_celerys_path(make_app: MakeApp, queue: str, client: redis.Redis) -> None:
    app, rd = make_app(task_default_queue=queue, **TRACKING)
    tasks = plain_tasks(app)

    @app.task(name="track.untracked", redisdelay_track=False, shared=False)
    def untracked() -> None: ...

    kept_out = [
        untracked.delay().id,
        tasks["add"].apply_async((1, 2), redisdelay_track=False).id,
        tasks["kept_out"].delay(1).id,
        app.tasks["celery.backend_cleanup"].delay().id,
    ]
    for call_id in kept_out:
        assert rd.find(call_id) is None, call_id
    messages = broker_messages(client, queue)
    assert {m["headers"]["id"] for m in messages} == set(kept_out)
    assert all("redisdelay" not in key for m in messages for key in m["properties"]), "the option is ours alone"
    # A delayed call of the task that opts out of tracking is still parked.
    assert rd.find(untracked.apply_async(countdown=60).id) is not None


def test_the_app_mode_tracks_calls_due_now_by_default(make_app: MakeApp, queue: str, client: redis.Redis) -> None:
    app, rd = make_app(task_default_queue=queue, redisdelay_all_tasks=True)
    assert app.conf.get("redisdelay_track_due_now") is None, "the default, not the test's own setting"
    call = plain_tasks(app)["add"].delay(1, 2)
    found = rd.find(call.id)
    assert found is not None and found.state == "inflight"
    assert client.llen(queue) == 1


def test_set_false_or_without_the_app_mode_calls_due_now_are_celerys(
    make_app: MakeApp, queue: str, client: redis.Redis
) -> None:
    for conf in (
        {"redisdelay_all_tasks": True, "redisdelay_track_due_now": False},
        {"redisdelay_track_due_now": True},
        {},
    ):
        app, rd = make_app(task_default_queue=queue, **conf)
        call = plain_tasks(app)["add"].delay(1, 2)
        assert rd.find(call.id) is None, conf
    assert client.llen(queue) == 3


def test_by_default_a_broker_that_is_not_the_stores_redis_keeps_celerys_path_without_a_warning(
    make_app: MakeApp, redis_server: RedisServer, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    app, rd = make_app(task_default_queue=queue, redisdelay_url=f"{redis_server.url}/4", redisdelay_all_tasks=True)
    with caplog.at_level("WARNING", logger="celery_redisdelay"):
        call = plain_tasks(app)["add"].delay(1, 2)
    assert rd.find(call.id) is None
    assert "redisdelay_track_due_now" not in caplog.text


@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_the_setting_refuses_what_is_not_a_bool(make_app: MakeApp, value: object) -> None:
    app, _ = make_app(redisdelay_all_tasks=True, redisdelay_track_due_now=value)
    with pytest.raises(ConfigurationError, match="redisdelay_track_due_now must be True or False"):
        plain_tasks(app)["add"].delay(1, 2)


def test_a_message_too_big_fails_at_the_call_and_nothing_is_written(
    make_app: MakeApp, queue: str, client: redis.Redis
) -> None:
    app, rd = make_app(task_default_queue=queue, redisdelay_max_payload_bytes=1000, **TRACKING)
    with pytest.raises(PayloadError, match="redisdelay_max_payload_bytes"):
        plain_tasks(app)["add"].delay("x" * 2000, 1)
    assert client.llen(queue) == 0
    assert rd.stats()["inflight"] == 0


def test_a_store_that_is_down_fails_the_call_as_a_publish_would(queue: str) -> None:
    """The store is the broker here (tracking needs it): the call fails with our error naming what failed; the
    script that would have written it is one step, so nothing of it is written."""
    with RedisServer() as server:
        app = Celery("down", broker=f"{server.url}/0", set_as_current=False)
        app.conf.update(task_default_queue=queue, **TRACKING)
        RedisDelay(app)
        add = plain_tasks(app)["add"]
        add.delay(1, 2)  # the scripts are loaded, the tracking decided
        server.terminate()
        with pytest.raises(StoreUnavailableError, match="send call"):
            add.delay(3, 4)
        app.close()


@pytest.mark.parametrize("drops", [1, 2], ids=["the-direct-path-tries-again", "redis-py-retries-too"])
def test_a_send_whose_reply_was_lost_queues_one_message(
    make_app: MakeApp, queue: str, client: redis.Redis, drops: int
) -> None:
    """The send lands, its reply is dropped (a CLIENT KILL mid-call), the client sends it again: one message is
    queued and the call counted once, as a park is (the battle saw such a call run twice, 30-200 ms apart)."""
    app, rd = make_app(
        task_default_queue=queue,
        redisdelay_connection_options=losing_replies(),
        **TRACKING,
    )
    add = plain_tasks(app)["add"]
    unlucky = str(uuid.uuid4())
    LosingReplies.armed[unlucky] = drops
    try:
        ids = [add.apply_async((n, n), **({"task_id": unlucky} if n == 2 else {})).id for n in range(5)]
        assert LosingReplies.dropped.count(unlucky) == drops, "the send's reply was lost"
        queued = [message["headers"]["id"] for message in broker_messages(client, queue)]
        assert sorted(queued) == sorted(ids), "one message of each call"
        counters = {k.decode(): int(v) for k, v in client.hgetall(rd.depot.keys.counters).items()}
        assert counters["parked"] == 5 and counters["released"] == 5, counters
    finally:
        LosingReplies.armed.pop(unlucky, None)


def test_a_paused_send_whose_reply_was_lost_is_set_aside_once(
    make_app: MakeApp, queue: str, client: redis.Redis
) -> None:
    """The same, on a pause: the send is set aside on the pause, its reply is lost, the client sends it again. The
    call waits once, counted once, and goes out once on resume."""
    app, rd = make_app(
        task_default_queue=queue,
        redisdelay_connection_options=losing_replies(),
        **TRACKING,
    )
    add = plain_tasks(app)["add"]
    rd.pause(task=add.name)
    unlucky = str(uuid.uuid4())
    LosingReplies.armed[unlucky] = 1
    try:
        add.apply_async((1, 2), task_id=unlucky)
        assert LosingReplies.dropped.count(unlucky) == 1, "the send's reply was lost"
    finally:
        LosingReplies.armed.pop(unlucky, None)
    assert client.zcard(rd.depot.keys.paused) == 1, "set aside once"
    assert [pause["waiting"] for pause in rd.paused()] == [1]
    assert int(client.hget(rd.depot.keys.counters, "parked")) == 1
    assert rd.resume(task=add.name)
    rd.tick()
    assert [message["headers"]["id"] for message in broker_messages(client, queue)] == [unlucky]


def test_a_tracked_call_runs_once_and_is_acknowledged(redis_server: RedisServer) -> None:
    """On prefork: at kombu 5.3.0, the lowest version we declare, a threads pool worker takes its messages in bursts
    5-10 s apart once it has drained its queue, with or without the extension (tests/test_pools.py covers every
    pool, e2e)."""
    with pool_worker(redis_server, "prefork", concurrency=2, **TRACKING) as run:
        key = f"{run.prefix}:runs"
        ids = [run.task("plain.record").delay(key, n).id for n in range(20)]
        wait_for(lambda: len(run.notes(key)) >= 20, 30, "the calls to run")
        wait_for(run.settled, 30, "every call to be acknowledged")
        notes = run.notes(key)
        assert sorted(n["id"] for n in notes) == sorted(ids), "each ran once"
        assert {n["delivery"] for n in notes} == {1}, "the store knew each call while it ran"


def test_the_history_counts_a_tracked_call_as_parked_and_released(
    tracking: tuple[Celery, RedisDelay], client: redis.Redis
) -> None:
    app, rd = tracking
    plain_tasks(app)["add"].delay(1, 2)
    counters = {k.decode(): int(v) for k, v in client.hgetall(rd.depot.keys.counters).items()}
    assert counters["parked"] == 1 and counters["released"] == 1 and counters["late_le_5"] == 1, counters


def test_a_tracked_call_of_a_task_the_worker_does_not_know_is_dead_lettered(redis_server: RedisServer) -> None:
    """Celery discards it with its own error, as without the extension; the store does not keep it for ever."""
    with pool_worker(redis_server, "threads", concurrency=2, **TRACKING) as run:

        @run.app.task(name="only.in.the.producer", shared=False)
        def unknown() -> None: ...

        call = unknown.delay()
        assert run.rd.find(call.id) is not None
        wait_for(lambda: getattr(run.rd.find(call.id), "state", None) == "dead", 30, "the call to be dead-lettered")
        found = run.rd.find(call.id)
        assert found is not None and "not registered" in str(found.meta.get("why")), found
        wait_for(lambda: "Received unregistered task" in run.worker.output(), 30, "Celery's own error")


def test_a_tracked_call_that_expired_is_discarded_and_counted(redis_server: RedisServer) -> None:
    with pool_worker(redis_server, "threads", concurrency=2, **TRACKING) as run:
        key = f"{run.prefix}:runs"
        record = run.task("plain.record")
        gone = record.apply_async((key, "expired"), expires=datetime.now(UTC) - timedelta(seconds=1))
        kept = record.apply_async((key, "kept"), expires=600)
        wait_for(lambda: len(run.notes(key)) >= 1, 30, "the call that has not expired to run")
        wait_for(run.settled, 30, "both calls to be forgotten")
        assert [n["id"] for n in run.notes(key)] == [kept.id]
        counters = run.rd.client.hgetall(run.rd.depot.keys.counters)
        assert int(counters[b"expired"]) == 1 and int(counters[b"acked"]) == 1, counters
        assert gone.id not in {n["id"] for n in run.notes(key)}


@pytest.mark.parametrize("options", [{}, {"countdown": 60}], ids=["due now, tracked", "parked"])
def test_the_result_backend_stays_subscribed_to_the_calls_result(
    make_app: MakeApp, redis_server: RedisServer, queue: str, client: redis.Redis, options: dict[str, Any]
) -> None:
    """As Celery's own send_task leaves it (its integration suite checks it): the Redis result backend listens on
    the result's channel from the call on, for the call built by Celery and for those rendered from its template."""
    app, _ = make_app(task_default_queue=queue, result_backend=f"{redis_server.url}/1", **TRACKING)
    add = plain_tasks(app)["add"]
    for _ in range(3):
        result = add.apply_async((1, 2), **options)
        channels = {channel.decode() for channel in client.pubsub_channels()}
        assert f"celery-task-meta-{result.id}" in channels, "the subscription Celery made at the call was dropped"
        result.forget()


def test_where_the_broker_is_not_the_stores_redis_calls_due_now_keep_celerys_path(
    make_app: MakeApp, redis_server: RedisServer, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The one script cannot push onto a broker it does not hold: the call goes as Celery sends it, untracked,
    with a warning (parking it due now would add a release's delay to every call)."""
    app, rd = make_app(task_default_queue=queue, redisdelay_url=f"{redis_server.url}/4", **TRACKING)
    with caplog.at_level("WARNING", logger="celery_redisdelay"):
        call = plain_tasks(app)["add"].delay(1, 2)
    assert rd.find(call.id) is None
    assert "redisdelay_track_due_now has no effect" in caplog.text
    broker = redis.Redis.from_url(f"{redis_server.url}/0")
    assert [json.loads(raw)["headers"]["id"] for raw in broker.lrange(queue, 0, -1)] == [call.id]
    broker.close()
