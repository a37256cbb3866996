"""A delayed task behaves as the same task without the extension: the Redis-level half.

What needs a worker (revoke, expiry, retries, canvas, time limits, lost processes, events) is in
``test_conformance.py``; here are the calls, the stored messages and the errors.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import celery
import pytest
import redis
from celery import Celery
from celery.exceptions import TaskRevokedError
from kombu import Exchange, Queue

from celery_redisdelay import ConfigurationError, RedisDelay, RedisDelayError
from celery_redisdelay.message.envelope import Envelope
from celery_redisdelay.message.marks import ETA_HEADER
from celery_redisdelay.message.stored import decode_stored
from celery_redisdelay.message.wire import PREFIX
from celery_redisdelay.operations import admin
from celery_redisdelay.store.calls import CANCEL_MEMORY_MS
from celery_redisdelay.worker.tracking import drop_revoked
from tests.test_chaos import LosingReplies, losing_replies

MakeApp = Callable[..., tuple[Celery, RedisDelay]]


def echo_on(rd: RedisDelay, name: str = "tests.fidelity.echo") -> Any:
    @rd.delayed(name=name)
    def echo(*args: Any, **kwargs: Any) -> Any: ...

    return echo


def with_backend(make_app: MakeApp, redis_server: Any, **conf: Any) -> tuple[Celery, RedisDelay]:
    return make_app(result_backend=f"{redis_server.url}/6", **conf)


# -- configuration ------------------------------------------------------------------------------------


def test_task_message_protocol_1_is_refused_when_the_extension_is_bound(redis_server: Any) -> None:
    app = Celery("p1", broker=f"{redis_server.url}/0", set_as_current=False)
    app.conf.task_protocol = 1
    with pytest.raises(ConfigurationError, match=r"task_protocol = 1: celery-redisdelay needs .* protocol 2"):
        RedisDelay(app)


def test_task_message_protocol_1_configured_later_is_refused_at_the_first_park(redis_server: Any) -> None:
    app = Celery("p1-later", broker=f"{redis_server.url}/0", set_as_current=False)
    rd = RedisDelay(app)  # not configured yet: nothing to check
    app.conf.task_protocol = 1
    with pytest.raises(ConfigurationError, match="task_protocol"):
        echo_on(rd).apply_async((1,), countdown=10)


def test_a_plain_tasks_calls_under_protocol_1_configured_later_are_celerys_in_the_app_mode(redis_server: Any) -> None:
    """Celery's ``t/integration/test_group_chains.py`` sets ``task_protocol = 1`` on a running app: its plain tasks'
    calls, due now or with a countdown, are sent as Celery sends them (protocol 1 cannot be stored), not refused."""
    queue = f"p1-{uuid.uuid4().hex[:8]}"
    messages: dict[str, list[dict[str, Any]]] = {}
    client = redis.Redis.from_url(f"{redis_server.url}/0")
    for mode in ("without", "app"):
        app = Celery(f"p1-{mode}", broker=f"{redis_server.url}/0", set_as_current=False)
        app.conf.update(task_default_queue=f"{queue}-{mode}", redisdelay_all_tasks=True)
        rd = RedisDelay(app) if mode == "app" else None
        app.conf.task_protocol = 1

        @app.task(name="tests.fidelity.p1", shared=False)
        def p1(*args: Any) -> None: ...

        p1.apply_async((1,), task_id="due-now")
        p1.apply_async((2,), task_id="later", countdown=60)
        raw = reversed(client.lrange(f"{queue}-{mode}", 0, -1))
        messages[mode] = [json.loads(base64.b64decode(json.loads(one)["body"])) for one in raw]
        if rd is not None:  # nothing stored (rd.stats() refuses protocol 1, as a delayed task's call does)
            assert [key for key in client.keys("*") if key.startswith(b"redisdelay")] == []
        app.close()
    for message in (*messages["without"], *messages["app"]):
        assert message.pop("eta", None) is None or message["id"] == "later"  # computed from the clock at the call
    assert messages["app"] == messages["without"] and [m["id"] for m in messages["app"]] == ["due-now", "later"]
    client.close()


@pytest.mark.parametrize("method", ["cancel", "find", "requeue", "reschedule"])
@pytest.mark.parametrize("bad", [None, 42, b"bytes-id"])
def test_an_id_that_is_not_a_string_is_a_type_error_naming_it(rd: RedisDelay, method: str, bad: Any) -> None:
    call: Callable[..., Any] = getattr(rd, method)
    extra = {"countdown": 1} if method == "reschedule" else {}
    with pytest.raises(TypeError, match=r"task_id must be a string \(a Celery task id\), not"):
        call(bad, **extra)


# -- the task class ---------------------------------------------------------------------------------


class AppWide(celery.Task):  # type: ignore[misc]
    """An app-wide base task class (``Celery(task_cls=...)``), as Django's fixup sets DjangoTask."""

    def tenant(self) -> str:
        return "acme"


def test_delayed_tasks_derive_from_the_apps_own_task_class(redis_server: Any) -> None:
    app = Celery("wide", broker=f"{redis_server.url}/0", task_cls=AppWide, set_as_current=False)
    app.conf.redisdelay_key_prefix = f"wide-{uuid.uuid4().hex[:8]}"
    rd = RedisDelay(app)

    @app.task
    def plain() -> None: ...

    @rd.delayed
    def delayed() -> None: ...

    @rd.batched(size=2)
    def batched(key: str, items: list[Any]) -> None: ...

    for task in (plain, delayed, batched):
        assert isinstance(task, AppWide) and task.tenant() == "acme"
    assert isinstance(delayed, rd.Task) and isinstance(batched, rd.BatchedTask)
    assert rd.find(delayed.apply_async(countdown=30).id) is not None
    app.close()


# -- send_task ------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("frozen_clock")  # the same instant for Celery's call and ours: the same eta
def test_send_task_by_name_parks_a_delayed_task_of_this_app(make_app: MakeApp, client: redis.Redis) -> None:
    app, rd = make_app()
    echo_on(rd)

    @app.task(name="tests.fidelity.plain", shared=False)
    def plain(x: int) -> None: ...

    queue = app.conf.task_default_queue
    parked = app.send_task("tests.fidelity.echo", args=(1,), kwargs={"k": "v"}, countdown=60, task_id="by-name")
    assert parked.id == "by-name"
    entry = rd.find("by-name")
    assert entry is not None and entry.state == "delayed" and entry.envelope is not None
    assert client.llen(queue) == 0, "nothing reached the broker"
    # The message is the one Celery's own send_task builds (published at once here, for comparison), its
    # eta kept for the running task in a private header: the worker does not hold it on its timer.
    rd.celery_send_task("tests.fidelity.echo", args=(1,), kwargs={"k": "v"}, countdown=60, task_id="by-celery")
    celery_message = json.loads(client.rpop(queue))  # type: ignore[arg-type]
    ours = decode_stored(entry.envelope)
    assert ours.body == base64.b64decode(celery_message["body"])
    volatile = ("id", "root_id")
    assert ours.headers["eta"] is None and ours.headers[ETA_HEADER] == celery_message["headers"]["eta"] is not None
    ours_as_celery = {**{k: v for k, v in ours.headers.items() if k != ETA_HEADER}, "eta": ours.headers[ETA_HEADER]}
    assert {k: v for k, v in ours_as_celery.items() if k not in volatile} == {
        k: v for k, v in celery_message["headers"].items() if k not in volatile
    }
    app.send_task("tests.fidelity.plain", args=(2,), countdown=60)  # not a delayed task: Celery's own
    assert client.llen(queue) == 1
    app.send_task("no.such.task", args=(3,))
    assert client.llen(queue) == 2


def test_send_task_by_name_parks_a_call_of_a_task_of_the_extensions_class(
    make_app: MakeApp, client: redis.Redis
) -> None:
    """``app.Task = rd.Task`` (the celery-suite's delayed mode) makes every task of the app a delayed task: a call by
    name parks as its ``apply_async`` does, once the app is finalized (its tasks are made then)."""
    app, rd = make_app()
    app.Task = rd.Task

    @app.task(name="tests.fidelity.of_the_class", shared=False)
    def of_the_class(x: int) -> None: ...

    app.finalize()
    assert isinstance(app.tasks["tests.fidelity.of_the_class"], rd.Task)
    result = app.send_task("tests.fidelity.of_the_class", args=(3,))
    entry = rd.find(result.id)
    assert entry is not None and entry.state == "delayed", "a delayed task's call waits in Redis"
    assert client.llen(app.conf.task_default_queue) == 0, "nothing reached the broker"
    # The tick is of the class too, but beat sends it by name and only it releases: it goes to the broker.
    assert isinstance(app.tasks["redisdelay.tick"], rd.Task)
    tick = app.send_task("redisdelay.tick")
    assert rd.find(tick.id) is None and client.llen(app.conf.task_default_queue) == 1


# -- park_many ------------------------------------------------------------------------------------------


def test_park_many_keeps_the_callers_argsrepr_and_computes_celerys_otherwise(rd: RedisDelay) -> None:
    echo = echo_on(rd)
    calls = [("it's",), ('a "quoted"\nline',), (1.5, None)]
    hidden = echo.park_many(calls, countdown=60, argsrepr="(secret)")
    for result in hidden:
        assert decode_stored(rd.find(result.id).envelope).headers["argsrepr"] == "(secret)"  # type: ignore[union-attr,arg-type]
    shown = echo.park_many(calls, countdown=60)
    one_by_one = [echo.apply_async(args, countdown=60) for args in calls]
    for bulk, single in zip(shown, one_by_one, strict=True):
        expected = decode_stored(rd.find(single.id).envelope).headers["argsrepr"]  # type: ignore[union-attr,arg-type]
        assert decode_stored(rd.find(bulk.id).envelope).headers["argsrepr"] == expected  # type: ignore[union-attr,arg-type]


# -- routing that only kombu can do ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queue", "options"),
    [
        (
            Queue("q-named", Exchange("x-named", type="direct"), routing_key="rk"),
            {"exchange": "x-named", "routing_key": "rk"},
        ),
        (Queue("q-expiring", expires=60), {"queue": "q-expiring"}),
        (Queue("q-x-expires", queue_arguments={"x-expires": 60000}), {"queue": "q-x-expires"}),
    ],
    ids=["named exchange", "queue expires", "x-expires"],
)
def test_routing_that_depends_on_the_broker_takes_kombus_path(
    make_app: MakeApp, queue: Queue, options: dict[str, Any]
) -> None:
    _, rd = make_app(task_queues=[queue, Queue("q-default")], task_default_queue="q-default")
    echo = echo_on(rd)
    plain = echo.apply_async((1,), countdown=60, queue="q-default")
    routed = echo.apply_async((1,), countdown=60, **options)
    assert rd.find(plain.id).envelope.startswith(PREFIX)  # type: ignore[union-attr]
    assert not rd.find(routed.id).envelope.startswith(PREFIX)  # type: ignore[union-attr]


# -- cancel and revoke -----------------------------------------------------------------------------------


def test_cancel_marks_the_result_revoked(make_app: MakeApp, redis_server: Any) -> None:
    _, rd = with_backend(make_app, redis_server)
    result = echo_on(rd).apply_async((1,), countdown=60)
    assert result.state == "PENDING"
    assert rd.cancel(result.id) is True
    assert result.state == "REVOKED"
    with pytest.raises(TaskRevokedError):
        result.get(timeout=5)
    assert rd.cancel(result.id) is False
    assert int(rd.client.hget(rd.keys.counters, "cancelled")) == 1


@pytest.mark.parametrize("drops", [1, 2], ids=["the-direct-path-tries-again", "redis-py-retries-too"])
def test_a_cancel_whose_reply_was_lost_answers_true_and_records_the_call_revoked(
    make_app: MakeApp, redis_server: Any, drops: int
) -> None:
    """The cancel lands, its reply is dropped (a CLIENT KILL mid-call), the client sends it again: the answer is
    the first attempt's, and the call is recorded revoked, which only the first attempt's caller could have done
    (the battle saw a lost reply answer False, and the result stay PENDING)."""
    _, rd = with_backend(
        make_app,
        redis_server,
        redisdelay_connection_options=losing_replies(),
    )
    result = echo_on(rd).apply_async((1,), countdown=60)
    LosingReplies.armed[result.id] = drops
    try:
        assert rd.cancel(result.id) is True
        assert LosingReplies.dropped.count(result.id) == drops, "the cancel's reply was lost"
    finally:
        LosingReplies.armed.pop(result.id, None)
    assert result.state == "REVOKED"
    assert int(rd.client.hget(rd.keys.counters, "cancelled")) == 1
    assert rd.client.hlen(rd.keys.unrecorded) == 0, "recorded revoked: a cancel again leaves it be"
    assert rd.find(result.id) is None


def test_a_cancel_that_failed_for_its_caller_is_answered_and_recorded_when_sent_again(
    make_app: MakeApp, redis_server: Any
) -> None:
    """With no retry left, the caller sees the store error though the cancel landed; the caller's own retry gets
    True and records the call revoked. A cancel after that answers False, as for any call no longer parked, and
    records nothing."""
    _, rd = with_backend(
        make_app,
        redis_server,
        redisdelay_connection_options=losing_replies(0),
    )
    result = echo_on(rd).apply_async((1,), countdown=60)
    LosingReplies.armed[result.id] = 10
    try:
        with pytest.raises(RedisDelayError):
            rd.cancel(result.id)
    finally:
        LosingReplies.armed.pop(result.id, None)
    assert rd.find(result.id) is None, "the cancel landed"
    assert result.state == "PENDING", "no caller recorded it revoked"
    assert rd.client.hlen(rd.keys.unrecorded) == 1
    assert rd.cancel(result.id) is True
    assert result.state == "REVOKED"
    assert rd.client.hlen(rd.keys.unrecorded) == 0
    rd.app.backend.forget(result.id)
    assert rd.cancel(result.id) is False
    assert rd.app.AsyncResult(result.id).state == "PENDING", "the later cancel recorded nothing"
    assert int(rd.client.hget(rd.keys.counters, "cancelled")) == 1


def test_a_cancel_is_remembered_for_ten_minutes(make_app: MakeApp) -> None:
    """Forgotten after CANCEL_MEMORY_MS: the store's memory of cancels expires with the last one, and older
    cancels are trimmed by the next, even one whose caller never recorded it revoked."""
    _, rd = make_app()
    echo = echo_on(rd)
    old, new = echo.apply_async((1,), countdown=60), echo.apply_async((2,), countdown=60)
    assert rd.cancel(old.id) is True
    ttl = rd.client.pttl(rd.keys.cancelled)
    assert CANCEL_MEMORY_MS - 60_000 < ttl <= CANCEL_MEMORY_MS
    rd.client.hset(rd.keys.unrecorded, old.id, b"")  # as if its caller never heard the answer
    rd.client.zadd(rd.keys.cancelled, {old.id: 1})  # and it was cancelled at the epoch
    assert rd.cancel(new.id) is True
    assert rd.client.zrange(rd.keys.cancelled, 0, -1) == [new.id.encode()], "the old cancel was trimmed"
    assert rd.client.hkeys(rd.keys.unrecorded) == [], "with what its caller did not record"
    assert rd.cancel(old.id) is False


def test_a_compressed_call_is_read_as_a_worker_reads_it_and_a_broken_one_still_cancels(
    make_app: MakeApp, redis_server: Any
) -> None:
    _, rd = with_backend(make_app, redis_server)
    echo = echo_on(rd)
    readable = echo.apply_async((1, "two"), countdown=60, compression="zlib")
    shown = admin.describe(rd.depot, readable.id)
    assert shown is not None and (shown["payload"]["args"], shown["payload"].get("note")) == ([1, "two"], None)

    broken = echo.apply_async((3,), countdown=60, compression="zlib")
    envelope = decode_stored(rd.client.hget(rd.keys.payloads, broken.id))
    assert isinstance(envelope, Envelope)
    rd.client.hset(rd.keys.payloads, broken.id, replace(envelope, body=b"not zlib at all").encode())
    shown = admin.describe(rd.depot, broken.id)
    assert shown is not None and "undecodable" in shown["payload"]["note"]
    assert rd.cancel(broken.id) is True, "an unreadable body does not stop a cancel"
    assert broken.state == "REVOKED"


def test_cancel_many_sends_task_revoked_for_each_call_through_one_dispatcher(
    make_app: MakeApp, redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, rd = with_backend(make_app, redis_server, worker_send_task_events=True)
    echo = echo_on(rd)
    ids = [echo.apply_async((n,), countdown=60).id for n in range(3)]
    opened: list[list[str]] = []

    @contextmanager
    def dispatcher() -> Iterator[Any]:
        sent: list[str] = []
        opened.append(sent)
        yield SimpleNamespace(send=lambda kind, uuid, **fields: sent.append(f"{kind} {uuid}"))

    monkeypatch.setattr(app.events, "default_dispatcher", dispatcher)
    assert sorted(rd.cancel_many(ids)) == sorted(ids)
    assert len(opened) == 1 and sorted(opened[0]) == sorted(f"task-revoked {i}" for i in ids)
    assert [app.AsyncResult(i).state for i in ids] == ["REVOKED"] * 3


def test_cancel_of_an_ignored_result_stores_nothing(make_app: MakeApp, redis_server: Any) -> None:
    _, rd = with_backend(make_app, redis_server)

    @rd.delayed(ignore_result=True)
    def quiet() -> None: ...

    result = quiet.apply_async(countdown=60)
    assert rd.cancel(result.id) is True
    assert result.state == "PENDING", "a task whose result is ignored stores no revoked state, as in Celery"


def test_a_revoke_heard_by_a_worker_drops_parked_calls_for_good(make_app: MakeApp, redis_server: Any) -> None:
    _, rd = with_backend(make_app, redis_server)
    echo = echo_on(rd)
    parked = echo.apply_async((1,), countdown=60)
    released = echo.apply_async((2,), countdown=0)
    assert rd.tick()["released"] == 1
    assert drop_revoked(rd.depot, [parked.id, released.id, "never-parked"]) == 1
    assert rd.find(parked.id) is None and parked.state == "REVOKED"
    entry = rd.find(released.id)
    assert entry is not None and entry.state == "inflight", "the worker that receives it discards it"


def test_the_workers_hearing_one_revoke_record_it_once(make_app: MakeApp, redis_server: Any) -> None:
    """Every worker hears a revoke broadcast: the one whose cancel drops the call records it; the others, a moment
    later, find it cancelled and not yet recorded, and leave it to that one."""
    _, rd = with_backend(make_app, redis_server)
    parked = echo_on(rd).apply_async((1,), countdown=60)
    [first] = rd.store.cancel_many([parked.id])  # the first worker, before it records the call
    assert first.record and rd.client.hexists(rd.keys.unrecorded, parked.id)
    assert drop_revoked(rd.depot, [parked.id]) == 0, "a second worker left it to the first"
    assert parked.state == "PENDING"
    assert rd.cancel(parked.id) is True, "a cancel sent again takes it over"
    assert parked.state == "REVOKED"


def test_a_result_of_a_task_that_ignores_results_is_not_waited_for(make_app: MakeApp, redis_server: Any) -> None:
    app, rd = with_backend(make_app, redis_server)

    @rd.delayed(name="tests.fidelity.quiet", ignore_result=True)
    def quiet() -> None: ...

    @app.task(name="tests.fidelity.quiet_plain", ignore_result=True, shared=False)
    def quiet_plain() -> None: ...

    ours, celerys = quiet.apply_async(countdown=60), quiet_plain.apply_async(countdown=60)
    assert (ours.ignored, celerys.ignored) == (True, True)
    assert ours.get(timeout=1) is None, "Celery returns None at once for an ignored result"
    assert echo_on(rd).apply_async((1,), countdown=60).ignored is False
    assert app.send_task("tests.fidelity.quiet", countdown=60, ignore_result=True).ignored is True
