"""The catalogue of bad input (README, "Bad input"): one test per row, against a real redis-server.

Bad input from a caller gets a clear error at the call (type, and a message naming the problem and
the fix) with nothing stored; bad data already in Redis is dead-lettered with a reason while the
loop goes on.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from celery import Celery, signals

from celery_redisdelay import ConfigurationError, PayloadError, RedisDelay, ScheduleError, StoreUnavailableError
from celery_redisdelay.testing import RedisServer, free_port

MakeApp = Callable[..., tuple[Celery, RedisDelay]]


def task_on(rd: RedisDelay) -> Any:
    @rd.delayed(name="tests.bad.echo")
    def echo(value: Any) -> Any:
        return value

    return echo


def snapshot(client: redis.Redis, rd: RedisDelay) -> dict[str, Any]:
    """Everything the store holds, to show a refused call changed nothing."""
    return {key: client.dump(key) for key in rd.keys.store_keys}


def test_unserializable_arguments(rd: RedisDelay, client: redis.Redis) -> None:
    before = snapshot(client, rd)
    with pytest.raises(PayloadError, match=r"cannot serialize the arguments .* nothing was stored"):
        task_on(rd).apply_async((object(),), countdown=10)
    assert snapshot(client, rd) == before


def test_a_huge_argument_is_refused_by_the_size_limit(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_max_payload_bytes=10_000)
    echo = task_on(rd)

    @rd.batched(name="tests.bad.bind", size=10)
    def bind(key: str, items: list[Any]) -> None: ...

    before = snapshot(client, rd)
    message = r"more than redisdelay_max_payload_bytes \(10,000\); pass a reference .* nothing was stored"
    with pytest.raises(PayloadError, match=message):
        echo.apply_async(("x" * 20_000,), countdown=10)
    with pytest.raises(PayloadError, match=message):
        echo.park_many([("small",), ("x" * 20_000,)], countdown=10)
    with pytest.raises(PayloadError, match=message):
        bind.add("area", "x" * 20_000)
    assert snapshot(client, rd) == before
    assert echo.apply_async(("x" * 5_000,), countdown=10).id  # below the limit: parked


@pytest.mark.parametrize("countdown", [math.nan, math.inf, -math.inf, "10", 101 * 365 * 24 * 3600])
def test_a_countdown_that_is_not_a_duration(rd: RedisDelay, client: redis.Redis, countdown: Any) -> None:
    before = snapshot(client, rd)
    with pytest.raises(ScheduleError, match="countdown must be"):
        task_on(rd).apply_async((1,), countdown=countdown)
    assert snapshot(client, rd) == before


def test_naive_and_aware_eta(make_app: MakeApp) -> None:
    _, rd = make_app(timezone="Asia/Tokyo")  # Celery reads a naive eta as UTC (maybe_make_aware), whatever the zone
    echo = task_on(rd)
    aware = datetime(2099, 1, 1, 21, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    naive = datetime(2099, 1, 1, 12, 0)  # 12:00 UTC is 21:00 in Tokyo
    a, b = echo.apply_async((1,), eta=aware), echo.apply_async((2,), eta=naive)
    assert rd.find(a.id).score_ms == rd.find(b.id).score_ms == aware.timestamp() * 1000  # type: ignore[union-attr]


def test_eta_far_in_the_past_runs_at_once_and_far_in_the_future_waits(rd: RedisDelay) -> None:
    echo = task_on(rd)
    past = echo.apply_async((1,), eta=datetime(1990, 1, 1, tzinfo=UTC))
    future = echo.apply_async((2,), eta=datetime(2999, 1, 1, tzinfo=UTC))
    assert rd.tick()["released"] == 1
    assert rd.find(past.id).state == "inflight"  # type: ignore[union-attr]
    assert rd.find(future.id).state == "delayed"  # type: ignore[union-attr]
    with pytest.raises(ScheduleError, match="eta"):
        echo.apply_async((3,), eta="not a date")


class Consumer:
    """Stands for the worker's consumer, the sender of ``task_unknown``: all the handler reads is its app."""

    def __init__(self, app: object) -> None:
        self.app = app


def test_a_task_unknown_to_the_worker_is_dead_lettered_with_the_reason(rd: RedisDelay) -> None:
    echo = task_on(rd)
    result = echo.apply_async((1,), countdown=0)
    assert rd.tick()["released"] == 1
    # What a worker's consumer sends when it receives a message for a task it does not have.
    consumer = Consumer(rd.app)
    signals.task_unknown.send(sender=consumer, message=None, exc=None, name=echo.name, id=result.id)
    entry = rd.find(result.id)
    assert entry is not None
    assert entry.state == "dead"
    assert "not registered on the worker" in entry.meta["why"]
    # Another app's unknown task, or one of ours that is not in flight, is left alone.
    parked = echo.apply_async((2,), countdown=60)
    signals.task_unknown.send(sender=consumer, message=None, exc=None, name=echo.name, id=parked.id)
    signals.task_unknown.send(sender=Consumer(object()), message=None, exc=None, name="x", id="y")
    assert rd.find(parked.id).state == "delayed"  # type: ignore[union-attr]
    assert rd.find("y") is None


@pytest.mark.parametrize("fast", [None, False], ids=["fast path", "kombu path"])
@pytest.mark.parametrize(
    "payload", [b"not ours", b'{"v": 1, "task": "trunc', b"\xff\xfe\x00garbage", b'{"body": "eA==", "headers"']
)
def test_a_payload_written_by_something_else_is_dead_lettered(
    make_app: MakeApp, client: redis.Redis, fast: bool | None, payload: bytes
) -> None:
    _, rd = make_app(redisdelay_fast_release=fast)
    echo = task_on(rd)
    bad, good = echo.apply_async((1,), countdown=0), echo.apply_async((2,), countdown=0)
    client.hset(rd.keys.payloads, bad.id, payload)
    report = rd.tick()
    assert (report["released"], report["dead"]) == (1, 1)
    entry = rd.find(bad.id)
    assert entry is not None
    assert entry.state == "dead"
    assert entry.meta["why"]
    assert entry.envelope == payload, "kept as it was, for inspection"
    assert rd.find(good.id).state == "inflight"  # type: ignore[union-attr]


@pytest.mark.parametrize("fast", [None, False], ids=["fast path", "kombu path"])
def test_the_message_of_another_call_whose_id_ends_like_this_one_is_not_pushed(
    make_app: MakeApp, client: redis.Redis, fast: bool | None
) -> None:
    _, rd = make_app(redisdelay_fast_release=fast)
    echo = task_on(rd)
    suffix = uuid.uuid4().hex
    other = echo.apply_async((1,), countdown=600, task_id=f"x{suffix}")
    this = echo.apply_async((2,), countdown=0, task_id=suffix)
    client.hset(rd.keys.payloads, this.id, client.hget(rd.keys.payloads, other.id))  # a copy gone wrong
    rd.tick()
    pushed = [json.loads(m)["headers"]["id"] for m in client.lrange(rd.app.conf.task_default_queue, 0, -1)]
    assert other.id not in pushed, "another call's message pushed as this one's"
    assert rd.find(this.id).state == "dead"  # type: ignore[union-attr]


def test_a_zset_member_without_payload_is_dead_lettered(rd: RedisDelay, client: redis.Redis) -> None:
    echo = task_on(rd)
    good = echo.apply_async((1,), countdown=0)
    client.zadd(rd.keys.delayed, {"orphan": 0})
    report = rd.tick()
    assert (report["released"], report["dead"]) == (1, 1)
    assert rd.find("orphan").meta["why"] == "payload missing at release"  # type: ignore[union-attr]
    assert rd.find(good.id).state == "inflight"  # type: ignore[union-attr]


def test_a_key_of_ours_holding_another_type_is_refused_before_any_write(rd: RedisDelay, client: redis.Redis) -> None:
    client.set(rd.keys.delayed, "someone else's string")
    before = snapshot(client, rd)
    with pytest.raises(StoreUnavailableError, match=r"WRONGTYPE .* holds a string, expected a zset; delete or rename"):
        task_on(rd).apply_async((1,), countdown=10)
    assert snapshot(client, rd) == before


@pytest.mark.parametrize("url", ["http://localhost:6379", "redis-sentinel", 42])
def test_a_bad_redisdelay_url(make_app: MakeApp, url: Any) -> None:
    _, rd = make_app(redisdelay_url=url)
    with pytest.raises(ConfigurationError, match="redisdelay_url must be a redis://"):
        task_on(rd).apply_async((1,), countdown=10)


@pytest.fixture
def strict_user(client: redis.Redis) -> Iterator[str]:
    client.acl_setuser("strict", enabled=True, passwords=["+right"], commands=["+@all"], keys=["*"], reset=True)
    yield "strict"
    client.acl_deluser("strict")


def test_a_redis_that_refuses_auth(make_app: MakeApp, redis_server: RedisServer, strict_user: str) -> None:
    _, rd = make_app(redisdelay_url=f"redis://{strict_user}:wrong@127.0.0.1:{redis_server.port}/0")
    with pytest.raises(StoreUnavailableError, match=r"could not park call .*(WRONGPASS|invalid username-password)"):
        task_on(rd).apply_async((1,), countdown=10)


def test_a_redis_that_is_down_at_park_time(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(StoreUnavailableError, match="Redis is unreachable"):
        task_on(rd).apply_async((1,), countdown=10)


def test_an_evicting_maxmemory_policy_is_reported(rd: RedisDelay, client: redis.Redis) -> None:
    policy = client.config_get("maxmemory-policy")["maxmemory-policy"]
    assert rd.check_server() == []
    try:
        client.config_set("maxmemory-policy", "allkeys-lru")
        [problem] = rd.check_server()
        assert "allkeys-lru" in problem
        assert "noeviction" in problem
    finally:
        client.config_set("maxmemory-policy", policy)


def test_a_server_that_refuses_config_still_says_that_nothing_releases() -> None:
    """A managed Redis often disables CONFIG: the eviction policy cannot be read, and nothing is said of it; but the
    problem found before asking, that nothing releases, is still reported (it was dropped with the policy)."""
    server = RedisServer(extra_args=["--rename-command", "CONFIG", '""']).start()
    app = Celery("no-config", broker=f"{server.url}/0", set_as_current=False)
    app.conf.update(redisdelay_key_prefix=f"noconfig-{uuid.uuid4().hex[:8]}", redisdelay_precise_release=False)
    try:
        rd = RedisDelay(app)
        with pytest.raises(redis.ResponseError):
            rd.client.config_get("maxmemory-policy")
        [problem] = rd.check_server()
        assert problem.startswith("nothing releases"), problem
    finally:
        app.close()
        server.stop()


ODD = ["{braces}", "with space", "ключ ✓", "a:b:c", '"quoted"', "new\nline", ""]


@pytest.mark.parametrize("odd", ODD[:-1])
def test_odd_characters_in_keys_and_lock_names(rd: RedisDelay, odd: str) -> None:
    echo = task_on(rd)
    first = echo.apply_async((1,), countdown=60, unique_key=odd)
    assert echo.apply_async((2,), countdown=60, unique_key=odd).id == first.id
    debounced = echo.apply_async((3,), countdown=60, debounce_key=odd)
    assert echo.apply_async((4,), countdown=60, debounce_key=odd).id == debounced.id

    @rd.batched(name="tests.bad.group", size=2)
    def group(key: str, items: list[Any]) -> None: ...

    assert group.add(odd, 1) is None
    assert group.add(odd, 2) is not None
    with rd.lock(odd or "-", timeout=5):
        assert not rd.lock(odd or "-", timeout=5).acquire(blocking=False)
    with pytest.raises(ScheduleError):
        echo.apply_async((5,), countdown=60, unique_key=ODD[-1])  # the empty string is refused
    with pytest.raises(ScheduleError):
        group.add(timedelta(1), 1)  # type: ignore[arg-type]  # a key must be a string


def test_a_misspelt_option_of_the_decorators_warns_naming_ours(rd: RedisDelay) -> None:
    with pytest.warns(UserWarning, match=r"limit_rat of task tests\.bad\.rat .* did you mean limit_rate\?") as caught:

        @rd.delayed(name="tests.bad.rat", limit_rat="10/s")
        def rat() -> None: ...

    assert [warning.filename for warning in caught] == [__file__], "the warning points at the decorated task"
    assert rat.limit_rate is None, "Celery kept it as an attribute of the task, where it does nothing"
    with pytest.warns(UserWarning, match=r"max_wiat .* did you mean max_wait\?"):

        @rd.batched(name="tests.bad.wiat", max_wiat=30)
        def wiat(key: str, items: list[Any]) -> None: ...


def test_celerys_task_options_and_attributes_of_ones_own_pass_silently(rd: RedisDelay) -> None:
    celery: dict[str, Any] = {
        "bind": True, "queue": "q", "acks_late": True, "max_retries": 3, "autoretry_for": (ValueError,),
        "retry_backoff": True, "retry_backoff_max": 60, "retry_jitter": False, "retry_kwargs": {"max_retries": 2},
        "dont_autoretry_for": (KeyError,), "rate_limit": "10/s", "time_limit": 60, "soft_time_limit": 50,
        "default_retry_delay": 5, "ignore_result": True, "track_started": True, "acks_on_failure_or_timeout": True,
        "reject_on_worker_lost": True, "expires": 60, "priority": 3, "serializer": "json", "typing": False,
        "store_errors_even_if_ignored": True, "throws": (KeyError,), "send_events": False,
    }  # fmt: skip
    own: dict[str, Any] = {"owner": "team-a", "audit_category": "orders", "retries_alert": 5}
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @rd.delayed(name="tests.bad.celerys", countdown=5, limit_rate="5/s", **celery, **own)
        def celerys(self: Any) -> None: ...

    assert (celerys.max_retries, celerys.rate_limit, celerys.owner) == (3, "10/s", "team-a")


def test_workers_and_beat_log_the_evicting_policy_when_they_start(
    rd: RedisDelay, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    policy = client.config_get("maxmemory-policy")["maxmemory-policy"]
    try:
        client.config_set("maxmemory-policy", "allkeys-lru")
        with caplog.at_level(logging.WARNING, logger="celery_redisdelay.extension"):
            signals.worker_ready.send(sender=Consumer(rd.app))
            signals.beat_init.send(sender=Consumer(rd.app))
            signals.worker_ready.send(sender=Consumer(object()))  # another app's worker: not ours to judge
    finally:
        client.config_set("maxmemory-policy", policy)
    warnings = [r.getMessage() for r in caplog.records if "allkeys-lru" in r.getMessage()]
    assert len(warnings) == 2
    assert all(w.startswith("redisdelay: WARNING:") for w in warnings)
