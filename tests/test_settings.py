"""The ``redisdelay_*`` settings: defaults, derived values, refused values, key names, namespaces."""

from __future__ import annotations

import math
import ssl
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import redis
from celery import Celery
from redis.crc import key_slot

from celery_redisdelay import ConfigurationError, RedisDelay, RedisDelayError
from celery_redisdelay.settings import DEFAULTS, Settings, check_names
from celery_redisdelay.store.keys import Keyspace
from celery_redisdelay.testing import RedisServer

MakeApp = Callable[..., tuple[Celery, RedisDelay]]


BROKER = "redis://broker.example:6379/2"


# -- defaults -----------------------------------------------------------------------------------


def test_defaults_from_a_redis_broker_url() -> None:
    settings = Settings.from_conf({"broker_url": BROKER})
    assert settings == Settings(
        url=BROKER,
        key_prefix="redisdelay",
        tick_interval=1.0,
        visibility_timeout=3600.0,
        queue_timeout=7200.0,
        claim_timeout=float(DEFAULTS["redisdelay_claim_timeout"]),
        max_deliveries=10,
        release_batch=500,
    )
    assert settings.claim_timeout > 0
    assert isinstance(settings.max_deliveries, int)
    assert isinstance(settings.release_batch, int)


def test_defaults_from_a_celery_app_conf() -> None:
    app = Celery("settings-defaults", broker=BROKER, set_as_current=False)
    try:
        settings = Settings.from_conf(app.conf)
    finally:
        app.close()
    assert settings.url == BROKER
    assert (settings.key_prefix, settings.tick_interval, settings.visibility_timeout) == ("redisdelay", 1.0, 3600.0)
    assert (settings.max_deliveries, settings.release_batch, settings.queue_timeout) == (10, 500, 7200.0)


def test_the_extension_reads_its_settings_from_the_app(make_app: MakeApp, redis_server: RedisServer) -> None:
    _, rd = make_app(
        redisdelay_tick_interval=0.5,
        redisdelay_visibility_timeout=120,
        redisdelay_max_deliveries=3,
        redisdelay_release_batch=50,
    )
    settings = rd.settings
    assert settings.url == f"{redis_server.url}/0"
    assert settings.key_prefix == rd.keys.prefix
    assert settings.key_prefix.startswith("test-")
    assert (settings.tick_interval, settings.visibility_timeout) == (0.5, 120.0)
    assert (settings.max_deliveries, settings.release_batch) == (3, 50)


@pytest.mark.parametrize(
    "url",
    ["redis://localhost:6379/0", "rediss://user:pw@example:6380/1", "unix:///run/redis.sock?db=3"],
)
def test_redis_schemes_are_accepted(url: str) -> None:
    assert Settings.from_conf({"broker_url": "amqp://", "redisdelay_url": url}).url == url


@pytest.mark.parametrize(
    ("broker", "url", "options"),
    [
        ("redis://localhost:6379/0", "redis://localhost:6379/0", {}),
        # kombu's rediss:// without TLS options does not check the certificate; the store follows it
        ("rediss://user:p%40ss@example:6380/1", "rediss://example:6380/1", {"ssl_cert_reqs": ssl.CERT_NONE}),
        ("redis+socket:///run/redis.sock?virtual_host=3", "unix:///run/redis.sock?db=3", {}),
    ],
)
def test_the_store_url_follows_kombus_reading_of_the_broker(broker: str, url: str, options: dict[str, Any]) -> None:
    """Credentials go to the client options, out of the URL (which is logged); tests/test_broker_urls.py
    checks the whole matrix against kombu's own channel on real servers."""
    settings = Settings.from_conf({"broker_url": broker})
    assert settings.url == url
    credentials = {"username": "user", "password": "p@ss"} if "@" in broker else {}
    assert settings.connection_options == {**options, **credentials}


def test_redisdelay_url_wins_over_the_broker() -> None:
    conf = {"broker_url": BROKER, "redisdelay_url": "redis://store.example:6379/5"}
    assert Settings.from_conf(conf).url == "redis://store.example:6379/5"


def test_broker_failover_list_uses_its_first_url() -> None:
    conf = {"broker_url": "redis://first.example:6379/0;redis://second.example:6379/0"}
    assert Settings.from_conf(conf).url == "redis://first.example:6379/0"


def test_broker_write_url_is_preferred_over_broker_url() -> None:
    conf = {"broker_url": "amqp://guest@rabbit//", "broker_write_url": "redis://writer.example:6379/1"}
    assert Settings.from_conf(conf).url == "redis://writer.example:6379/1"


@pytest.mark.parametrize(
    ("visibility_timeout", "queue_timeout"),
    [(None, 7200.0), (100, 7200.0), (3600, 7200.0), (7200, 14400.0), (43200.5, 86401.0)],
)
def test_queue_timeout_outlasts_the_broker_visibility_timeout(
    visibility_timeout: float | None, queue_timeout: float
) -> None:
    options = {} if visibility_timeout is None else {"visibility_timeout": visibility_timeout}
    settings = Settings.from_conf({"broker_url": BROKER, "broker_transport_options": options})
    assert settings.queue_timeout == queue_timeout
    assert settings.queue_timeout == 2 * max(visibility_timeout or 3600, 3600)


@pytest.mark.parametrize("broker", ["amqp://guest@rabbit//", "pyamqp://rabbit:5672//", "amqps://rabbit//", None])
def test_on_an_amqp_broker_the_queue_timeout_is_a_day(broker: str | None) -> None:
    """RabbitMQ keeps a confirmed message in a durable queue however old the backlog: a call waiting there is not
    published again after the two hours sized for a Redis broker's visibility timeout (no URL: Celery's default,
    a RabbitMQ on localhost)."""
    conf = {"broker_url": broker, "redisdelay_url": "redis://store.example:6379/0"}
    assert Settings.from_conf(conf).queue_timeout == 86_400.0
    assert Settings.from_conf({**conf, "redisdelay_queue_timeout": 90}).queue_timeout == 90.0
    assert Settings.from_conf({**conf, "broker_url": BROKER}).queue_timeout == 7200.0


def test_connection_options_come_from_broker_use_ssl_only() -> None:
    transport = {"visibility_timeout": 100, "master_name": "mymaster"}
    assert Settings.from_conf({"broker_url": BROKER, "broker_transport_options": transport}).connection_options == {}
    tls = {"ssl_cert_reqs": "required", "ssl_ca_certs": "/ca.pem"}
    assert Settings.from_conf({"broker_url": BROKER, "broker_use_ssl": tls}).connection_options == tls
    explicit = {"broker_url": BROKER, "broker_use_ssl": tls, "redisdelay_url": "redis://other:6379/0"}
    assert Settings.from_conf(explicit).connection_options == {}, "another Redis does not get the broker's TLS"
    mine = {**explicit, "redisdelay_connection_options": {"socket_timeout": 3}}
    assert Settings.from_conf(mine).connection_options == {"socket_timeout": 3}
    shared = {"broker_url": BROKER, "broker_use_ssl": tls, "redisdelay_connection_options": {"ssl_ca_certs": "/b.pem"}}
    assert Settings.from_conf(shared).connection_options == {**tls, "ssl_ca_certs": "/b.pem"}, "ours win"


@pytest.mark.parametrize("bad", [-1, True, "1", 1.5])
def test_wait_replicas_must_be_a_count(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="redisdelay_wait_replicas"):
        Settings.from_conf({"broker_url": BROKER, "redisdelay_wait_replicas": bad})
    settings = Settings.from_conf({"broker_url": BROKER, "redisdelay_wait_replicas": 2, "redisdelay_wait_timeout": 0.5})
    assert (settings.wait_replicas, settings.wait_timeout) == (2, 0.5)


def test_explicit_queue_timeout_wins() -> None:
    conf = {
        "broker_url": BROKER,
        "redisdelay_queue_timeout": 90,
        "broker_transport_options": {"visibility_timeout": 1e6},
    }
    assert Settings.from_conf(conf).queue_timeout == 90.0


def test_every_default_is_documented_in_defaults() -> None:
    assert set(DEFAULTS) == {
        "redisdelay_url",
        "redisdelay_key_prefix",
        "redisdelay_tick_interval",
        "redisdelay_visibility_timeout",
        "redisdelay_queue_timeout",
        "redisdelay_claim_timeout",
        "redisdelay_max_deliveries",
        "redisdelay_release_batch",
        "redisdelay_fast_release",
        "redisdelay_precise_release",
        "redisdelay_max_payload_bytes",
        "redisdelay_shards",
        "redisdelay_cluster",
        "redisdelay_connection_options",
        "redisdelay_wait_replicas",
        "redisdelay_wait_timeout",
        "redisdelay_all_tasks",
        "redisdelay_park_received",
        "redisdelay_park_received_after",
        "redisdelay_lease",
        "redisdelay_lease_renewal",
        "redisdelay_skip_unacked",
        "redisdelay_track_due_now",
        "redisdelay_worker_lost",
        "redisdelay_quotas",
        "redisdelay_task_limits",
        "redisdelay_probe_file",
    }


def test_park_received_follows_all_tasks_unless_set() -> None:
    def read(**conf: object) -> tuple[bool, bool, float]:
        settings = Settings.from_conf({"broker_url": BROKER, **conf})
        return settings.all_tasks, settings.park_received, settings.park_received_after

    assert read() == (False, False, 1.0)
    assert read(redisdelay_all_tasks=True) == (True, True, 1.0)
    assert read(redisdelay_all_tasks=True, redisdelay_park_received=False) == (True, False, 1.0)
    assert read(redisdelay_park_received=True, redisdelay_park_received_after=0) == (False, True, 0.0)


def test_skip_unacked_is_automatic_unless_set() -> None:
    """None (the default): the worker's consumer step decides, by the broker (tests/test_skip_unacked.py)."""

    def read(**conf: object) -> bool | None:
        return Settings.from_conf({"broker_url": BROKER, **conf}).skip_unacked

    assert (read(), read(redisdelay_skip_unacked=True), read(redisdelay_skip_unacked=False)) == (None, True, False)


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("redisdelay_all_tasks", "yes"),
        ("redisdelay_park_received", 1),
        ("redisdelay_park_received_after", -1),
        ("redisdelay_park_received_after", True),
        ("redisdelay_park_received_after", float("nan")),
        ("redisdelay_skip_unacked", "no"),
    ],
)
def test_adoption_settings_are_checked(name: str, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=name):
        Settings.from_conf({"broker_url": BROKER, name: bad})


# -- refused values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conf",
    [
        pytest.param({"broker_url": "amqp://"}, id="amqp-broker"),
        pytest.param({"broker_url": "amqp://", "broker_write_url": "sqs://"}, id="sqs-write-broker"),
        pytest.param({"broker_url": None}, id="no-broker"),
        pytest.param({}, id="empty-conf"),
    ],
)
def test_a_non_redis_broker_without_redisdelay_url_is_refused(conf: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="redisdelay_url") as raised:
        Settings.from_conf(conf)
    assert isinstance(raised.value, RedisDelayError)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("redisdelay_url", "http://x"),
        ("redisdelay_url", 6379),
        ("redisdelay_tick_interval", 0),
        ("redisdelay_tick_interval", -1),
        ("redisdelay_tick_interval", "a"),
        ("redisdelay_tick_interval", math.nan),
        ("redisdelay_tick_interval", math.inf),
        ("redisdelay_tick_interval", True),
        ("redisdelay_release_batch", 1.5),
        ("redisdelay_release_batch", 0),
        ("redisdelay_max_deliveries", True),
        ("redisdelay_max_deliveries", "10"),
        ("redisdelay_max_deliveries", -1),
        ("redisdelay_visibility_timeout", -5),
        ("redisdelay_queue_timeout", 0),
        ("redisdelay_claim_timeout", math.nan),
        ("redisdelay_key_prefix", 5),
    ],
)
def test_bad_settings_raise_configuration_error_naming_the_setting(setting: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=setting) as raised:
        Settings.from_conf({"broker_url": BROKER, setting: value})
    assert isinstance(raised.value, RedisDelayError)
    assert repr(value) in str(raised.value)


def test_a_bad_setting_surfaces_through_the_extension(make_app: MakeApp) -> None:
    _, rd = make_app(redisdelay_release_batch=1.5)
    with pytest.raises(ConfigurationError, match="redisdelay_release_batch"):
        _ = rd.settings


def test_non_redis_broker_without_url_fails_when_the_extension_needs_redis() -> None:
    app = Celery("settings-amqp", broker="amqp://guest@localhost//", set_as_current=False)
    try:
        rd = RedisDelay(app)  # binding the app needs no Redis yet
        with pytest.raises(ConfigurationError, match="redisdelay_url"):
            rd.ping()
    finally:
        app.close()


@pytest.mark.parametrize("interval", [-1, math.nan, 0])
def test_a_bad_tick_interval_never_reaches_beat_schedule(make_app: MakeApp, interval: float) -> None:
    app, _ = make_app(redisdelay_tick_interval=interval)
    tick = app.conf.beat_schedule.get("redisdelay.tick")
    assert tick is None, f"beat would run the tick every {tick['schedule']!r} s"


# -- unknown settings ---------------------------------------------------------------------------


def test_a_misspelt_setting_is_refused_at_the_extension_naming_the_closest(make_app: MakeApp) -> None:
    with pytest.raises(ConfigurationError, match=r"redisdelay_all_task is not a setting .* redisdelay_all_tasks\?"):
        make_app(redisdelay_all_task=True)  # set before the app is configured


def test_a_misspelt_setting_of_a_configured_app_is_refused(redis_server: RedisServer) -> None:
    app = Celery("settings-misspelt", broker=f"{redis_server.url}/0", set_as_current=False)
    try:
        assert app.conf.broker_url  # configured now: what is set next is a change of the configured app
        app.conf.redisdelay_lese = 60.0
        with pytest.raises(ConfigurationError, match=r"redisdelay_lese .* redisdelay_lease\?.*nothing was stored"):
            RedisDelay(app)
        del app.conf["redisdelay_lese"]
        app.conf.redisdelay_lease = 60.0
        assert RedisDelay(app).settings.lease == 60.0, "a refused app is not bound: fixed, it binds"
    finally:
        app.close()


def test_a_setting_close_to_none_of_ours_lists_them() -> None:
    with pytest.raises(ConfigurationError, match="redisdelay_xyzzy is not a setting") as raised:
        Settings.from_conf({"broker_url": BROKER, "redisdelay_xyzzy": "blue"})
    assert all(name in str(raised.value) for name in DEFAULTS)


def test_only_our_namespace_is_checked() -> None:
    conf: dict[Any, Any] = {
        "broker_url": BROKER,
        "result_expire": 10,
        "my_redisdelay_flag": True,
        "redisdelayed": 1,
        5: "five",
    }
    assert Settings.from_conf({**conf, **dict.fromkeys(DEFAULTS)}).url == BROKER


def test_a_misspelt_setting_under_celerys_namespace_names_its_namespaced_spelling(redis_server: RedisServer) -> None:
    class DjangoSettings:
        CELERY_BROKER_URL = f"{redis_server.url}/0"
        CELERY_REDISDELAY_KEY_PREFIX = f"dj-{uuid.uuid4().hex[:8]}"
        CELERY_REDISDELAY_ALL_TASK = True
        DEBUG = True

    refused = r"CELERY_REDISDELAY_ALL_TASK is not a setting .* CELERY_REDISDELAY_ALL_TASKS\?"
    app = Celery("settings-django-misspelt", set_as_current=False)
    try:
        app.config_from_object(DjangoSettings, namespace="CELERY")
        rd = RedisDelay(app)  # the configuration is loaded later, when first read
        with pytest.raises(ConfigurationError, match=refused):
            _ = rd.settings  # the first park, the worker's or beat's start
    finally:
        app.close()
    app = Celery("settings-django-misspelt-loaded", set_as_current=False)
    try:
        app.config_from_object(DjangoSettings, namespace="CELERY")
        assert app.conf.broker_url
        with pytest.raises(ConfigurationError, match=refused):
            RedisDelay(app)
    finally:
        app.close()


@pytest.mark.parametrize(
    ("namespace", "key", "read_as"),
    [
        (None, "REDISDELAY_ALL_TASKS", "redisdelay_all_tasks"),
        (None, "CELERY_REDISDELAY_ALL_TASKS", "redisdelay_all_tasks"),
        ("CELERY", "REDISDELAY_ALL_TASKS", "CELERY_REDISDELAY_ALL_TASKS"),
        ("CELERY", "celery_redisdelay_all_tasks", "CELERY_REDISDELAY_ALL_TASKS"),
    ],
)
def test_a_spelling_celery_does_not_read_is_refused(namespace: str | None, key: str, read_as: str) -> None:
    """Celery reads upper-case names only for its own settings, or under a namespace; ours, as it reads them."""
    source = type("Source", (), {"BROKER_URL" if namespace is None else "CELERY_BROKER_URL": BROKER, key: True})
    app = Celery("settings-case", set_as_current=False)
    try:
        app.config_from_object(source, namespace=namespace)
        assert app.conf.get("redisdelay_all_tasks") is None, "Celery does not read it"
        with pytest.raises(ConfigurationError, match=rf"{key} is not read\b.* {read_as}\b"):
            RedisDelay(app)
    finally:
        app.close()


@pytest.mark.parametrize("namespace", [None, "CELERY", "celery"])
def test_every_setting_is_known_in_each_spelling_celery_reads(namespace: str | None) -> None:
    """The known settings are DEFAULTS' keys: under a namespace, Celery reads ``CELERY_REDISDELAY_URL`` and
    ``redisdelay_url`` alike."""
    keys = list(DEFAULTS)
    if namespace:
        spelt = [f"{namespace}_{name}" for name in DEFAULTS]
        keys += [key.upper() for key in spelt] if namespace.isupper() else spelt
    source = type("Source", (), dict.fromkeys(keys))
    app = Celery("settings-every", broker=BROKER, set_as_current=False)
    try:
        app.config_from_object(source, namespace=namespace)
        check_names(app.conf)
    finally:
        app.close()


# -- key names ----------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["a{b", "a}b", "{tag}", "x{}y", ""])
def test_a_prefix_with_braces_or_empty_is_refused(prefix: str) -> None:
    with pytest.raises(ConfigurationError, match="redisdelay_key_prefix"):
        Keyspace(prefix)


def test_a_prefix_with_braces_is_refused_before_anything_is_stored(make_app: MakeApp, client: redis.Redis) -> None:
    app, rd = make_app()
    app.conf.redisdelay_key_prefix = "bad{tag}"  # make_app sets its own prefix; settings are read lazily

    @rd.delayed(name="test_settings.braces", shared=False)
    def braces(x: int) -> int:
        return x

    with pytest.raises(ConfigurationError, match="redisdelay_key_prefix"):
        _ = rd.keys
    with pytest.raises(ConfigurationError, match="redisdelay_key_prefix"):
        braces.apply_async((1,), countdown=5)
    assert list(client.scan_iter(match="*bad{tag}*")) == []
    assert list(client.scan_iter(match=f"{app.conf.task_default_queue}*")) == []


def test_store_keys_share_one_hash_tag() -> None:
    keys = Keyspace("my-app")
    assert keys.store_keys[:5] == [keys.delayed, keys.inflight, keys.dead, keys.payloads, keys.meta]
    assert len(set(keys.store_keys)) == 20
    # The per-name keys of batch groups and locks go to the same slot, whatever the name holds.
    named = [keys.batch_items('["t","a{b}c"]'), keys.lock("order:{42}"), keys.lock_waiters("x"), keys.lock_wake("y")]
    every = keys.store_keys + named
    assert all(key.startswith("{my-app}:") for key in every)
    assert len({key_slot(key.encode()) for key in every}) == 1
    assert key_slot(keys.delayed.encode()) == key_slot(b"my-app")


def test_validation_keys_share_their_own_hash_tag() -> None:
    keys = Keyspace("my-app")
    run_keys = keys.validation_keys("run1")
    assert len(set(run_keys)) == 2
    assert all(key.startswith("{my-app:validate:run1}:") for key in run_keys)
    assert len({key_slot(key.encode()) for key in run_keys}) == 1
    assert not set(run_keys) & set(keys.store_keys)


def test_prefixes_do_not_share_keys() -> None:
    assert not set(Keyspace("a").store_keys) & set(Keyspace("b").store_keys)
    assert not set(Keyspace("a").store_keys) & set(Keyspace("a:b").store_keys)


def test_a_parked_call_creates_only_hash_tagged_keys(rd: RedisDelay) -> None:
    @rd.delayed(name="test_settings.tagged", shared=False)
    def tagged(x: int) -> int:
        return x

    prefix = rd.settings.key_prefix
    tagged.apply_async((1,), countdown=30)
    created = {key.decode() for key in rd.client.scan_iter(match=f"*{prefix}*")}
    assert created == {
        f"{{{prefix}}}:{name}" for name in ("delayed", "payloads", "meta", "wake", "counters", "history")
    }
    assert len({key_slot(key.encode()) for key in created}) == 1


# -- Django-style namespace ---------------------------------------------------------------------


def test_celery_namespace_settings_are_honoured(redis_server: RedisServer) -> None:
    prefix = f"dj-{uuid.uuid4().hex[:8]}"
    queue = f"dj-queue-{uuid.uuid4().hex[:8]}"

    class DjangoSettings:
        CELERY_BROKER_URL = f"{redis_server.url}/0"
        CELERY_REDISDELAY_URL = f"{redis_server.url}/3"
        CELERY_REDISDELAY_KEY_PREFIX = prefix
        CELERY_REDISDELAY_TICK_INTERVAL = 4.0
        CELERY_REDISDELAY_MAX_DELIVERIES = 7
        CELERY_TASK_DEFAULT_QUEUE = queue

    app = Celery("settings-django", set_as_current=False)
    app.config_from_object(DjangoSettings, namespace="CELERY")
    rd = RedisDelay(app)
    store = redis.Redis.from_url(f"{redis_server.url}/3")
    try:

        @rd.delayed(name="test_settings.django", shared=False)
        def django(x: int) -> int:
            return x

        settings = rd.settings
        assert settings.url == f"{redis_server.url}/3"
        assert settings.key_prefix == prefix
        assert (settings.tick_interval, settings.max_deliveries) == (4.0, 7)
        assert app.conf.beat_schedule["redisdelay.tick"] == {"task": "redisdelay.tick", "schedule": 4.0}

        result = django.apply_async((1,), countdown=30)
        entry = rd.find(result.id)
        assert entry is not None
        assert entry.meta["m"] == 7
        assert store.zscore(f"{{{prefix}}}:delayed", result.id) == entry.score_ms  # in db 3, not the broker's db
    finally:
        store.delete(*Keyspace(prefix).store_keys)
        store.close()
        app.close()


def test_celery_namespace_configured_after_the_extension(redis_server: RedisServer) -> None:
    class DjangoSettings:
        CELERY_BROKER_URL = f"{redis_server.url}/0"
        CELERY_REDISDELAY_URL = f"{redis_server.url}/4"
        CELERY_REDISDELAY_KEY_PREFIX = "dj-after"
        CELERY_BEAT_SCHEDULE: ClassVar[dict[str, Any]] = {"mine": {"task": "someone.else", "schedule": 7.0}}

    app = Celery("settings-django-after", set_as_current=False)
    try:
        rd = RedisDelay(app)
        app.config_from_object(DjangoSettings, namespace="CELERY")
        assert (rd.settings.url, rd.settings.key_prefix) == (f"{redis_server.url}/4", "dj-after")
        assert set(app.conf.beat_schedule) == {"mine", "redisdelay.tick"}
    finally:
        app.close()
