"""The fast release path: the message the release script pushes is the message kombu would push.

Each case parks the same call twice, once on an app with the fast path and once with
``redisdelay_fast_release=False`` (kombu publishes), releases both and compares the two broker
messages field by field; only the delivery tag (unique per delivery) differs. Then a stock Celery
worker's view is checked: the message decodes to the same task, arguments and options.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Exchange, Queue

from celery_redisdelay import ConfigurationError, RedisDelay
from celery_redisdelay.message import wire
from celery_redisdelay.message.envelope import EnvelopeError
from celery_redisdelay.message.marks import DELIVERY_HEADER, PARKED_HEADER, RELEASED_HEADER
from celery_redisdelay.message.stored import decode_stored
from celery_redisdelay.message.wire import PREFIX, BrokerLayout
from celery_redisdelay.producer.kept import KEPT_OPTIONS
from celery_redisdelay.store.calls import server_ms
from celery_redisdelay.testing import wait_for

MakeApp = Callable[..., tuple[Celery, RedisDelay]]


def pair(make_app: MakeApp, **conf: Any) -> tuple[RedisDelay, RedisDelay]:
    """Two extensions alike but for the release path, sharing one queue setup."""
    queue = f"queue-{uuid.uuid4().hex[:8]}"
    common = {"task_default_queue": queue, **conf}
    _, fast = make_app(**common)
    _, slow = make_app(redisdelay_fast_release=False, **common)
    assert fast.fast_release is True
    assert slow.fast_release is False
    return fast, slow


def task_on(rd: RedisDelay, **options: Any) -> Any:
    @rd.delayed(name="tests.wire.send", **options)
    def send(x: Any, y: Any = None) -> None: ...

    return send


def released(rd: RedisDelay, client: redis.Redis, keys: list[str]) -> list[dict[str, Any]]:
    before = {key: client.llen(key) for key in keys}
    assert rd.tick()["released"] == 1
    grown = [key for key in keys if client.llen(key) > before[key]]
    assert len(grown) == 1, f"expected one list to grow, got {grown}"
    message = json.loads(client.lpop(grown[0]))  # type: ignore[arg-type]
    return [message, {"list": grown[0]}]


KOMBU_MARKS = (PARKED_HEADER, DELIVERY_HEADER, RELEASED_HEADER)


def comparable(message: dict[str, Any]) -> dict[str, Any]:
    """A message minus what differs between two apps and two instants: the delivery tag, the app's
    reply queue, the absolute expiry computed at call time and the relative one computed at publish
    (present or not, they must agree), and the marks a delivery through kombu carries in place of the stored
    message's own tag: parked, its delivery's number and when it was released (the worker takes them out before
    the task runs: message/marks.py)."""
    properties = {k: v for k, v in message["properties"].items() if k not in ("delivery_tag", "reply_to")}
    if "expiration" in properties:
        properties["expiration"] = True
    headers = {k: v for k, v in message["headers"].items() if k not in KOMBU_MARKS}
    headers["expires"] = message["headers"].get("expires") is not None
    return {**message, "properties": properties, "headers": headers}


CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("default", {}, {}),
    ("priority", {}, {"priority": 7}),
    ("low priority", {}, {"priority": 2}),
    ("headers and expiry", {}, {"headers": {"tenant": "t1"}, "expires": 3600, "time_limit": 5}),
    ("pickle", {"task_serializer": "pickle", "accept_content": ["json", "pickle"]}, {"args": ({1, 2}, b"\xff")}),
    ("compressed", {}, {"compression": "zlib"}),
    ("transient", {}, {"delivery_mode": 1}),
]


@pytest.mark.parametrize(("name", "conf", "options"), CASES, ids=[case[0] for case in CASES])
def test_fast_and_kombu_paths_push_identical_messages(
    make_app: MakeApp, client: redis.Redis, name: str, conf: dict[str, Any], options: dict[str, Any]
) -> None:
    fast, slow = pair(make_app, **conf)
    options = dict(options)
    args = options.pop("args", (1,))
    kwargs = {"y": [3]} if len(args) == 1 else {}
    keys = fast.broker_layout.list_keys(fast.app)
    messages = []
    for rd in (fast, slow):
        result = task_on(rd).apply_async(args, kwargs, countdown=0, task_id=f"same-id-{name}", **options)
        payload = rd.find(result.id).envelope  # type: ignore[union-attr]
        assert payload is not None
        assert payload.startswith(PREFIX) == (rd is fast)
        messages.append(released(rd, client, keys))
    (fast_message, fast_list), (slow_message, slow_list) = messages
    assert fast_list == slow_list
    assert comparable(fast_message) == comparable(slow_message)
    assert fast_message["properties"]["delivery_tag"] == f"same-id-{name}.1"
    # Each says it is a parked call's delivery: the stored message by its tag, kombu's by a header.
    assert not set(KOMBU_MARKS) & set(fast_message["headers"])
    assert slow_message["headers"][PARKED_HEADER] == 1 and slow_message["headers"][DELIVERY_HEADER] == 1
    assert isinstance(slow_message["headers"][RELEASED_HEADER], int)


@pytest.mark.parametrize(("name", "conf", "options"), CASES, ids=[case[0] for case in CASES])
def test_a_store_elsewhere_pushes_the_same_message_from_python(
    make_app: MakeApp, client: redis.Redis, redis_server: Any, name: str, conf: dict[str, Any], options: dict[str, Any]
) -> None:
    queue = f"queue-{uuid.uuid4().hex[:8]}"
    _, fast = make_app(task_default_queue=queue, **conf)
    _, piped = make_app(task_default_queue=queue, redisdelay_url=f"{redis_server.url}/3", **conf)
    assert (fast.fast_release, piped.fast_release, piped.wire_format) == (True, False, True)
    options = dict(options)
    args = options.pop("args", (1,))
    kwargs = {"y": [3]} if len(args) == 1 else {}
    keys = fast.broker_layout.list_keys(fast.app)
    messages = []
    for rd in (fast, piped):
        result = task_on(rd).apply_async(args, kwargs, countdown=0, task_id=f"piped-{name}", **options)
        payload = rd.find(result.id).envelope  # type: ignore[union-attr]
        assert payload is not None and payload.startswith(PREFIX)
        messages.append(released(rd, client, keys))
    (fast_message, fast_list), (piped_message, piped_list) = messages
    assert fast_list == piped_list
    assert comparable(fast_message) == comparable(piped_message)
    assert piped_message["properties"]["delivery_tag"] == f"piped-{name}.1"


def test_the_pipeline_gives_each_delivery_its_own_tag(
    make_app: MakeApp, client: redis.Redis, redis_server: Any
) -> None:
    _, piped = make_app(redisdelay_url=f"{redis_server.url}/3")
    keys = piped.broker_layout.list_keys(piped.app)
    result = task_on(piped).apply_async((1,), countdown=0, visibility_timeout=0.01)
    [first, where] = released(piped, client, keys)
    piped.store.start(result.id, 10)
    # One tick sweeps the call back and releases it again.
    assert wait_for(lambda: (r := piped.tick())["requeued"] and r, 10, "the sweep")["released"] == 1
    second = json.loads(client.lpop(where["list"]))  # type: ignore[arg-type]
    assert (first["properties"]["delivery_tag"], second["properties"]["delivery_tag"]) == (
        f"{result.id}.1",
        f"{result.id}.2",
    )


def test_a_routed_queue_and_its_priority_list(make_app: MakeApp, client: redis.Redis) -> None:
    queue = f"orders-{uuid.uuid4().hex[:6]}"
    conf = {"task_queues": [Queue(queue, Exchange(queue), routing_key=queue)], "task_default_queue": queue}
    fast, slow = pair(make_app, **conf)
    keys = fast.broker_layout.list_keys(fast.app)
    sep = BrokerLayout().sep
    assert f"{queue}{sep}6" in keys
    outs = []
    for rd in (fast, slow):
        task_on(rd).apply_async((1,), priority=6, task_id="r1")
        outs.append(released(rd, client, keys))
    assert outs[0][1] == outs[1][1] == {"list": f"{queue}{sep}6"}
    assert comparable(outs[0][0]) == comparable(outs[1][0])


def test_a_topic_exchange_takes_the_kombu_path(make_app: MakeApp, client: redis.Redis) -> None:
    queue = f"topic-{uuid.uuid4().hex[:6]}"
    topic = Queue(queue, Exchange(queue, type="topic"), routing_key="a.#")
    _, rd = make_app(task_queues=[topic], task_default_queue=queue)
    result = task_on(rd).apply_async((1,), queue=queue, routing_key="a.b")
    payload = rd.find(result.id).envelope  # type: ignore[union-attr]
    assert payload is not None
    assert not payload.startswith(PREFIX)


def test_a_broker_elsewhere_takes_the_pipeline_not_the_script(make_app: MakeApp, redis_server: Any) -> None:
    _, other_db = make_app(redisdelay_url=f"{redis_server.url}/3")
    assert other_db.fast_release is False
    assert other_db.wire_format is True, "the broker is a Redis: the message is stored in its format"
    assert other_db.releaser.lists and not other_db.releaser.in_script
    _, forced = make_app(redisdelay_url=f"{redis_server.url}/3", redisdelay_fast_release=True)
    with pytest.raises(ConfigurationError, match="same server and database"):
        _ = forced.fast_release


def test_stored_broker_message_decodes_to_its_envelope(make_app: MakeApp) -> None:
    fast, _ = pair(make_app)
    eta = datetime.now(UTC) + timedelta(hours=1)
    result = task_on(fast).apply_async((1,), {"y": "z"}, eta=eta, headers={"h": 1})
    envelope = decode_stored(fast.find(result.id).envelope)  # type: ignore[union-attr,arg-type]
    assert envelope.task == "tests.wire.send"
    assert envelope.headers["id"] == result.id
    assert envelope.headers["h"] == 1
    assert envelope.headers["eta"] is None  # the due time lives in the store, not in the message
    assert json.loads(envelope.body)[:2] == [[1], {"y": "z"}]


@pytest.mark.parametrize("raw", [PREFIX, PREFIX + b"x", b'{"body": "eA==", "headers": {}}'])
def test_malformed_broker_messages_are_refused(raw: bytes) -> None:
    with pytest.raises(EnvelopeError):
        decode_stored(raw)


def test_a_stored_message_is_pushed_with_a_delivery_tag_of_its_own_each_time(
    make_app: MakeApp, client: redis.Redis
) -> None:
    fast, _ = pair(make_app)
    keys = fast.broker_layout.list_keys(fast.app)
    result = task_on(fast).apply_async((1,), countdown=0, visibility_timeout=0.01)
    [first, where] = released(fast, client, keys)
    entry = fast.find(result.id)
    assert entry is not None
    assert (entry.state, entry.meta["d"], entry.meta["s"], entry.meta["l"]) == ("inflight", 1, "queued", where["list"])
    assert entry.meta["r"] == 10  # the rest of the metadata is kept as parked
    fast.store.start(result.id, 10)  # a worker starts it (10 ms to run) and dies

    def swept_and_released() -> dict[str, int] | None:
        report = fast.tick()
        return report if report["requeued"] else None

    assert wait_for(swept_and_released, 10, "the sweep")["released"] == 1
    raw_second: Any = client.lpop(where["list"])
    second = json.loads(raw_second)
    assert first["properties"]["delivery_tag"] == f"{result.id}.1"
    assert second["properties"]["delivery_tag"] == f"{result.id}.2"
    # The second delivery says so, as kombu's restore and RabbitMQ's quorum queues do, and nothing else changes.
    assert second["properties"]["delivery_info"].pop("redelivered") is True
    assert (second["headers"].pop("redelivered"), second["headers"].pop("x-delivery-count")) == (True, 1)
    assert comparable(first) == comparable(second)
    # The script's marks are wire.py's, byte for byte (the pipeline path pushes those).
    stored = fast.store.find(result.id)
    assert stored is not None and stored.envelope is not None
    assert raw_second == wire.message_for(result.id, stored.envelope, 2)


@pytest.mark.parametrize(
    ("message", "marked"),
    [
        (
            b'{"headers": {"id": "x"}, "properties": {"delivery_info": {"exchange": ""}, "delivery_tag": "x.2"}}',
            b'{"headers": {"redelivered": true, "x-delivery-count": 2, "id": "x"}, '
            b'"properties": {"delivery_info": {"redelivered": true, "exchange": ""}, "delivery_tag": "x.2"}}',
        ),
        (
            b'{"headers": {}, "properties": {"delivery_info": {}}}',
            b'{"headers": {"redelivered": true, "x-delivery-count": 2}, "properties": {"delivery_info": '
            b'{"redelivered": true}}}',
        ),
        (b'{"properties": {"delivery_info": {}}}', b'{"properties": {"delivery_info": {}}}'),
    ],
    ids=["as-stored", "empty-objects", "no-headers-left-alone"],
)
def test_a_redelivery_is_marked_as_json(message: bytes, marked: bytes) -> None:
    assert wire.redelivered(message, 2) == marked
    assert json.loads(marked)  # still JSON


def test_calls_pushed_by_the_script_wait_in_flight_for_their_own_queue_timeout(
    make_app: MakeApp, client: redis.Redis
) -> None:
    """Each route's deadline is written once per release as text: the stored score is still the
    release's time plus that route's queue timeout, for calls of two routes in one release."""
    fast, _ = pair(make_app)
    short = task_on(fast, queue_timeout=30)
    ids = [short.apply_async((n,), countdown=0).id for n in range(3)]
    ids += [short.apply_async((n,), countdown=0, queue_timeout=90).id for n in range(3)]
    before = server_ms(client, fast.store.keys.inflight)
    assert fast.tick()["released"] == 6
    after = server_ms(client, fast.store.keys.inflight)
    deadlines = [client.zscore(fast.store.keys.inflight, call_id) for call_id in ids]
    assert all(isinstance(deadline, float) and deadline == int(deadline) for deadline in deadlines), deadlines
    assert all(before + 30_000 <= deadline <= after + 30_000 for deadline in deadlines[:3]), (before, deadlines)  # type: ignore[operator]
    assert all(before + 90_000 <= deadline <= after + 90_000 for deadline in deadlines[3:]), (before, deadlines)  # type: ignore[operator]


def test_a_malformed_broker_message_is_dead_lettered_and_the_release_goes_on(
    make_app: MakeApp, client: redis.Redis
) -> None:
    fast, _ = pair(make_app)
    task = task_on(fast)
    bad = task.apply_async((1,), countdown=0)
    good = task.apply_async((2,), countdown=0)
    client.hset(fast.keys.payloads, bad.id, PREFIX + b"broken")
    report = fast.tick()
    assert report["released"] == 1
    assert report["dead"] == 1
    assert fast.find(bad.id).state == "dead"  # type: ignore[union-attr]
    assert fast.find(good.id).state == "inflight"  # type: ignore[union-attr]


# -- the released message against Celery's own publish ----------------------------------------------


def ordered(raw: bytes) -> list[Any]:
    """A broker message as nested (key, value) pairs in their order, with what is not the call's own
    made comparable: the delivery tag (one per delivery), the reply queue (one per app), the expiry
    instant (computed at call time) and the time of a given eta."""

    def pairs(items: list[tuple[str, Any]]) -> list[Any]:
        out: list[Any] = []
        for key, value in items:
            if key in ("delivery_tag", "reply_to"):
                value = "<volatile>"
            elif key == "expires" and value is not None:
                value = "<instant>"
            out.append([key, value])
        return out

    return json.loads(raw, object_pairs_hook=pairs)  # type: ignore[no-any-return]


FIDELITY_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("default", {}, {}),
    ("expires", {}, {"expires": 600}),
    ("priority", {}, {"priority": 7}),
    ("low priority", {}, {"priority": 2}),
    ("queue", {}, {"queue": "q-fidelity-routed"}),
    ("headers", {}, {"headers": {"tenant": "t1", "trace": [1, 2]}}),
    ("link", {}, {"link": "callback", "link_error": "callback"}),
    ("time limits", {}, {"time_limit": 30, "soft_time_limit": 20}),
    ("argsrepr", {}, {"argsrepr": "(hidden)", "kwargsrepr": "{'y': '***'}"}),
    ("shadow", {}, {"shadow": "shadowed.name"}),
    ("compression", {}, {"compression": "zlib"}),
    ("pickle", {"task_serializer": "pickle", "accept_content": ["json", "pickle"]}, {"args": ({1, 2}, b"\xff")}),
    ("transient", {}, {"delivery_mode": 1}),
    ("keyprefix", {"broker_transport_options": {"global_keyprefix": "pfx:"}}, {}),
]


@pytest.mark.parametrize("how", ["built by Celery", "from a template"])
@pytest.mark.parametrize("store", ["same database", "other database"])
@pytest.mark.parametrize(("name", "conf", "options"), FIDELITY_CASES, ids=[case[0] for case in FIDELITY_CASES])
def test_a_released_call_is_the_message_celery_publishes(
    redis_server: Any,
    client: redis.Redis,
    how: str,
    store: str,
    name: str,
    conf: dict[str, Any],
    options: dict[str, Any],
) -> None:
    """The same call published by a plain ``@app.task`` through kombu's own Redis channel, and parked by
    ``@rd.delayed`` (countdown 0) then released: what lands in the broker list is the same, byte order
    of the JSON included, but for the delivery tag and the app's reply queue. Parked as the first call
    of its kind (Celery builds it) or after two like it (rendered from their template)."""
    queue = f"q-fidelity-{uuid.uuid4().hex[:8]}"
    common = {"task_default_queue": queue, "task_create_missing_queues": True, **conf}
    plain_app = Celery("plain", broker=f"{redis_server.url}/0", set_as_current=False)
    plain_app.conf.update(common)
    ours_app = Celery("ours", broker=f"{redis_server.url}/0", set_as_current=False)
    ours_app.conf.update(common, redisdelay_key_prefix=f"fidelity-{uuid.uuid4().hex[:8]}")
    if store == "other database":
        ours_app.conf.redisdelay_url = f"{redis_server.url}/3"
    rd = RedisDelay(ours_app)
    try:

        @plain_app.task(name="tests.wire.same", shared=False)
        def plain(x: Any, y: Any = None) -> None: ...

        @rd.delayed(name="tests.wire.same")
        def delayed(x: Any, y: Any = None) -> None: ...

        @plain_app.task(name="callback", shared=False)
        def callback(*args: Any) -> None: ...

        options = dict(options)
        args = options.pop("args", (1,))
        kwargs = {"y": [3]} if len(args) == 1 else {}
        for link in ("link", "link_error"):
            if link in options:
                options[link] = callback.s("linked")
        layout = BrokerLayout(global_keyprefix=(conf.get("broker_transport_options") or {}).get("global_keyprefix", ""))
        lists = [layout.list_key(options.get("queue", queue), step) for step in layout.priority_steps]
        before = {key: client.llen(key) for key in lists}
        plain.apply_async(args, kwargs, task_id="the-call", **options)
        [celery_list] = [key for key in lists if client.llen(key) > before[key]]
        celery_message = client.lpop(celery_list)
        if how == "from a template":
            for _ in range(2):
                rd.cancel(delayed.apply_async(args, kwargs, countdown=60, **options).id)
            assert bool(rd.templates._made) == (set(options) <= KEPT_OPTIONS), "a template when the options allow"
        assert delayed.apply_async(args, kwargs, task_id="the-call", countdown=0, **options).id == "the-call"
        assert rd.tick()["released"] == 1
        [our_list] = [key for key in lists if client.llen(key) > before[key]]
        our_message = client.lpop(our_list)
        assert our_list == celery_list
        assert ordered(our_message) == ordered(celery_message)  # type: ignore[arg-type]
        assert (rd.fast_release, rd.wire_format) == (store == "same database", True)
    finally:
        plain_app.close()
        ours_app.close()
