"""The releaser against real redis-servers: due calls published to the Redis broker (db 0), bad
envelopes dead-lettered, concurrent releasers, and a store or broker that fails mid-tick."""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError

from celery_redisdelay import DelayedTask, RedisDelay, StoreUnavailableError
from celery_redisdelay.testing import RedisServer, free_port, wait_for

MakeApp = Callable[..., tuple[Celery, RedisDelay]]
WAIT = 5.0


def redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def queue_of(rd: RedisDelay) -> str:
    queue: str = rd.app.conf.task_default_queue
    return queue


def broker_messages(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The kombu messages waiting in a Redis broker queue (a list; LPUSHed, so newest first)."""
    return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


def message_ids(client: redis.Redis, queue: str) -> list[str]:
    return [message["headers"]["id"] for message in broker_messages(client, queue)]


def message_args(message: dict[str, Any]) -> Any:
    assert message["properties"]["body_encoding"] == "base64"
    args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    return args, kwargs


def echo_task(rd: RedisDelay) -> DelayedTask:
    @rd.delayed(name=f"tests.echo.{uuid.uuid4().hex[:8]}")
    def echo(value: Any = None) -> Any:
        return value

    return echo


def repark(rd: RedisDelay, call_id: str, due_ms: int) -> None:
    """Park a stored call again with a chosen due time (to fix the order of a batch)."""
    found = rd.find(call_id)
    assert found is not None and found.envelope is not None
    meta = {key: value for key, value in found.meta.items() if key not in {"d", "s"}}
    rd.store.park(call_id, found.envelope, meta, due_ms=due_ms)


@pytest.fixture
def app_on() -> Iterator[MakeApp]:
    """Apps whose broker and store may be any Redis (not only the session's)."""
    made: list[tuple[Celery, RedisDelay]] = []

    def make(broker_url: str, **conf: Any) -> tuple[Celery, RedisDelay]:
        app = Celery(f"release{len(made)}", broker=broker_url, set_as_current=False)
        app.conf.update(
            {
                "redisdelay_key_prefix": f"test-{uuid.uuid4().hex[:8]}",
                "task_default_queue": f"queue-{uuid.uuid4().hex[:8]}",
                **conf,
            }
        )
        made.append((app, RedisDelay(app)))
        return made[-1]

    yield make
    for app, extension in made:
        if "client" in vars(extension.depot):
            extension.client.close()
        app.close()


@pytest.fixture
def own_servers() -> Iterator[list[RedisServer]]:
    """Dedicated redis-servers a test may stop; every one appended here is stopped at the end."""
    servers: list[RedisServer] = []
    yield servers
    for server in servers:
        server.stop()


# -- releasing -------------------------------------------------------------------------------------


def test_tick_publishes_due_calls_as_kombu_messages(rd: RedisDelay, client: redis.Redis) -> None:
    echo = echo_task(rd)
    due = {echo.apply_async((n,), countdown=0).id: n for n in range(3)}
    later = echo.apply_async(("later",), countdown=60)

    assert rd.tick() == {"released": 3, "requeued": 0, "dead": 0, "batches": 0}

    queue = queue_of(rd)
    messages = broker_messages(client, queue)
    assert sorted(message["headers"]["id"] for message in messages) == sorted(due)
    for message in messages:
        headers = message["headers"]
        assert headers["task"] == echo.name
        assert headers["eta"] is None, "the call is due now: the worker must not wait again"
        assert message["content-type"] == "application/json"
        assert message["properties"]["delivery_info"]["routing_key"] == queue
        assert message_args(message) == ([due[headers["id"]]], {})
    for call_id in due:
        found = rd.find(call_id)
        assert found is not None
        assert (found.state, found.meta["s"], found.meta["d"]) == ("inflight", "queued", 1)
    waiting = rd.find(later.id)
    assert waiting is not None and waiting.state == "delayed"

    assert rd.tick() == {"released": 0, "requeued": 0, "dead": 0, "batches": 0}
    assert client.llen(queue) == 3, "a second tick publishes nothing again"

    # kombu itself reads the messages back (what a worker's consumer does).
    with rd.app.connection_for_read() as connection:
        channel = connection.default_channel
        received = [channel.basic_get(queue, no_ack=True) for _ in range(3)]
        assert channel.basic_get(queue, no_ack=True) is None
    got = {message.headers["id"]: message.decode() for message in received}
    assert {call_id: payload[0] for call_id, payload in got.items()} == {k: [v] for k, v in due.items()}


def test_call_with_a_queue_option_lands_in_that_queue(rd: RedisDelay, client: redis.Redis) -> None:
    echo = echo_task(rd)
    other = f"other-xyz-{uuid.uuid4().hex[:8]}"
    try:
        routed = echo.apply_async(("routed",), countdown=0, queue=other)
        default = echo.apply_async(("default",), countdown=0)
        assert rd.tick()["released"] == 2
        assert message_ids(client, other) == [routed.id]
        assert message_ids(client, queue_of(rd)) == [default.id]
    finally:
        client.delete(other)


def test_tick_sweeps_then_releases_calls_whose_releaser_died(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_release_batch=2)  # more orphans than one sweep batch
    echo = echo_task(rd)
    orphans = {echo.apply_async((n,), countdown=0).id for n in range(3)}
    claimed = rd.store.claim(10, 1)  # by a releaser that then died before publishing
    assert {call.id for call in claimed} == orphans
    wait_for(lambda: rd.stats()["inflight_expired"] == 3, WAIT, "the claim deadlines to pass")
    assert rd.tick() == {"released": 3, "requeued": 3, "dead": 0, "batches": 0}
    assert sorted(message_ids(client, queue_of(rd))) == sorted(orphans)
    for call_id in orphans:
        found = rd.find(call_id)
        assert found is not None
        assert (found.state, found.meta["s"], found.meta["d"]) == ("inflight", "queued", 2)


def test_tick_dead_letters_calls_out_of_deliveries(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_max_deliveries=1)
    echo = echo_task(rd)
    doomed = echo.apply_async(("doomed",), countdown=0)
    assert rd.store.claim(10, 1)[0].id == doomed.id
    wait_for(lambda: rd.stats()["inflight_expired"] == 1, WAIT, "the claim deadline to pass")
    assert rd.tick() == {"released": 0, "requeued": 0, "dead": 1, "batches": 0}
    assert client.llen(queue_of(rd)) == 0
    assert [entry.id for entry in rd.dead_letters()] == [doomed.id]
    assert rd.dead_letters()[0].meta["why"] == "not acknowledged after 1 deliveries (last seen claimed)"


def test_tick_releases_every_due_call_past_a_member_without_payload(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_release_batch=2)
    echo = echo_task(rd)
    client.zadd(rd.keys.delayed, {"ghost": redis_ms(client) - 1_000})
    ids = {echo.apply_async((n,), countdown=0).id for n in range(3)}
    report = rd.tick()
    assert set(message_ids(client, queue_of(rd))) == ids
    assert report["released"] == 3
    assert report["dead"] == 1, "the ghost buried by the claim script is counted"
    assert rd.stats()["due"] == 0


# -- bad envelopes ---------------------------------------------------------------------------------


_DROP = object()


def _json_edit(**changes: Any) -> Callable[[bytes], bytes]:
    def edit(good: bytes) -> bytes:
        data = json.loads(good)
        for key, value in changes.items():
            if value is _DROP:
                del data[key]
            else:
                data[key] = value
        return json.dumps(data).encode()

    return edit


GARBAGE: list[Any] = [
    pytest.param(lambda good: b"not json", id="not-json"),
    pytest.param(lambda good: good[: len(good) // 2], id="truncated"),
    pytest.param(lambda good: good.replace(b'"task": "', b'"task": "\xff\xfe', 1), id="invalid-utf8"),
    pytest.param(lambda good: b"\xff\xfe" + good[2:], id="invalid-utf8-start"),
    pytest.param(lambda good: b"", id="empty"),
    pytest.param(lambda good: b"[1, 2]", id="json-array"),
    pytest.param(_json_edit(v=2), id="other-format-version"),
    pytest.param(_json_edit(body=_DROP), id="no-body"),
    pytest.param(_json_edit(headers=["id"]), id="headers-not-a-mapping"),
    pytest.param(_json_edit(surprise=1), id="unknown-field"),
    pytest.param(_json_edit(properties="oops"), id="properties-not-a-mapping"),
    pytest.param(_json_edit(retry_policy="oops"), id="retry-policy-not-a-mapping"),
    pytest.param(lambda good: b"[" * 100_000, id="nested-too-deep"),
    pytest.param(_json_edit(queues=[5]), id="queues-not-names"),
    pytest.param(_json_edit(delivery_mode="x"), id="bad-delivery-mode"),
]


@pytest.mark.parametrize("spoil", GARBAGE)
def test_garbage_envelope_is_dead_lettered_and_the_good_ones_released(
    make_app: MakeApp, client: redis.Redis, spoil: Callable[[bytes], bytes]
) -> None:
    _, rd = make_app(redisdelay_fast_release=False)  # spoil the generic path's envelope (test_wire: the other)
    echo = echo_task(rd)
    first = echo.apply_async(("first",), countdown=0).id
    last = echo.apply_async(("last",), countdown=0).id
    found = rd.find(first)
    assert found is not None and found.envelope is not None
    garbage = spoil(found.envelope)
    now = redis_ms(client)
    repark(rd, first, now - 3_000)
    rd.store.park("garbage", garbage, {"t": echo.name}, due_ms=now - 2_000)
    repark(rd, last, now - 1_000)

    report = rd.tick()

    assert sorted(message_ids(client, queue_of(rd))) == sorted([first, last])
    assert report == {"released": 2, "requeued": 0, "dead": 1, "batches": 0}
    dead = rd.find("garbage")
    assert dead is not None
    assert dead.state == "dead"
    assert "envelope" in dead.meta["why"]
    assert dead.envelope == garbage, "the bytes are kept for inspection"
    assert [entry.id for entry in rd.dead_letters()] == ["garbage"]
    assert rd.tick() == {"released": 0, "requeued": 0, "dead": 0, "batches": 0}


# -- concurrent releasers --------------------------------------------------------------------------


def test_concurrent_releasers_publish_each_call_exactly_once(make_app: MakeApp, client: redis.Redis) -> None:
    calls, threads = 2000, 4
    first_app, first = make_app(redisdelay_release_batch=50)
    shared = {
        "redisdelay_key_prefix": first_app.conf.redisdelay_key_prefix,
        "task_default_queue": first_app.conf.task_default_queue,
    }
    releasers = [first]
    for _ in range(threads - 1):
        app, extension = make_app(redisdelay_release_batch=50)
        app.conf.update(shared)
        releasers.append(extension)
    assert len({extension.keys.delayed for extension in releasers}) == 1
    queue = queue_of(first)
    echo = echo_task(first)
    parked = {echo.apply_async((n,), countdown=0).id for n in range(calls)}
    assert first.stats()["due"] == calls
    start = threading.Barrier(threads)

    def release_all(extension: RedisDelay) -> int:
        start.wait(WAIT)
        released = 0
        while True:
            released += extension.tick()["released"]
            if extension.stats()["due"] == 0:
                return released

    try:
        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(release_all, extension) for extension in releasers]
            per_thread = [future.result(timeout=60) for future in futures]
        published = message_ids(client, queue)
        assert len(published) == calls
        assert len(set(published)) == calls, "a call was published twice"
        assert set(published) == parked
        assert sum(per_thread) == calls
        assert first.stats() == {
            "delayed": 0,
            "inflight": calls,
            "dead": 0,
            "due": 0,
            "inflight_expired": 0,
            "batch_groups": 0,
            "batch_items": 0,
            "limited": 0,
            "paused": 0,
        }
    finally:
        client.delete(queue)


# -- failures mid-tick -----------------------------------------------------------------------------


def test_tick_when_redis_goes_away_and_comes_back(own_servers: list[RedisServer], app_on: MakeApp) -> None:
    server = RedisServer().start()
    own_servers.append(server)
    _, rd = app_on(f"{server.url}/0")
    echo = echo_task(rd)
    echo.apply_async(("lost with the server",), countdown=0)
    server.stop()

    with pytest.raises(StoreUnavailableError, match="could not sweep timed-out calls: Redis is unreachable"):
        rd.tick()
    with pytest.raises(StoreUnavailableError, match="unreachable"):
        rd.store.park("while-down", b"{}", {}, countdown_ms=0)

    again = RedisServer(port=server.port).start()
    own_servers.append(again)
    client = redis.Redis.from_url(f"{again.url}/0")
    try:
        parked = echo.apply_async(("after restart",), countdown=0)
        assert rd.tick() == {"released": 1, "requeued": 0, "dead": 0, "batches": 0}
        assert message_ids(client, queue_of(rd)) == [parked.id]
    finally:
        client.close()


#: The two ways a release reaches a broker on another server: a pipeline of stored broker messages
#: (the default for a Redis broker), and kombu's publish (``redisdelay_fast_release = False``).
PUBLISH_PATHS = pytest.mark.parametrize("fast_release", [None, False], ids=["pipeline", "kombu"])


@PUBLISH_PATHS
def test_broker_unreachable_gives_the_claimed_calls_back(
    redis_server: RedisServer, app_on: MakeApp, client: redis.Redis, fast_release: bool | None
) -> None:
    _, rd = app_on(
        f"redis://127.0.0.1:{free_port()}/0",
        redisdelay_url=f"{redis_server.url}/0",
        redisdelay_fast_release=fast_release,
        broker_connection_retry=False,
        broker_connection_max_retries=0,
        task_publish_retry=False,
        task_publish_retry_policy={"max_retries": 0},
    )
    echo = echo_task(rd)
    ids = [echo.apply_async((n,), countdown=0).id for n in range(3)]
    now = redis_ms(client)
    rd.store.park("garbage", b"not json", {}, due_ms=now - 1_000)  # first in the batch: buried before the failure

    with pytest.raises(OperationalError, match="Connection refused"):
        rd.tick()

    for call_id in ids:
        back = rd.find(call_id)
        assert back is not None
        assert (back.state, back.meta["s"], back.meta["d"]) == ("delayed", "delayed", 0)
        assert back.score_ms <= redis_ms(client), "given back due at once"
    garbage = rd.find("garbage")
    assert garbage is not None and garbage.state == "dead"
    assert rd.stats() == {
        "delayed": 3,
        "inflight": 0,
        "dead": 1,
        "due": 3,
        "inflight_expired": 0,
        "batch_groups": 0,
        "batch_items": 0,
        "limited": 0,
        "paused": 0,
    }


@PUBLISH_PATHS
def test_broker_refusing_mid_batch_gives_back_only_the_unpublished_calls(
    own_servers: list[RedisServer], redis_server: RedisServer, app_on: MakeApp, fast_release: bool | None
) -> None:
    """The broker (its own redis-server) runs out of memory part-way through a batch."""
    broker = RedisServer().start()
    own_servers.append(broker)
    _, rd = app_on(f"{broker.url}/0", redisdelay_url=f"{redis_server.url}/0", redisdelay_fast_release=fast_release)
    assert rd.wire_format is (fast_release is None)
    queue = queue_of(rd)
    bclient = redis.Redis.from_url(f"{broker.url}/0")
    try:
        echo = echo_task(rd)
        warm = echo.apply_async(("warm-up",), countdown=0)  # declares the queue while memory allows it
        assert rd.tick()["released"] == 1
        assert rd.store.ack(warm.id)
        bclient.delete(queue)

        calls = 12
        ids = {echo.apply_async(("x" * 100_000,), countdown=0).id for _ in range(calls)}
        bclient.config_set("maxmemory", bclient.info("memory")["used_memory"] + 1_000_000)
        with pytest.raises(OperationalError, match="maxmemory"):
            rd.tick()

        published = set(message_ids(bclient, queue))
        assert 0 < len(published) < calls, "the failure must come part-way through the batch"
        for call_id in ids:
            found = rd.find(call_id)
            assert found is not None
            if call_id in published:
                assert (found.state, found.meta["s"], found.meta["d"]) == ("inflight", "queued", 1)
            else:
                assert (found.state, found.meta["s"], found.meta["d"]) == ("delayed", "delayed", 0)

        bclient.config_set("maxmemory", 0)
        assert rd.tick()["released"] == calls - len(published)
        everything = message_ids(bclient, queue)
        assert sorted(everything) == sorted(ids), "each call exactly once"
    finally:
        bclient.close()
