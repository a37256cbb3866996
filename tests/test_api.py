"""The user-facing API of celery-redisdelay against a real redis-server (no worker, no mocks).

Each test gets its own key prefix and its own unconsumed default queue (see ``conftest.py``); a call
that is parked must be in the store and nowhere in the broker.
"""

from __future__ import annotations

import gc
import json
import math
import uuid
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import celery
import pytest
import redis
from celery import Celery, signals
from celery.beat import Service
from celery.result import AsyncResult, EagerResult
from celery.utils.time import maybe_make_aware
from kombu.exceptions import EncodeError, OperationalError
from kombu.serialization import dumps, loads

from celery_redisdelay import (
    Abandon,
    ConfigurationError,
    DelayedTask,
    PayloadError,
    RedisDelay,
    ScheduleError,
    StoreUnavailableError,
)
from celery_redisdelay.extension import TICK_TASK
from celery_redisdelay.message.envelope import Envelope
from celery_redisdelay.message.stored import decode_stored
from celery_redisdelay.operations.validation import CONSUMER_TASK, VALIDATE_TASK
from celery_redisdelay.store.calls import Entry
from celery_redisdelay.testing import RedisServer, free_port

MakeApp = Callable[..., tuple[Celery, RedisDelay]]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# -- helpers ------------------------------------------------------------------------------------


def redis_now_ms(rd: RedisDelay) -> int:
    """The store server's clock in ms, computed as the park script computes it."""
    seconds, micros = rd.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def epoch_ms(moment: datetime) -> int:
    """An aware datetime as whole ms since the epoch, exactly (no float rounding)."""
    return (moment - EPOCH) // timedelta(milliseconds=1)


def store_sizes(rd: RedisDelay) -> dict[str, int]:
    keys = rd.keys
    return {
        "delayed": rd.client.zcard(keys.delayed),
        "inflight": rd.client.zcard(keys.inflight),
        "dead": rd.client.zcard(keys.dead),
        "payloads": rd.client.hlen(keys.payloads),
        "meta": rd.client.hlen(keys.meta),
    }


def broker_keys(client: redis.Redis, queue: str) -> list[bytes]:
    """Broker lists of ``queue`` (kombu's Redis transport adds a suffix per priority)."""
    return list(client.scan_iter(match=f"{queue}*"))


def parked(rd: RedisDelay, call_id: str) -> Entry:
    entry = rd.find(call_id)
    assert entry is not None, f"call {call_id} is not in the store"
    assert entry.state == "delayed"
    assert entry.envelope is not None
    return entry


def envelope_of(rd: RedisDelay, call_id: str) -> Envelope:
    entry = parked(rd, call_id)
    assert entry.envelope is not None
    return decode_stored(entry.envelope)


def args_of(envelope: Envelope) -> Any:
    """The positional arguments inside a stored message body."""
    body = loads(envelope.body, envelope.content_type, envelope.content_encoding, accept={envelope.content_type})
    return body[0]


@pytest.fixture
def default_queue(rd: RedisDelay) -> str:
    queue: str = rd.app.conf.task_default_queue
    return queue


@pytest.fixture
def connected() -> Iterator[Callable[[Any, Callable[..., None]], None]]:
    """Connect signal receivers for one test; they are disconnected afterwards."""
    connections: list[tuple[Any, Callable[..., None]]] = []

    def connect(signal: Any, receiver: Callable[..., None]) -> None:
        signal.connect(receiver, weak=False)
        connections.append((signal, receiver))

    yield connect
    for signal, receiver in connections:
        signal.disconnect(receiver)


# -- the decorator ------------------------------------------------------------------------------


def test_bare_decorator_makes_a_registered_delayed_celery_task(rd: RedisDelay) -> None:
    @rd.delayed
    def api_bare_add(x: int, y: int) -> int:
        return x + y

    assert isinstance(api_bare_add, DelayedTask)
    assert isinstance(api_bare_add, celery.Task)
    assert api_bare_add.name == "tests.test_api.api_bare_add"
    registered = rd.app.tasks[api_bare_add.name]
    assert isinstance(registered, rd.Task)
    assert registered.redisdelay is rd
    assert api_bare_add(2, 3) == 5  # calling the task runs it here, as for any Celery task
    assert api_bare_add.default_countdown == 0


def test_decorator_options_name_limits_and_queue(rd: RedisDelay, client: redis.Redis, default_queue: str) -> None:
    @rd.delayed(countdown=10, timeout=60, max_deliveries=5, name="test_api.x.y", queue="q1-test-api", shared=False)
    def configured(x: int) -> int:
        return x

    assert isinstance(configured, DelayedTask)
    assert isinstance(configured, celery.Task)
    task = rd.app.tasks["test_api.x.y"]
    assert task.name == "test_api.x.y"
    assert (task.default_countdown, task.visibility_timeout, task.max_deliveries) == (10, 60, 5)

    result = configured.apply_async((1,))
    entry = parked(rd, result.id)
    assert entry.meta["t"] == "test_api.x.y"
    assert entry.meta["m"] == 5
    assert entry.meta["r"] == 60_000
    assert entry.meta["d"] == 0
    envelope = envelope_of(rd, result.id)
    assert envelope.task == "test_api.x.y"
    assert envelope.routing_key == "q1-test-api"
    assert envelope.queues == ["q1-test-api"]
    assert broker_keys(client, "q1-test-api") == []
    assert broker_keys(client, default_queue) == []
    overridden = configured.apply_async((2,), queue="q2-test-api")
    assert envelope_of(rd, overridden.id).queues == ["q2-test-api"], "the call's own queue wins"


def test_task_routes_route_the_stored_message(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(task_routes={"test_api.routed": {"queue": "q-routed-test-api"}})

    @rd.delayed(name="test_api.routed", shared=False)
    def routed(x: int) -> int:
        return x

    envelope = envelope_of(rd, routed.apply_async((1,), countdown=30).id)
    assert (envelope.routing_key, envelope.queues) == ("q-routed-test-api", ["q-routed-test-api"])
    assert broker_keys(client, "q-routed-test-api") == []


def test_a_base_task_class_of_the_users_keeps_its_hooks_under_ours(rd: RedisDelay) -> None:
    class Audited(celery.Task):  # type: ignore[misc]
        audited = True

        def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None: ...

    @rd.delayed(base=Audited)
    def api_audited(x: int) -> int:
        return x

    task_class = api_audited.__class__
    assert issubclass(task_class, Audited) and issubclass(task_class, rd.Task)
    assert task_class.on_success is Audited.on_success
    assert api_audited.apply_async((1,), countdown=30).id in {e.id for e in rd.store.entries("delayed")}

    @rd.delayed(base=celery.Task)  # a base ours derives from already
    def api_plain_base() -> None: ...

    assert api_plain_base.__class__.__mro__[1] is rd.Task
    with pytest.raises(ConfigurationError, match="must be a Celery task class"):
        rd.delayed(base=dict)(lambda: None)


def test_internal_tasks_are_registered(rd: RedisDelay) -> None:
    assert TICK_TASK == "redisdelay.tick"
    assert VALIDATE_TASK == "redisdelay.validate"
    assert "redisdelay.tick" in rd.app.tasks
    assert "redisdelay.validate" in rd.app.tasks


#: Celery 5.7 warns when a task name is registered twice; before, it did not: then any warning naming it counts.
DUPLICATE_TASK_WARNING = getattr(celery.exceptions, "DuplicateTaskNameWarning", Warning)


def test_a_second_app_gets_its_own_validate_consumer_without_a_warning(make_app: MakeApp) -> None:
    first_app, first = make_app()
    first_app.finalize()
    second_app, second = make_app()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second_app.finalize()
    duplicates = [
        str(w.message)
        for w in caught
        if issubclass(w.category, DUPLICATE_TASK_WARNING) and CONSUMER_TASK in str(w.message)
    ]
    assert duplicates == []
    assert first_app.tasks[CONSUMER_TASK].redisdelay is first
    assert second_app.tasks[CONSUMER_TASK].redisdelay is second


# -- parking: countdown, delay, signatures ------------------------------------------------------


def test_apply_async_countdown_parks_by_the_redis_clock(
    rd: RedisDelay, client: redis.Redis, default_queue: str
) -> None:
    @rd.delayed
    def api_countdown(x: int) -> int:
        return x

    before = redis_now_ms(rd)
    result = api_countdown.apply_async((7,), countdown=30)
    after = redis_now_ms(rd)

    assert isinstance(result, AsyncResult)
    entry = parked(rd, result.id)
    assert before + 30_000 <= entry.score_ms <= after + 30_000
    envelope = envelope_of(rd, result.id)
    assert envelope.headers["id"] == result.id == entry.id
    assert envelope.headers["eta"] is None  # the due time lives in the sorted set, not in the message
    assert args_of(envelope) == [7]
    assert broker_keys(client, default_queue) == []
    assert rd.stats()["delayed"] == 1


def test_delay_uses_the_decorator_default_countdown_zero(rd: RedisDelay) -> None:
    @rd.delayed
    def api_delay_now(x: int) -> int:
        return x

    before = redis_now_ms(rd)
    result = api_delay_now.delay(1)
    after = redis_now_ms(rd)
    entry = parked(rd, result.id)
    assert before <= entry.score_ms <= after
    assert rd.stats()["due"] == 1


def test_delay_uses_the_decorator_default_countdown_ten(rd: RedisDelay) -> None:
    @rd.delayed(countdown=10, name="test_api.delay_ten", shared=False)
    def delay_ten(x: int) -> int:
        return x

    before = redis_now_ms(rd)
    default = delay_ten.delay(1)
    explicit_zero = delay_ten.apply_async((2,), countdown=0)
    after = redis_now_ms(rd)
    assert before + 10_000 <= parked(rd, default.id).score_ms <= after + 10_000
    assert before <= parked(rd, explicit_zero.id).score_ms <= after  # an explicit countdown wins


def test_signature_apply_async_parks(rd: RedisDelay, client: redis.Redis, default_queue: str) -> None:
    @rd.delayed
    def api_signature(x: int) -> int:
        return x

    before = redis_now_ms(rd)
    from_signature = api_signature.signature((1,), countdown=5).apply_async()
    from_s = api_signature.s(2).apply_async(countdown=5)
    after = redis_now_ms(rd)

    for result, argument in ((from_signature, 1), (from_s, 2)):
        entry = parked(rd, result.id)
        assert before + 5_000 <= entry.score_ms <= after + 5_000
        envelope = envelope_of(rd, result.id)
        assert envelope.headers["id"] == result.id
        assert args_of(envelope) == [argument]
    assert broker_keys(client, default_queue) == []


def test_explicit_task_id_is_the_stored_id_and_the_message_id(rd: RedisDelay) -> None:
    @rd.delayed
    def api_explicit_id(x: int) -> int:
        return x

    task_id = f"call-{uuid.uuid4()}"
    result = api_explicit_id.apply_async((1,), countdown=30, task_id=task_id)
    assert result.id == task_id
    assert parked(rd, task_id).id == task_id
    assert envelope_of(rd, task_id).headers["id"] == task_id


def test_per_call_limits_override_the_task_defaults(rd: RedisDelay) -> None:
    @rd.delayed(max_deliveries=5, timeout=60, name="test_api.per_call_limits", shared=False)
    def per_call(x: int) -> int:
        return x

    result = per_call.apply_async((1,), countdown=30, max_deliveries=2, visibility_timeout=7, queue_timeout=9)
    meta = parked(rd, result.id).meta
    assert (meta["m"], meta["r"], meta["q"]) == (2, 7_000, 9_000)
    envelope = envelope_of(rd, result.id)
    assert not {"max_deliveries", "visibility_timeout", "queue_timeout"} & set(envelope.properties)


def test_limits_a_task_is_given_after_its_first_calls_hold_for_the_next(rd: RedisDelay) -> None:
    @rd.delayed(max_deliveries=5, name="test_api.later_limits", shared=False)
    def later(x: int) -> int:
        return x

    first = [later.apply_async((n,), countdown=30).id for n in range(3)]  # the task's limits are known now
    later.max_deliveries, later.visibility_timeout = 2, 7
    second = later.apply_async((3,), countdown=30).id
    assert [parked(rd, call_id).meta["m"] for call_id in first] == [5, 5, 5]
    meta = parked(rd, second).meta
    assert (meta["m"], meta["r"]) == (2, 7_000)


# -- parking: eta -------------------------------------------------------------------------------


def test_aware_eta_is_the_score(rd: RedisDelay) -> None:
    @rd.delayed
    def api_aware_eta(x: int) -> int:
        return x

    eta = datetime(2031, 5, 6, 7, 8, 9, 123_456, tzinfo=ZoneInfo("Europe/Berlin"))
    result = api_aware_eta.apply_async((1,), eta=eta)
    assert parked(rd, result.id).score_ms == epoch_ms(eta.replace(microsecond=123_000))


@pytest.mark.parametrize("enable_utc", [True, False])
def test_naive_eta_follows_the_worker_rule(make_app: MakeApp, enable_utc: bool) -> None:
    app, rd = make_app(timezone="Europe/Berlin", enable_utc=enable_utc)

    @rd.delayed(name=f"test_api.naive_eta_{enable_utc}", shared=False)
    def naive_eta(x: int) -> int:
        return x

    for eta in (datetime(2031, 1, 15, 12, 0, 0), datetime(2031, 7, 1, 12, 30, 0, 250_000)):
        result = naive_eta.apply_async((1,), eta=eta)
        expected = math.floor(maybe_make_aware(eta, app.conf.timezone).timestamp() * 1000)
        assert parked(rd, result.id).score_ms == expected


def test_iso_string_eta(make_app: MakeApp) -> None:
    app, rd = make_app(timezone="Europe/Berlin")

    @rd.delayed(name="test_api.iso_eta", shared=False)
    def iso_eta(x: int) -> int:
        return x

    aware = iso_eta.apply_async((1,), eta="2031-05-06T07:08:09.123+02:00")
    assert parked(rd, aware.id).score_ms == epoch_ms(datetime(2031, 5, 6, 5, 8, 9, 123_000, tzinfo=UTC))
    naive = iso_eta.apply_async((1,), eta="2031-05-06T07:08:09")
    expected = maybe_make_aware(datetime(2031, 5, 6, 7, 8, 9), app.conf.timezone)
    assert parked(rd, naive.id).score_ms == epoch_ms(expected)


def test_a_negative_countdown_is_due_now_like_a_past_eta(rd: RedisDelay) -> None:
    @rd.delayed
    def api_negative(x: int) -> int:
        return x

    now_ms = rd.store.client.time()[0] * 1000
    result = api_negative.apply_async((1,), countdown=-0.2)  # a computed delay that went slightly negative
    assert now_ms <= parked(rd, result.id).score_ms <= now_ms + 2000
    assert rd.stats()["due"] == 1
    assert rd.reschedule(result.id, countdown=-5)


def test_past_eta_parks_the_call_as_due(rd: RedisDelay) -> None:
    @rd.delayed
    def api_past_eta(x: int) -> int:
        return x

    eta = datetime(2020, 1, 1, tzinfo=UTC)
    result = api_past_eta.apply_async((1,), eta=eta)
    assert parked(rd, result.id).score_ms == epoch_ms(eta)
    assert rd.stats()["due"] == 1


# -- refused calls store nothing ----------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"countdown": math.nan}, id="nan"),
        pytest.param({"countdown": math.inf}, id="inf"),
        pytest.param({"countdown": -math.inf}, id="negative-infinite"),
        pytest.param({"countdown": "10"}, id="string"),
        pytest.param({"countdown": True}, id="bool"),
        pytest.param({"countdown": 5, "eta": datetime(2031, 1, 1, tzinfo=UTC)}, id="countdown-and-eta"),
        pytest.param({"eta": "tomorrow"}, id="eta-not-iso"),
        pytest.param({"eta": 1_900_000_000}, id="eta-number"),
    ],
)
def test_bad_schedule_raises_schedule_error_and_stores_nothing(
    rd: RedisDelay, client: redis.Redis, default_queue: str, options: dict[str, Any]
) -> None:
    @rd.delayed
    def api_bad_schedule(x: int) -> int:
        return x

    api_bad_schedule.apply_async((0,), countdown=30)  # the store is not empty: sizes must not move
    sizes = store_sizes(rd)
    task_id = f"bad-{uuid.uuid4()}"
    with pytest.raises(ScheduleError) as raised:
        api_bad_schedule.apply_async((1,), task_id=task_id, **options)
    assert isinstance(raised.value, ValueError)
    assert rd.find(task_id) is None
    assert store_sizes(rd) == sizes
    assert broker_keys(client, default_queue) == []


def test_unserializable_arguments_raise_payload_error_and_store_nothing(
    rd: RedisDelay, client: redis.Redis, default_queue: str
) -> None:
    @rd.delayed(name="test_api.unserializable", shared=False)
    def unserializable(x: object) -> object:
        return x

    sizes = store_sizes(rd)
    task_id = f"bad-{uuid.uuid4()}"
    with pytest.raises(PayloadError) as raised:
        unserializable.apply_async((object(),), countdown=5, task_id=task_id)
    assert isinstance(raised.value, EncodeError)
    assert "test_api.unserializable" in str(raised.value)
    assert "json" in str(raised.value)
    assert rd.find(task_id) is None
    assert store_sizes(rd) == sizes
    assert broker_keys(client, default_queue) == []


def test_unserializable_header_raises_payload_error_and_stores_nothing(
    rd: RedisDelay, client: redis.Redis, default_queue: str
) -> None:
    @rd.delayed(name="test_api.bad_header", shared=False)
    def bad_header(x: int) -> int:
        return x

    sizes = store_sizes(rd)
    task_id = f"bad-{uuid.uuid4()}"
    with pytest.raises(PayloadError, match=r"test_api\.bad_header"):
        bad_header.apply_async((1,), countdown=5, task_id=task_id, headers={"x": object()})
    assert rd.find(task_id) is None
    assert store_sizes(rd) == sizes
    assert broker_keys(client, default_queue) == []


def test_bad_per_call_max_deliveries_stores_nothing(rd: RedisDelay) -> None:
    @rd.delayed
    def api_bad_limit(x: int) -> int:
        return x

    sizes = store_sizes(rd)
    task_id = f"bad-{uuid.uuid4()}"
    with pytest.raises(ConfigurationError, match="max_deliveries"):
        api_bad_limit.apply_async((1,), countdown=5, task_id=task_id, max_deliveries=-1)
    assert rd.find(task_id) is None
    assert store_sizes(rd) == sizes


# -- what the stored message keeps --------------------------------------------------------------


def test_expires_is_kept_absolute_and_the_ttl_is_recomputed_when_kombu_publishes(
    make_app: MakeApp, client: redis.Redis
) -> None:
    app, rd = make_app(redisdelay_fast_release=False)

    @rd.delayed
    def api_expires(x: int) -> int:
        return x

    before = datetime.now(UTC)
    result = api_expires.apply_async((1,), countdown=0, expires=60)
    after = datetime.now(UTC)
    envelope = envelope_of(rd, result.id)
    expires = datetime.fromisoformat(envelope.headers["expires"])
    assert expires.tzinfo is not None
    assert before + timedelta(seconds=60) <= expires <= after + timedelta(seconds=60)
    assert envelope.properties["expiration"] == 60, "stored as Celery computed it at the call"
    assert rd.tick()["released"] == 1
    [published] = [json.loads(m) for m in client.lrange(app.conf.task_default_queue, 0, -1)]
    left_ms = (expires - datetime.now(UTC)).total_seconds() * 1000
    assert left_ms - 1000 <= int(published["properties"]["expiration"]) <= left_ms + 1000, (
        "a TTL from the absolute expiry, computed when the message is published"
    )


def test_a_naive_expires_datetime_is_released_with_the_ttl_celery_gives_it(
    make_app: MakeApp, client: redis.Redis
) -> None:
    app, rd = make_app(redisdelay_fast_release=False)

    @rd.delayed
    def api_naive_expires(x: int) -> int:
        return x

    @app.task
    def plain_naive_expires(x: int) -> int:
        return x

    expires = datetime.now(UTC).replace(tzinfo=None) + timedelta(minutes=10)  # naive: Celery reads it as UTC
    result = api_naive_expires.apply_async((1,), countdown=0, expires=expires)
    plain_naive_expires.apply_async((1,), expires=expires)
    assert rd.tick()["released"] == 1, "released, not dead-lettered as a message that cannot be published"
    assert rd.find(result.id).state == "inflight"  # type: ignore[union-attr]
    ours, celerys = [json.loads(m) for m in client.lrange(app.conf.task_default_queue, 0, -1)]
    assert abs(int(ours["properties"]["expiration"]) - int(celerys["properties"]["expiration"])) <= 1000


def test_custom_headers_and_priority_are_kept(rd: RedisDelay) -> None:
    @rd.delayed
    def api_headers(x: int) -> int:
        return x

    result = api_headers.apply_async((1,), countdown=30, headers={"x": 1}, priority=3)
    envelope = envelope_of(rd, result.id)
    assert envelope.headers["x"] == 1
    assert envelope.properties["priority"] == 3


def test_pickle_body_round_trips(make_app: MakeApp, connected: Callable[[Any, Callable[..., None]], None]) -> None:
    _, rd = make_app(task_serializer="pickle", accept_content=["pickle", "json"])

    @rd.delayed(name="test_api.pickled", shared=False)
    def pickled(data: bytes) -> bytes:
        return data

    bodies: dict[str, Any] = {}

    def remember_body(sender: Any = None, body: Any = None, headers: Any = None, **_: Any) -> None:
        bodies[headers["id"]] = body

    connected(signals.before_task_publish, remember_body)
    payload = bytes(range(256))
    result = pickled.apply_async((payload,), countdown=30)

    envelope = envelope_of(rd, result.id)
    assert envelope.content_type == "application/x-python-serialize"
    assert envelope.content_encoding == "binary"
    content_type, encoding, expected = dumps(bodies[result.id], serializer="pickle")
    assert (envelope.content_type, envelope.content_encoding) == (content_type, encoding)
    assert envelope.body == expected
    assert args_of(envelope) == (payload,)


def test_always_eager_runs_at_once_and_stores_nothing(make_app: MakeApp, client: redis.Redis) -> None:
    app, rd = make_app(task_always_eager=True)

    @rd.delayed(name="test_api.eager", shared=False)
    def eager(x: int) -> int:
        return x * 2

    result = eager.apply_async((21,), countdown=30)
    assert isinstance(result, EagerResult)
    assert result.get() == 42
    assert eager.delay(5).get() == 10
    assert rd.find(result.id) is None
    assert store_sizes(rd) == {"delayed": 0, "inflight": 0, "dead": 0, "payloads": 0, "meta": 0}
    assert broker_keys(client, app.conf.task_default_queue) == []


# -- operations ---------------------------------------------------------------------------------


def test_cancel_then_cancel_again(rd: RedisDelay) -> None:
    @rd.delayed
    def api_cancel(x: int) -> int:
        return x

    kept = api_cancel.apply_async((1,), countdown=30)
    result = api_cancel.apply_async((2,), countdown=30)
    assert rd.cancel(result.id) is True
    assert rd.find(result.id) is None
    assert rd.cancel(result.id) is False
    assert rd.cancel("never-parked") is False
    assert parked(rd, kept.id).id == kept.id
    assert store_sizes(rd) == {"delayed": 1, "inflight": 0, "dead": 0, "payloads": 1, "meta": 1}


def test_stats_counts_per_state(rd: RedisDelay) -> None:
    @rd.delayed
    def api_stats(x: int) -> int:
        return x

    assert {"delayed", "inflight", "dead"} <= set(rd.stats())
    assert rd.stats()["delayed"] == 0
    api_stats.apply_async((1,), countdown=30)
    api_stats.apply_async((2,), countdown=0)
    stats = rd.stats()
    assert (stats["delayed"], stats["inflight"], stats["dead"]) == (2, 0, 0)
    assert stats["due"] == 1


def test_parking_the_same_id_twice_replaces_the_first(rd: RedisDelay) -> None:
    @rd.delayed
    def api_replace(x: int) -> int:
        return x

    task_id = f"same-{uuid.uuid4()}"
    api_replace.apply_async((1,), countdown=30, task_id=task_id)
    before = redis_now_ms(rd)
    api_replace.apply_async((2,), countdown=60, task_id=task_id)
    after = redis_now_ms(rd)
    assert store_sizes(rd) == {"delayed": 1, "inflight": 0, "dead": 0, "payloads": 1, "meta": 1}
    entry = parked(rd, task_id)
    assert before + 60_000 <= entry.score_ms <= after + 60_000
    assert args_of(envelope_of(rd, task_id)) == [2]


# -- beat schedule ------------------------------------------------------------------------------


def test_beat_schedule_has_the_tick_with_the_configured_interval(make_app: MakeApp) -> None:
    app, _ = make_app(redisdelay_tick_interval=2.5)
    assert app.conf.beat_schedule["redisdelay.tick"] == {"task": "redisdelay.tick", "schedule": 2.5}


def test_beat_schedule_default_interval(rd: RedisDelay) -> None:
    assert rd.app.conf.beat_schedule["redisdelay.tick"] == {"task": "redisdelay.tick", "schedule": 1.0}


def test_user_beat_entries_set_before_are_kept(make_app: MakeApp) -> None:
    mine = {"task": "someone.else", "schedule": 7.0}
    app, _ = make_app(beat_schedule={"mine": mine}, redisdelay_tick_interval=3)
    schedule = app.conf.beat_schedule
    assert schedule["mine"] == mine
    assert schedule["redisdelay.tick"] == {"task": "redisdelay.tick", "schedule": 3.0}


def test_user_entry_named_tick_is_not_overwritten(make_app: MakeApp) -> None:
    theirs = {"task": "redisdelay.tick", "schedule": 9.0, "options": {"queue": "beat"}}
    app, _ = make_app(beat_schedule={"redisdelay.tick": theirs}, redisdelay_tick_interval=2)
    assert app.conf.beat_schedule == {"redisdelay.tick": theirs}


def test_user_beat_schedule_set_first_keeps_both(make_app: MakeApp) -> None:
    app, _ = make_app(redisdelay_tick_interval=4)
    mine = {"task": "someone.else", "schedule": 7.0}
    app.conf.beat_schedule = {"mine": mine}  # the app's first configuration access
    assert app.conf.beat_schedule == {
        "mine": mine,
        "redisdelay.tick": {"task": "redisdelay.tick", "schedule": 4.0},
    }


def configured_then_replaced(make_app: MakeApp, schedule: dict[str, Any]) -> Celery:
    """An app whose configuration is loaded, and whose beat_schedule the user then replaced."""
    app, _ = make_app(redisdelay_tick_interval=4)
    assert "redisdelay.tick" in app.conf.beat_schedule
    assert app.configured
    app.conf.beat_schedule = schedule
    assert app.conf.beat_schedule == schedule
    return app


def test_user_beat_schedule_replaced_after_gets_the_tick_at_beat_init(make_app: MakeApp) -> None:
    mine = {"task": "someone.else", "schedule": 7.0}
    app = configured_then_replaced(make_app, {"mine": mine})
    signals.beat_init.send(sender=Service(app))
    assert app.conf.beat_schedule == {
        "mine": mine,
        "redisdelay.tick": {"task": "redisdelay.tick", "schedule": 4.0},
    }


def test_user_tick_entry_set_after_survives_beat_init(make_app: MakeApp) -> None:
    theirs = {"task": "redisdelay.tick", "schedule": 30.0}
    app = configured_then_replaced(make_app, {"redisdelay.tick": theirs})
    signals.beat_init.send(sender=Service(app))
    assert app.conf.beat_schedule == {"redisdelay.tick": theirs}


def test_beat_init_of_another_app_leaves_this_schedule_alone(make_app: MakeApp) -> None:
    mine = {"task": "someone.else", "schedule": 7.0}
    app = configured_then_replaced(make_app, {"mine": mine})
    other, _ = make_app()
    signals.beat_init.send(sender=Service(other))
    assert app.conf.beat_schedule == {"mine": mine}
    assert "redisdelay.tick" in other.conf.beat_schedule


# -- Celery's publish signals -------------------------------------------------------------------


@pytest.mark.parametrize("fast", [None, False], ids=["fast path", "kombu path"])
def test_publish_signals_fire_once_per_call_as_for_a_plain_task_and_not_again_at_release(
    make_app: MakeApp, connected: Callable[[Any, Callable[..., None]], None], fast: bool | None
) -> None:
    app, rd = make_app(redisdelay_fast_release=fast)

    @rd.delayed(name="test_api.hooked", shared=False)
    def hooked(x: int) -> int:
        return x

    @app.task(name="test_api.plain_hooked", shared=False)
    def plain_hooked(x: int) -> int:
        return x

    seen: list[tuple[str, str]] = []
    connected(signals.before_task_publish, lambda sender=None, headers=None, **_: seen.append(("before", sender)))
    connected(signals.after_task_publish, lambda sender=None, headers=None, **_: seen.append(("after", sender)))
    for n in range(3):
        hooked.apply_async((n,), countdown=0)
        plain_hooked.apply_async((n,), countdown=0)
    assert rd.tick()["released"] == 3
    ours = [when for when, sender in seen if sender == "test_api.hooked"]
    plain = [when for when, sender in seen if sender == "test_api.plain_hooked"]
    assert ours == plain == ["before", "after"] * 3, "once at the call, none at the release"


def test_before_task_publish_sees_the_call_and_can_add_a_header(
    rd: RedisDelay, connected: Callable[[Any, Callable[..., None]], None]
) -> None:
    @rd.delayed(name="test_api.signals", shared=False)
    def with_signals(x: int) -> int:
        return x

    seen: list[tuple[str, str]] = []

    def before(sender: Any = None, headers: Any = None, **_: Any) -> None:
        seen.append((sender, headers["id"]))
        headers["x-added"] = "by-receiver"

    after: list[str] = []

    def after_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
        after.append(headers["id"])

    connected(signals.before_task_publish, before)
    connected(signals.after_task_publish, after_publish)
    result = with_signals.apply_async((1,), countdown=30)
    assert seen == [("test_api.signals", result.id)]
    assert after == [result.id]
    assert envelope_of(rd, result.id).headers["x-added"] == "by-receiver"


# -- Redis problems at park time ----------------------------------------------------------------


def test_unreachable_store_at_park_time_writes_nothing(make_app: MakeApp, client: redis.Redis) -> None:
    app, rd = make_app(redisdelay_url="redis://127.0.0.1:1/0")

    @rd.delayed(name="test_api.down", shared=False)
    def down(x: int) -> int:
        return x

    with pytest.raises((StoreUnavailableError, OperationalError), match="could not park call down-1"):
        down.apply_async((1,), countdown=5, task_id="down-1")
    # Nothing fell through to the broker, nor to the broker's Redis under the store's prefix.
    assert broker_keys(client, app.conf.task_default_queue) == []
    assert list(client.scan_iter(match=f"{{{rd.settings.key_prefix}}}*")) == []
    with pytest.raises(StoreUnavailableError):
        rd.ping()
    with pytest.raises(StoreUnavailableError):
        rd.find("down-1")
    with pytest.raises(StoreUnavailableError):
        rd.stats()


def test_unreachable_store_at_park_time_raises_store_unavailable(make_app: MakeApp) -> None:
    _, rd = make_app(redisdelay_url="redis://127.0.0.1:1/0")

    @rd.delayed(name="test_api.down_type", shared=False)
    def down_type(x: int) -> int:
        return x

    with pytest.raises(StoreUnavailableError, match="could not park call"):
        down_type.apply_async((1,), countdown=5)


def test_overwritten_store_key_refuses_the_park_and_writes_nothing(rd: RedisDelay) -> None:
    @rd.delayed(name="test_api.wrongtype", shared=False)
    def wrongtype(x: int) -> int:
        return x

    rd.client.set(rd.keys.payloads, "someone else's string")
    with pytest.raises((StoreUnavailableError, OperationalError), match="WRONGTYPE"):
        wrongtype.apply_async((1,), countdown=5, task_id="wrongtype-1")
    assert rd.client.get(rd.keys.payloads) == b"someone else's string"
    assert (rd.client.zcard(rd.keys.delayed), rd.client.hlen(rd.keys.meta)) == (0, 0)


def test_overwritten_store_key_raises_store_unavailable(rd: RedisDelay) -> None:
    @rd.delayed(name="test_api.wrongtype_type", shared=False)
    def wrongtype_type(x: int) -> int:
        return x

    rd.client.set(rd.keys.payloads, "someone else's string")
    with pytest.raises(StoreUnavailableError, match="WRONGTYPE"):
        wrongtype_type.apply_async((1,), countdown=5)


# -- the testing helpers ------------------------------------------------------------------------


def test_redis_server_closes_its_log_file() -> None:
    gc.collect()  # what earlier tests left for the collector is not this test's to judge
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        server = RedisServer().start()
        server.stop()
        del server
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


def test_a_serializer_the_workers_do_not_accept_is_refused_at_park(make_app: MakeApp, default_queue: str) -> None:
    _, rd = make_app(task_serializer="pickle", accept_content=["json"])

    @rd.delayed(name="test_api.not_accepted", shared=False)
    def not_accepted(x: int) -> int:
        return x

    task_id = f"bad-{uuid.uuid4()}"
    with pytest.raises(PayloadError, match="accept_content"):
        not_accepted.apply_async((1,), countdown=5, task_id=task_id)
    assert rd.find(task_id) is None
    accepted = not_accepted.apply_async((1,), countdown=5, serializer="json")
    assert rd.find(accepted.id) is not None, "a call with an accepted serializer still parks"


def test_the_validation_consumer_leaves_a_message_in_flight_when_it_cannot_record_it(make_app: MakeApp) -> None:
    """A chaos run found this: a dropped connection made the consumer fail, Celery acknowledged the
    failure, and the message went missing from the check. It must stay unacknowledged instead."""
    app, _ = make_app(redisdelay_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(Abandon, match="could not record message 7"):
        app.tasks[CONSUMER_TASK].run("run1", 7, 2)
