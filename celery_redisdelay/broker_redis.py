"""The broker's Redis, reached the way kombu's Redis transport reaches it, for a store that shares it.

kombu reads the broker URL (``redis://``, ``rediss://``, ``redis+socket:///path``, ``sentinel://h1;sentinel://h2``,
a list or a ``;`` failover list, of which it uses the first) and merges Celery's ``broker_*`` settings into
it: :func:`broker_connection` makes that ``kombu.Connection`` as ``app.connection_for_write()`` does, and
the public reading of it (hostname, port, userid, password, virtual_host, ssl, alt, transport_options)
is kombu's own. :func:`read` then repeats the last step, which kombu keeps private: how its Redis
channel turns that reading into redis-py's arguments (``Channel._connparams``,
``SentinelChannel._sentinel_managed_pool``). ``tests/test_broker_urls.py`` proves the result equal to
kombu's own channel on real servers, at the oldest and the newest kombu we declare.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import kombu
from kombu.transport import get_transport_cls
from kombu.transport.redis import SentinelTransport, Transport
from kombu.utils.url import maybe_sanitize_url, url_to_parts

from .errors import ConfigurationError

DEFAULT_HOST = "127.0.0.1"  # kombu's default, where redis-py's is "localhost"


@dataclass(frozen=True)
class BrokerRedis:
    """Where kombu's Redis channel connects, and as whom."""

    host: str | None
    port: int | None
    path: str | None  # a unix socket (``redis+socket:///path``) instead of host and port
    db: int
    username: str | None = None
    password: str | None = None
    #: The TLS options when kombu uses TLS (``rediss://``, or any Redis URL with ``broker_use_ssl``).
    ssl: dict[str, Any] | None = None
    #: Further connection arguments kombu takes from a socket URL's query.
    extra: dict[str, Any] = field(default_factory=dict)
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str | None = None
    sentinel_kwargs: dict[str, Any] | None = None
    min_other_sentinels: int = 0

    @property
    def address(self) -> tuple[Any, ...]:
        """Server and database, comparable with :func:`address_of` a redis-py client."""
        return ("unix", self.path, self.db) if self.path else ("tcp", self.host, self.port, self.db)

    def store_url(self) -> str:
        """The store URL for :func:`celery_redisdelay.store.connection.connect`, without credentials (they go
        in :meth:`client_options`, so the URL can be logged)."""
        tls = "s" if self.ssl is not None else ""
        if self.sentinels:
            hosts = ",".join(f"{_netloc(host)}:{port}" for host, port in self.sentinels)
            return f"redis{tls}+sentinel://{hosts}/{quote(self.master_name or '', safe='')}/{self.db}"
        if self.path:
            return f"unix://{quote(self.path)}?db={self.db}"
        return f"redis{tls}://{_netloc(self.host or DEFAULT_HOST)}:{self.port}/{self.db}"

    def client_options(self) -> dict[str, Any]:
        """redis-py client arguments that the URL does not carry: credentials, TLS, Sentinel options."""
        options: dict[str, Any] = {**self.extra, **(self.ssl or {})}
        options.update({name: value for name in ("username", "password") if (value := getattr(self, name))})
        if self.sentinels:
            if self.sentinel_kwargs is not None:
                options["sentinel_kwargs"] = dict(self.sentinel_kwargs)
            options["min_other_sentinels"] = self.min_other_sentinels
        return options


def _netloc(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _setting(conf: Mapping[str, Any], name: str) -> Any:
    try:
        return getattr(conf, name)  # Celery's Settings: its properties (CELERY_BROKER_URL...) apply
    except AttributeError:
        return conf.get(name)


def broker_setting(conf: Mapping[str, Any]) -> str:
    """The name of the setting the broker URL comes from, for error messages."""
    return "broker_write_url" if conf.get("broker_write_url") else "broker_url"


def broker_connection(conf: Mapping[str, Any]) -> kombu.Connection:
    """The broker connection, not connected, as Celery's ``app.connection_for_write()`` makes it from ``conf``."""
    url = _setting(conf, "broker_write_url") or _setting(conf, "broker_url")
    try:
        return kombu.Connection(
            url,
            _setting(conf, "broker_user"),
            _setting(conf, "broker_password"),
            _setting(conf, "broker_vhost"),
            _setting(conf, "broker_port"),
            transport=_setting(conf, "broker_transport"),
            ssl=_setting(conf, "broker_use_ssl") or False,
            transport_options=dict(_setting(conf, "broker_transport_options") or {}),
        )
    except (ValueError, TypeError, KeyError, ImportError) as exc:
        raise ConfigurationError(
            f"redisdelay_url is not set, and kombu cannot read the broker URL ({broker_setting(conf)}): {exc}"
        ) from exc


def speaks_amqp(connection: kombu.Connection) -> bool:
    """Whether kombu reaches this broker over AMQP (RabbitMQ, through py-amqp or librabbitmq), found without
    connecting."""
    return str(getattr(connection.transport, "driver_type", "")) == "amqp"


def is_redis_transport(connection: kombu.Connection) -> bool:
    """Whether kombu reaches this broker with its Redis transport (``redis``, ``rediss``, ``sentinel``)."""
    try:
        transport = get_transport_cls(connection.transport_cls)
    except (KeyError, ImportError, AttributeError):
        return False
    return isinstance(transport, type) and issubclass(transport, Transport)


def read(connection: kombu.Connection, setting: str = "broker_url") -> BrokerRedis | None:
    """Where kombu's Redis channel connects for ``connection``; None when its transport is not Redis.

    A URL kombu would fail on only when it connects (a database that is not a number, a Sentinel
    broker without ``master_name``) raises :class:`ConfigurationError` naming ``setting`` at once.
    """
    if not is_redis_transport(connection):
        return None
    transport = get_transport_cls(connection.transport_cls)
    default_port = int(transport.default_port)
    try:
        parts = _channel_parameters(connection, default_port)
        if issubclass(transport, SentinelTransport):
            return _sentinel(connection, parts, default_port)
        return BrokerRedis(**parts)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"redisdelay_url is not set, and kombu cannot use the broker URL ({setting}): {exc}"
        ) from exc


def _channel_parameters(connection: kombu.Connection, default_port: int) -> dict[str, Any]:
    """kombu's ``Channel._connparams``: the host, database, credentials and TLS options of the channel."""
    host = connection.hostname or DEFAULT_HOST
    parts: dict[str, Any] = {
        "host": host,
        "port": int(connection.port or default_port),
        "path": None,
        "username": connection.userid,
        "password": connection.password,
        "ssl": None,
    }
    virtual_host = connection.virtual_host
    # kombu: connparams.update(ssl), and TLS only if that worked (``broker_use_ssl = True`` is plain TCP)
    with contextlib.suppress(TypeError, ValueError):
        parts["ssl"] = dict(connection.ssl) if connection.ssl else None
    if "://" in host:
        scheme, _, _, username, password, path, query = url_to_parts(host)
        if scheme != "socket":
            raise ValueError(f"kombu's Redis transport reads only socket:// after redis+, not {scheme}://")
        query = dict(query)
        virtual_host = query.pop("virtual_host", virtual_host)
        query.pop("db", None)  # kombu's database is the virtual host's, whatever the query says
        parts.update(host=None, port=None, path="/" + (path or ""), username=username, password=password)
        parts["extra"] = query
    parts["db"] = _database(virtual_host)
    return parts


def _database(virtual_host: Any) -> int:
    """kombu's ``Channel._prepare_virtual_host``."""
    if isinstance(virtual_host, numbers.Integral):
        return int(virtual_host)
    if not virtual_host or virtual_host == "/":
        return 0
    try:
        return int(str(virtual_host).removeprefix("/"))
    except ValueError:
        raise ValueError(f"the database must be a number, not {virtual_host!r}") from None


def _sentinel(connection: kombu.Connection, parts: dict[str, Any], default_port: int) -> BrokerRedis:
    """kombu's ``SentinelChannel._sentinel_managed_pool``: every ``sentinel://`` URL of the list is a
    sentinel (host and port only); credentials, database and TLS come from the first."""
    options = connection.transport_options or {}
    master_name = options.get("master_name")
    if not isinstance(master_name, str) or not master_name:
        raise ValueError(
            "the broker is sentinel:// but broker_transport_options has no master_name; set it, or set "
            "redisdelay_url = 'redis+sentinel://host:26379/master-name/0'"
        )
    if parts["path"]:
        raise ValueError("a Sentinel broker cannot be a unix socket")
    sentinels = []
    for url in connection.alt:
        scheme, hostname, port = url_to_parts(url)[:3]
        if scheme == "sentinel":
            if not hostname:
                raise ValueError(f"the sentinel URL {maybe_sanitize_url(url)!r} has no host")
            sentinels.append((hostname, int(port or default_port)))
    parts.update(
        sentinels=tuple(sentinels) or ((parts["host"], parts["port"]),),
        master_name=master_name,
        sentinel_kwargs=options.get("sentinel_kwargs"),
        min_other_sentinels=int(options.get("min_other_sentinels") or 0),
    )
    return BrokerRedis(**parts)


def address_of(client: Any) -> tuple[Any, ...]:
    """Server and database of a redis-py client, as :attr:`BrokerRedis.address`."""
    options = client.connection_pool.connection_kwargs
    db = int(options.get("db") or 0)
    if options.get("path"):
        return ("unix", options["path"], db)
    return ("tcp", options.get("host", "localhost"), int(options.get("port", 6379)), db)
