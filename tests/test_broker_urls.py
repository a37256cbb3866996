"""The store without ``redisdelay_url`` reaches the broker's Redis exactly as kombu does.

For each broker URL form kombu's Redis transports accept, on real servers: kombu's own channel
(``app.connection_for_write().default_channel.client``) and the store's client reach the same server
and database with the same credentials and TLS options, a key written by one is read by the other,
and ``broker_is_store`` agrees. CI runs this at the newest and at the lowest versions we declare.
"""

from __future__ import annotations

import ssl
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from celery import Celery
from redis.sentinel import SentinelConnectionPool

from celery_redisdelay import ConfigurationError, RedisDelay
from celery_redisdelay.settings import Settings
from celery_redisdelay.store.connection import broker_is_store
from celery_redisdelay.testing import RedisServer, free_port
from celery_redisdelay.testing.topologies import LocalSentinel

#: Passwords with characters a URL must escape.
PASSWORD = "p@ss:w/rd %#?"
ALICE = ("alice", "s3cr#t/ä")
HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def auth_server() -> Iterator[RedisServer]:
    """A server on a unix socket and loopback; the default user has PASSWORD, and the ACL user alice."""
    directory = Path(tempfile.mkdtemp(prefix="redisdelay-urls-"))
    socket_args = ["--unixsocket", str(directory / "redis.sock"), "--unixsocketperm", "700"]
    server = RedisServer(extra_args=socket_args, directory=directory).start()
    with redis.Redis(host=HOST, port=server.port) as client:
        client.execute_command("ACL", "SETUSER", ALICE[0], "on", f">{ALICE[1]}", "~*", "&*", "+@all")
        client.config_set("requirepass", PASSWORD)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def protected(sentinel: LocalSentinel) -> LocalSentinel:
    """The module's Sentinel group with its data nodes behind PASSWORD (the sentinel open, as kombu asks it)."""
    with sentinel.sentinel_client() as watcher:
        watcher.execute_command("SENTINEL", "SET", sentinel.master_name, "auth-pass", PASSWORD)
    for port in sentinel.data_ports:
        with redis.Redis(host=HOST, port=port) as node:
            node.config_set("masterauth", PASSWORD)
            node.config_set("requirepass", PASSWORD)
    return sentinel


def _socket(server: RedisServer) -> str:
    return str(server.dir / "redis.sock")


DEAD = free_port()  # nothing listens there: kombu never tries it, or the next sentinel answers
SECRET = quote(PASSWORD, safe="")
ALICE_URL = f"{ALICE[0]}:{quote(ALICE[1], safe='')}"

#: case -> (server fixture, broker settings on that server)
CASES: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
    "redis, no db": ("redis_server", lambda s: {"broker_url": s.url}),
    "redis, db as path": ("redis_server", lambda s: {"broker_url": f"{s.url}/7"}),
    "failover string": ("redis_server", lambda s: {"broker_url": f"{s.url}/3;redis://{HOST}:{DEAD}/0"}),
    "failover list": ("redis_server", lambda s: {"broker_url": [f"{s.url}/4", f"redis://{HOST}:{DEAD}/0"]}),
    "broker_write_url": (
        "redis_server",
        lambda s: {"broker_url": f"amqp://guest@{HOST}:{DEAD}//", "broker_write_url": f"{s.url}/6"},
    ),
    "broker_port, broker_vhost": (
        "redis_server",
        lambda s: {"broker_url": f"redis://{HOST}", "broker_port": s.port, "broker_vhost": "5"},
    ),
    "escaped password": ("auth_server", lambda s: {"broker_url": f"redis://:{SECRET}@{HOST}:{s.port}/1"}),
    "ACL user": ("auth_server", lambda s: {"broker_url": f"redis://{ALICE_URL}@{HOST}:{s.port}/2"}),
    "broker_user, broker_password": (
        "auth_server",
        lambda s: {"broker_url": f"redis://{HOST}:{s.port}/5", "broker_user": ALICE[0], "broker_password": ALICE[1]},
    ),
    "unix socket": ("auth_server", lambda s: {"broker_url": f"redis+socket://:{SECRET}@{_socket(s)}"}),
    "unix socket, ACL user, db": (
        "auth_server",
        lambda s: {"broker_url": f"redis+socket://{ALICE_URL}@{_socket(s)}?virtual_host=3"},
    ),
    "rediss, broker_use_ssl": ("tls", lambda t: {"broker_url": t.url, "broker_use_ssl": t.ssl_options}),
    "rediss, ssl query": (
        "tls",
        lambda t: {"broker_url": f"{t.url}?ssl_cert_reqs=required&ssl_ca_certs={quote(str(t.ca_path))}"},
    ),
    "rediss, no options": ("tls", lambda t: {"broker_url": t.url}),
    "redis with broker_use_ssl": (
        "tls",
        lambda t: {"broker_url": t.url.replace("rediss://", "redis://"), "broker_use_ssl": t.ssl_options},
    ),
    "sentinel, kombu's list": (
        "protected",
        lambda g: {
            "broker_url": f"sentinel://:{SECRET}@{HOST}:{g.sentinel_port}/2;sentinel://:{SECRET}@[::1]:{DEAD}/0",
            "broker_transport_options": {"master_name": g.master_name},
        },
    ),
    "sentinel, IPv6 first, options": (
        "protected",
        lambda g: {
            "broker_url": f"sentinel://:{SECRET}@[::1]:{DEAD};sentinel://:{SECRET}@{HOST}:{g.sentinel_port}/3",
            "broker_transport_options": {
                "master_name": g.master_name,
                "sentinel_kwargs": {"socket_timeout": 2, "client_name": "probe"},
                "min_other_sentinels": 0,
            },
        },
    ),
    "sentinel, one": (
        "protected",
        lambda g: {
            "broker_url": f"sentinel://:{SECRET}@{HOST}:{g.sentinel_port}/4",
            "broker_transport_options": {"master_name": g.master_name},
        },
    ),
}


_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def effective(client: redis.Redis) -> dict[str, Any]:
    """What decides where a client connects and as whom."""
    pool = client.connection_pool
    options = pool.connection_kwargs
    seen: dict[str, Any] = {
        "db": int(options.get("db") or 0),
        "username": options.get("username"),
        "password": options.get("password"),
        "tls": issubclass(pool.connection_class, redis.SSLConnection),
        "ssl": {
            name: _CERT_REQS.get(value, value) if name == "ssl_cert_reqs" else value
            for name, value in options.items()
            if name.startswith("ssl_")
        },
    }
    if isinstance(pool, SentinelConnectionPool):
        manager = pool.sentinel_manager
        seen["master"] = pool.service_name
        # sorted: redis-py moves the sentinel that answered to the front
        seen["sentinels"] = sorted(
            (node.connection_pool.connection_kwargs["host"], node.connection_pool.connection_kwargs["port"])
            for node in manager.sentinels
        )
        asked = manager.sentinel_kwargs
        seen["sentinel_kwargs"] = {name: value for name, value in asked.items() if not name.startswith("socket_")}
        seen["min_other_sentinels"] = manager.min_other_sentinels
    elif options.get("path"):
        seen["path"] = options["path"]
    else:
        seen["host"], seen["port"] = options["host"], int(options["port"])
    return seen


@pytest.mark.parametrize("case", list(CASES))
def test_the_store_reaches_the_broker_as_kombu_does(case: str, request: pytest.FixtureRequest) -> None:
    fixture, conf_of = CASES[case]
    conf = conf_of(request.getfixturevalue(fixture))
    app = Celery(f"urls-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.update({**conf, "redisdelay_key_prefix": f"urls-{uuid.uuid4().hex[:6]}"})
    connection = app.connection_for_write()
    try:
        kombu_client = connection.default_channel.client
        rd = RedisDelay(app)
        assert effective(rd.client) == effective(kombu_client)
        key = f"urls:{uuid.uuid4().hex}"
        kombu_client.set(key, "from kombu", ex=60)
        assert rd.client.get(key) == b"from kombu"
        rd.client.set(key, "from the store", ex=60)
        assert kombu_client.get(key) == b"from the store"
        sentinel = isinstance(kombu_client.connection_pool, SentinelConnectionPool)
        assert broker_is_store(app, rd.client) is not sentinel, "the one-script release runs on the broker's server"
        assert rd.wire_format is True
    finally:
        connection.release()
        app.close()


@pytest.mark.parametrize(
    ("conf", "names"),
    [
        ({"broker_url": "redis://127.0.0.1:port/0"}, "broker_url.*integer"),
        ({"broker_url": "redis://127.0.0.1/db2"}, "broker_url.*database must be a number"),
        ({"broker_url": "amqp://", "broker_write_url": "redis://127.0.0.1/x"}, "broker_write_url.*database"),
        ({"broker_url": "sentinel://127.0.0.1:26379"}, "broker_url.*master_name"),
        ({"broker_url": "socket:///run/redis.sock"}, "broker_url.*socket"),
        ({"broker_url": "redis+tcp://127.0.0.1"}, "broker_url.*only socket://"),
        ({"broker_url": "amqp://guest@localhost//"}, r"broker \(broker_url\) is not a Redis"),
    ],
)
def test_a_broker_url_the_store_cannot_follow_names_the_setting(conf: dict[str, Any], names: str) -> None:
    with pytest.raises(ConfigurationError, match=names):
        Settings.from_conf(conf)
