"""Call templates render the message Celery builds: the per-call values are computed as Celery and kombu
compute them (proven on random values here), and a call rendered from a template is stored byte for
byte as the same call built by Celery."""

from __future__ import annotations

import base64
import gc
import json
import threading
import uuid
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery.contrib.testing.app import setup_default_app
from celery.utils.saferepr import saferepr
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.serialization import dumps, register_json, registry
from kombu.utils import json as kombu_json

from celery_redisdelay import RedisDelay
from celery_redisdelay.message.marks import ETA_HEADER
from celery_redisdelay.message.stored import decode_stored
from celery_redisdelay.producer.kept import TemplateCache
from celery_redisdelay.producer.templates import CallTemplate, flat_saferepr
from celery_redisdelay.store.shards import fresh_ids

MakeApp = Callable[..., tuple[Celery, RedisDelay]]
#: The embedded part of the body of a call without callbacks, chain or chord (protocol 2).
PLAIN_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}

scalars = st.one_of(
    st.text(max_size=30),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(scalars, max_size=12).map(tuple), st.sampled_from([8, 40, 1024]))
def test_flat_reprs_are_celerys_saferepr(args: tuple[Any, ...], maxlen: int) -> None:
    shown = flat_saferepr(args, maxlen)
    assert shown is None or shown == saferepr(args, maxlen)
    if len(repr(args)) < maxlen // 2 and all(not isinstance(a, str) or "\\" not in a for a in args):
        assert shown is not None, "short flat tuples take the direct way"


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=10), scalars, max_size=6), st.sampled_from([16, 1024]))
def test_flat_dict_reprs_are_celerys_saferepr(kwargs: dict[str, Any], maxlen: int) -> None:
    shown = flat_saferepr(kwargs, maxlen)
    assert shown is None or shown == saferepr(kwargs, maxlen)


@pytest.mark.parametrize("value", [[1, 2], ((1,),), {1: "a"}, (object(),), "text", (b"bytes",)])
def test_anything_else_goes_to_saferepr_itself(value: Any) -> None:
    assert flat_saferepr(value, 1024) is None


json_values = st.recursive(
    scalars.filter(lambda v: not isinstance(v, float) or v == v)
    | st.datetimes(timezones=st.just(UTC))
    | st.uuids()
    | st.decimals(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(json_values, max_size=5).map(tuple), st.dictionaries(st.text(max_size=5), json_values, max_size=3))
def test_the_json_body_of_the_args_alone_is_kombus(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """kombu's JSON of (args, kwargs, embed) is the JSON of the args joined to the rest as its encoder
    joins list items: park_many encodes only the args of each call."""
    template = CallTemplate.__new__(CallTemplate)
    template.serializer, template.embed, template.task = "json", PLAIN_EMBED, "t"
    _, _, kombus = dumps((args, kwargs, PLAIN_EMBED), serializer="json")
    rest = template.body_rest(kwargs)
    assert rest is not None
    assert template.body(args, kwargs, rest) == kombus.encode() == template.body(args, kwargs)


def test_fresh_ids_are_uuid4_strings() -> None:
    ids = fresh_ids(2000)
    assert len(set(ids)) == 2000
    for call_id in ids[:200]:
        parsed = uuid.UUID(call_id)
        assert str(parsed) == call_id and parsed.version == 4 and parsed.variant == uuid.RFC_4122


# -- single calls rendered from a kept template ------------------------------------------------------


def stored(rd: RedisDelay, call_id: str) -> bytes:
    """A stored call's envelope, its id replaced, to compare calls of different ids."""
    entry = rd.find(call_id)
    assert entry is not None and entry.envelope is not None
    return entry.envelope.replace(call_id.encode(), b"<id>")


OPTION_SETS: list[dict[str, Any]] = [
    {},
    {"priority": 7},
    {"queue": "q-templates-routed"},
    {"headers": {"tenant": "t1"}, "shadow": "shadowed"},
    {"time_limit": 30, "soft_time_limit": 10, "ignore_result": True},
    {"argsrepr": "(secret)", "kwargsrepr": "{}"},
    {"serializer": "pickle"},
]
ARGS: list[tuple[Any, ...]] = [(1, "it's"), ('a "quoted"\nline', None, 2.5), ([1, {"x": datetime(2030, 1, 1)}],)]


@pytest.mark.usefixtures("frozen_clock")  # calls alike have the same eta
@pytest.mark.parametrize("store", ["same database", "other database"])
@pytest.mark.parametrize("options", OPTION_SETS, ids=[str(sorted(o)) or "none" for o in OPTION_SETS])
def test_a_call_rendered_from_a_template_is_stored_as_celery_builds_it(
    make_app: MakeApp, redis_server: Any, store: str, options: dict[str, Any]
) -> None:
    conf: dict[str, Any] = {"task_create_missing_queues": True, "accept_content": ["json", "pickle"]}
    if store == "other database":
        conf["redisdelay_url"] = f"{redis_server.url}/3"
    _, rd = make_app(**conf)

    @rd.delayed(name="tests.templates.echo")
    def echo(*args: Any, **kwargs: Any) -> None: ...

    for warm in range(2):  # the second call of a kind leaves a template
        echo.apply_async((warm,), {"k": warm}, countdown=60, **options)
    kept = rd.templates
    assert len(kept._made) == 1
    for args in ARGS:
        rd.templates = kept
        rendered = echo.apply_async(args, {"k": "v"}, countdown=60, task_id=f"r-{uuid.uuid4()}", **options)
        rd.templates = TemplateCache()  # an empty one: this call goes through Celery
        built = echo.apply_async(args, {"k": "v"}, countdown=60, task_id=f"b-{uuid.uuid4()}", **options)
        assert stored(rd, rendered.id) == stored(rd, built.id)
        assert rd.find(rendered.id).meta == rd.find(built.id).meta  # type: ignore[union-attr]


@pytest.mark.usefixtures("frozen_clock")  # calls alike have the same eta
@pytest.mark.parametrize("first", [[1, 2], ((1, 2),), (1, 2)], ids=["a list", "a nested tuple", "a tuple"])
def test_calls_with_list_or_nested_tuple_arguments_get_a_template_too(rd: RedisDelay, first: Any) -> None:
    @rd.delayed(name="tests.templates.lists")
    def lists(*args: Any) -> None: ...

    for _ in range(2):  # the second call of a kind leaves a template, whatever form its args take
        lists.apply_async(first, countdown=60)
    kept = rd.templates
    assert len(kept._made) == 1
    for args in ([3, [4]], ((5, 6), 7), (8,)):
        rd.templates = kept
        rendered = lists.apply_async(args, countdown=60, task_id=f"r-{uuid.uuid4()}")
        rd.templates = TemplateCache()
        built = lists.apply_async(args, countdown=60, task_id=f"b-{uuid.uuid4()}")
        assert stored(rd, rendered.id) == stored(rd, built.id)


@pytest.mark.usefixtures("frozen_clock")  # calls alike have the same eta
def test_a_json_serializer_registered_over_kombus_is_followed_by_kept_templates(rd: RedisDelay) -> None:
    """A kept template encodes a JSON body with kombu's encoder directly only while kombu's own JSON is
    the registered one: a serializer registered over it since is used as Celery would use it."""

    @rd.delayed(name="tests.templates.compact")
    def compact(*args: Any) -> None: ...

    for n in range(2):
        compact.apply_async((n,), countdown=60)
    kept = rd.templates
    assert len(kept._made) == 1
    registry.register(
        "json",
        lambda value: json.dumps(value, separators=(",", ":")),  # no spaces: not what kombu's encoder writes
        kombu_json.loads,
        content_type="application/json",
        content_encoding="utf-8",
    )
    try:
        rd.templates = kept
        rendered = compact.apply_async((1, "two"), countdown=60, task_id=f"r-{uuid.uuid4()}")
        rd.templates = TemplateCache()
        built = compact.apply_async((1, "two"), countdown=60, task_id=f"b-{uuid.uuid4()}")
    finally:
        register_json()
    assert b'[[1,"two"],{},' in base64_body(rd, built.id), "Celery used the serializer registered"
    assert stored(rd, rendered.id) == stored(rd, built.id)


def base64_body(rd: RedisDelay, call_id: str) -> bytes:
    """The body of a stored call (a broker message: base64 in its JSON)."""
    entry = rd.find(call_id)
    assert entry is not None and entry.envelope is not None
    return base64.b64decode(json.loads(entry.envelope)["body"])


@pytest.mark.usefixtures("frozen_clock")  # calls alike have the same eta
def test_a_kept_template_serves_only_calls_built_alike(rd: RedisDelay) -> None:
    """The options ``apply_async`` takes by name (link, link_error, shadow) count as the others do, and
    a call by name (``send_task``, whose message differs) does not borrow ``apply_async``'s template."""

    @rd.delayed(name="tests.templates.alike")
    def alike(x: int) -> None: ...

    calls: dict[str, Callable[[str], Any]] = {
        "link": lambda call_id: alike.apply_async((1,), countdown=60, task_id=call_id, link=alike.si(2)),
        "link_error": lambda call_id: alike.apply_async((1,), countdown=60, task_id=call_id, link_error=alike.si(3)),
        "shadow": lambda call_id: alike.apply_async((1,), countdown=60, task_id=call_id, shadow="alike.shadowed"),
        "send_task": lambda call_id: rd.app.send_task("tests.templates.alike", (1,), countdown=60, task_id=call_id),
    }

    for n in range(2):
        alike.apply_async((n,), countdown=60)
    kept = rd.templates
    assert len(kept._made) == 1, "plain calls have a template"
    for name, call in calls.items():
        rd.templates = kept
        after_plain = call(f"k-{uuid.uuid4()}").id
        rd.templates = TemplateCache()  # an empty one: this call goes through Celery
        built = call(f"b-{uuid.uuid4()}").id
        assert stored(rd, after_plain) == stored(rd, built), name


@pytest.mark.usefixtures("frozen_clock")  # the same instant for Celery's call and ours
def test_a_kept_template_gives_each_call_the_eta_celery_writes(make_app: MakeApp, client: redis.Redis) -> None:
    """A call's eta is computed at the call, as Celery computes it: a template keeps a slot for it, and the
    stored message has it in its private header (the worker's ``request.eta``), not in ``eta``."""
    app, rd = make_app()

    @rd.delayed(name="tests.templates.timed")
    def timed(x: int) -> None: ...

    @app.task(name="tests.templates.plain_timed", shared=False)
    def plain_timed(x: int) -> None: ...

    for n in range(2):
        timed.apply_async((n,), countdown=60)
    assert len(rd.templates._made) == 1
    cases: list[dict[str, Any]] = [
        {"countdown": 90},
        {"countdown": 0.25},
        {"countdown": -5},
        {"eta": datetime(2030, 1, 1, 12, tzinfo=UTC)},
        {"eta": datetime(2030, 1, 1, 12)},
        {"eta": "2030-01-01T12:00:00+02:00"},
        {},
    ]
    for options in cases:
        ours = timed.apply_async((1,), **options)
        plain_timed.apply_async((1,), **options)
        celerys = json.loads(client.rpop(app.conf.task_default_queue))["headers"]["eta"]  # type: ignore[arg-type]
        entry = rd.find(ours.id)
        assert entry is not None and entry.envelope is not None
        headers = decode_stored(entry.envelope).headers
        assert (headers["eta"], headers.get(ETA_HEADER)) == (None, celerys), options
    assert len(rd.templates._made) == 1, "the calls with an eta were rendered from the template"


def test_publish_signal_receivers_get_every_call_from_celery(rd: RedisDelay) -> None:
    @rd.delayed(name="tests.templates.signalled")
    def signalled(x: int) -> None: ...

    seen: list[tuple[Any, ...]] = []

    def receiver(sender: Any = None, body: Any = None, headers: Any = None, **_: Any) -> None:
        seen.append((sender, body[0], headers["id"]))

    signals.before_task_publish.connect(receiver)
    try:
        ids = [signalled.apply_async((n,), countdown=60).id for n in range(4)]
    finally:
        signals.before_task_publish.disconnect(receiver)
    assert seen == [("tests.templates.signalled", (n,), ids[n]) for n in range(4)]
    assert not rd.templates._made, "no template while someone listens"
    for n in range(3):
        signalled.apply_async((n,), countdown=60)
    assert rd.templates._made, "a template once nobody listens"


def test_a_call_rendered_from_a_template_subscribes_to_its_result_as_celery_does(
    make_app: MakeApp, redis_server: Any
) -> None:
    """The Redis result backend subscribes to a task's result when the call is sent (Celery's ``send_task``
    calls ``on_task_call``); a call rendered from a template does the same, and ``get()`` hears it."""
    app, rd = make_app(result_backend=f"{redis_server.url}/6")

    @rd.delayed(name="tests.templates.answer")
    def answer() -> int: ...

    def subscribed(call_id: str) -> bool:
        return app.backend.get_key_for_task(call_id) in app.backend.result_consumer.subscribed_to

    results = [answer.apply_async(countdown=60) for _ in range(4)]
    assert rd.templates._made
    assert all(subscribed(result.id) for result in results), "rendered or built by Celery, each subscribes"
    ignored = answer.apply_async(countdown=60, ignore_result=True)
    assert not subscribed(ignored.id), "as Celery: no result kept, no subscription"

    @app.task(name="tests.templates.plain_answer", shared=False)
    def plain_answer() -> int: ...

    # The same calls under plain @app.task, sent by Celery itself: the same subscriptions.
    assert subscribed(plain_answer.apply_async(countdown=60).id)
    assert not subscribed(plain_answer.apply_async(countdown=60, ignore_result=True).id)
    early, late = results[-2], results[-1]
    app.backend.store_result(early.id, 41, "SUCCESS")
    assert (early.state, early.ready(), early.get(timeout=5)) == ("SUCCESS", True, 41)
    waiting = threading.Timer(0.3, lambda: app.backend.store_result(late.id, 42, "SUCCESS"))
    assert late.state == "PENDING" and not late.ready()
    waiting.start()
    try:
        assert late.get(timeout=10) == 42, "get() subscribed and heard the result stored after it began"
    finally:
        waiting.cancel()


def test_calls_whose_options_differ_each_time_make_no_template(rd: RedisDelay) -> None:
    @rd.delayed(name="tests.templates.traced")
    def traced() -> None: ...

    for n in range(5):
        traced.apply_async(countdown=60, headers={"trace": str(n)})
    assert not rd.templates._made
    assert kombu_json.dumps(PLAIN_EMBED) == '{"callbacks": null, "errbacks": null, "chain": null, "chord": null}'


def test_the_choice_of_a_template_keeps_no_result_backend_alive(make_app: MakeApp, redis_server: Any) -> None:
    """Celery's test fixtures drop an app's result backend when they are done with it, so its connections go
    (Celery's test_backend_leak_in_fixture_teardown.py); what the extension remembers to choose a template must
    not keep it, nor its sockets, alive."""
    app, rd = make_app(result_backend=f"{redis_server.url}/6")

    @rd.delayed(name="tests.templates.kept_backend")
    def kept_backend() -> None: ...

    with setup_default_app(app):  # clears the app's backend on the way out, as Celery's fixtures do
        for _ in range(3):
            kept_backend.apply_async(countdown=60)
        assert rd.templates._made, "the calls went the way of a kept template"
        backend = weakref.ref(app.backend)
    # Celery 5.7's setup_default_app drops the app's own references to its backend on the way out; older ones (5.3)
    # do not, and the app keeps it: dropped here as 5.7 does, so that only what the extension holds is left.
    app._backend_cache = None
    app._local.backend = None
    gc.collect()
    assert backend() is None, "nothing of the extension's holds the backend the app let go"
