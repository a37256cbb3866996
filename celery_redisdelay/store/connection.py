"""The store's Redis client, from ``redisdelay_url``: a single server, a Redis Cluster, or Sentinel.

``redis://`` / ``rediss://`` / ``unix://``
    one server, through redis-py's ``Redis.from_url``.
``redis+cluster://host:port`` (``rediss+cluster://`` for TLS), or ``redisdelay_cluster = True``
    a Redis Cluster, found from any of its nodes.
``redis+sentinel://[user:password@]host:26379[,host2:26379]/master-name[/db]`` (``rediss+sentinel://``)
    the current master of ``master-name``, asked of the sentinels; after a failover the next
    command finds the new master.

``redisdelay_connection_options`` are keyword arguments of the client: ``ssl_ca_certs``, ``ssl_certfile``,
``ssl_keyfile``, ``ssl_cert_reqs``, ``username``, ``password``, ``socket_timeout``...; for Sentinel also
``sentinel_kwargs`` and ``min_other_sentinels``. When the store is the broker's Redis, the settings
start from what kombu uses for the broker (credentials, TLS options, see :mod:`.broker_redis`).
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel, SentinelConnectionPool

from .. import broker_redis
from ..errors import ConfigurationError
from ..settings import CLUSTER_SCHEMES, SENTINEL_SCHEMES, Settings
from .forks import fork_safe

HEALTH_CHECK_SECONDS = 30
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def client_options(settings: Settings) -> dict[str, Any]:
    """The client keyword arguments: the settings' options, with kombu-style values made redis-py's."""
    options = dict(settings.connection_options)
    reqs = options.get("ssl_cert_reqs")
    if isinstance(reqs, str):
        options["ssl_cert_reqs"] = _CERT_REQS.get(reqs.lower().removeprefix("cert_"), reqs)
    return options


def connect(settings: Settings) -> Any:
    """A new client for the store (``redis.Redis`` or ``RedisCluster``); connects lazily, and is safe to
    use in a forked child (see :mod:`celery_redisdelay.store.forks`)."""
    return fork_safe(_client(settings))


def _client(settings: Settings) -> Any:
    url = settings.url
    options = client_options(settings)
    try:
        if url.startswith(SENTINEL_SCHEMES):
            return _sentinel_master(url, options)
        if settings.cluster:
            for scheme in CLUSTER_SCHEMES:
                if url.startswith(scheme):
                    url = ("rediss://" if scheme.startswith("rediss") else "redis://") + url[len(scheme) :]
            return RedisCluster.from_url(url, **options)
        return redis.Redis.from_url(url, health_check_interval=HEALTH_CHECK_SECONDS, **options)
    except (ValueError, TypeError, redis.RedisError) as exc:
        raise ConfigurationError(f"cannot connect to redisdelay_url {url!r}: {exc}") from exc


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def eviction_policy(client: Any) -> str | None:
    """The server's ``maxmemory-policy`` (``noeviction`` when it says none); None when it refuses ``CONFIG`` (a
    managed Redis may)."""
    try:
        found: Any = client.config_get("maxmemory-policy")
    except redis.RedisError:
        return None
    if is_cluster(client) and found and all(isinstance(value, dict) for value in found.values()):
        found = next(iter(found.values()))  # one answer per node; they are configured alike
    policy = dict(found).get(b"maxmemory-policy") or dict(found).get("maxmemory-policy") or "noeviction"
    return policy.decode() if isinstance(policy, bytes) else str(policy)


def _sentinel_master(url: str, options: dict[str, Any]) -> redis.Redis:
    parts = urlsplit(url.replace("+sentinel", "", 1))
    path = [unquote(part) for part in parts.path.split("/") if part]
    if not path or len(path) > 2 or not parts.netloc:
        raise ValueError("expected redis+sentinel://[user:password@]host:port[,host:port]/master-name[/db]")
    credentials, _, hosts = parts.netloc.rpartition("@")
    sentinels = []
    for host in hosts.split(","):
        place = urlsplit(f"//{host}")  # [::1]:26379 -> ::1, 26379
        if not place.hostname:
            raise ValueError(f"no sentinel host in {host!r}")
        sentinels.append((place.hostname, place.port or 26379))
    if credentials:
        username, _, password = credentials.partition(":")
        options.setdefault("username", unquote(username) or None)
        options.setdefault("password", unquote(password) or None)
    if parts.scheme == "rediss":
        options.setdefault("ssl", True)
    database = int(path[1]) if len(path) == 2 else 0
    # The sentinels themselves are asked without the master's credentials or TLS (as kombu asks them):
    # set redisdelay_connection_options["sentinel_kwargs"] when they need their own.
    sentinel_kwargs = options.pop("sentinel_kwargs", None)
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        sentinels,
        min_other_sentinels=options.pop("min_other_sentinels", 0),
        sentinel_kwargs=sentinel_kwargs,
        socket_timeout=options.get("socket_timeout", 5),
    )
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        path[0], db=database, health_check_interval=HEALTH_CHECK_SECONDS, **options
    )
    return master


def broker_is_store(app: Any, client: redis.Redis) -> bool:
    """Whether the app's broker is a Redis on the server and database ``client`` talks to, as kombu reaches it."""
    if is_cluster(client) or isinstance(client.connection_pool, SentinelConnectionPool):
        return False
    connection = app.connection_for_write()
    try:
        broker = broker_redis.read(connection)
    except ConfigurationError:
        return False
    finally:
        connection.release()
    return broker is not None and not broker.sentinels and broker.address == broker_redis.address_of(client)
