"""The depot: where one Celery app's delayed calls are kept, as the layers below the extension see it.

It holds the app's ``redisdelay_*`` settings, the store's Redis client and shards, and the form a call is
stored in for the app's broker. Each part is worked out the first time it is needed, since an app is
often configured after the extension is bound to it. The producer side, the releasers, the worker's
tracking and the operator's functions take a depot (or the parts of it they need); only the extension
knows them all.
"""

from __future__ import annotations

from typing import Any, Protocol

from kombu.serialization import prepare_accept_content

from .. import broker_redis
from ..errors import ConfigurationError, PayloadError
from ..message import wire
from ..message.envelope import Envelope
from ..message.stored import encode_stored
from ..settings import Settings, check_protocol
from .calls import CallStore, redis_errors
from .connection import broker_is_store, connect, eviction_policy, is_cluster
from .forks import cached_property
from .keys import Keyspace
from .limits import Limit, quotas_from_conf
from .outbox import Outbox
from .shards import ShardSet


class Depot:
    """Where the delayed calls of ``app`` are kept: see the module's docstring."""

    def __init__(self, app: Any) -> None:
        self.app = app
        #: The hostname of the worker this process belongs to, set by the worker's steps before its pool
        #: starts (a forked pool process inherits it): its runs' starts name the worker its leases and its
        #: stale-delivery checks name. Celery's request may say another (its in-process test worker's
        #: requests say the bare host); empty outside a worker.
        self.worker_name = ""
        #: Whether this worker's task channel leaves kombu's unacked bookkeeping out for the store's deliveries
        #: (``redisdelay_skip_unacked``), set by the worker's consumer step: its channel's close then puts back
        #: the calls it holds, which the leases would otherwise give back.
        self.skipping_unacked = False

    @cached_property
    def settings(self) -> Settings:
        """The ``redisdelay_*`` settings, read from ``app.conf`` once and checked."""
        check_protocol(self.app.conf)
        return Settings.from_conf(self.app.conf)

    @cached_property
    def quotas(self) -> dict[str, Limit]:
        """The quotas tasks share (the ``redisdelay_quotas`` setting), checked."""
        return quotas_from_conf(self.app.conf)

    @cached_property
    def client(self) -> Any:
        """The store's client: ``redis.Redis`` (one server or Sentinel's master) or ``RedisCluster``."""
        return connect(self.settings)

    @cached_property
    def shards(self) -> ShardSet:
        """The call stores: ``redisdelay_shards`` of them, plus retired ones that still hold calls."""
        settings = self.settings
        if settings.wait_replicas and is_cluster(self.client):
            raise ConfigurationError(
                "redisdelay_wait_replicas is not supported with a Redis Cluster store (WAIT cannot share a "
                "cluster pipeline); set it to 0, or use Sentinel or a single server"
            )
        wait_ms = round(settings.wait_timeout * 1000)
        return ShardSet(self.client, settings.key_prefix, settings.shards, settings.wait_replicas, wait_ms)

    @cached_property
    def outbox(self) -> Outbox:
        """This process's starts and acknowledgements, written in batches (:mod:`celery_redisdelay.store.outbox`)."""
        return Outbox(self)

    @property
    def store(self) -> CallStore:
        """The first shard's store (the only one unless ``redisdelay_shards`` is set)."""
        return self.shards.stores[0]

    @property
    def keys(self) -> Keyspace:
        """The keys of the first shard."""
        return self.store.keys

    @cached_property
    def accepted_content_types(self) -> frozenset[str] | None:
        """The content types workers accept (the app's ``accept_content``), or None for any."""
        accept = self.app.conf.accept_content
        return frozenset(prepare_accept_content(accept)) if accept else None

    @cached_property
    def fast_release(self) -> bool:
        """Whether parked calls are stored as broker messages that the release script pushes itself.

        ``redisdelay_fast_release`` None (the default) turns it on when the broker is a Redis on the
        same server and database as the store; True insists on it; False keeps the kombu path.
        """
        wanted = self.settings.fast_release
        if wanted is False:
            return False
        shared = broker_is_store(self.app, self.client)
        if wanted and not shared:
            raise ConfigurationError(
                "redisdelay_fast_release is True, but the broker is not a Redis on the same server and database "
                "as redisdelay_url; set it to None (automatic) or False"
            )
        return shared

    @cached_property
    def amqp_broker(self) -> bool:
        """Whether the app's broker speaks AMQP (RabbitMQ, through py-amqp or librabbitmq), found without connecting.
        Such a broker puts back at once what a consumer whose channel closed had not acknowledged
        (worker/stale.py), and confirms each publish when asked (release/confirms.py)."""
        with self.app.connection_for_write() as connection:
            return broker_redis.speaks_amqp(connection)

    @cached_property
    def wire_format(self) -> bool:
        """Whether parked calls are stored as the broker message itself: whenever the broker is a Redis
        (unless ``redisdelay_fast_release`` is False). Where the store is not the broker's server (a
        cluster, another Redis), the releaser pushes those messages onto the broker's lists in one
        pipeline per batch instead of publishing them one by one through kombu."""
        if self.settings.fast_release is False:
            return False
        connection = self.app.connection_for_write()
        try:
            return broker_redis.is_redis_transport(connection)
        finally:
            connection.release()

    @cached_property
    def broker_layout(self) -> wire.BrokerLayout:
        """How kombu's Redis transport names the app's queue lists (prefix, priority steps)."""
        return wire.BrokerLayout.of(self.app)

    def encode(self, envelope: Envelope) -> tuple[bytes, wire.Template | None]:
        """The payload a call built by Celery is stored as, with its broker message template if it is one
        (see :func:`~celery_redisdelay.message.stored.encode_stored`)."""
        return encode_stored(self.app, self.broker_layout if self.wire_format else None, envelope)

    def check_size(self, what: str, size: int) -> None:
        """Refuse to store more than ``redisdelay_max_payload_bytes`` for one call (or batch item)."""
        limit = self.settings.max_payload_bytes
        if size > limit:
            raise PayloadError(
                f"the message of {what} is {size:,} bytes, more than redisdelay_max_payload_bytes ({limit:,}); "
                "pass a reference to the data (an id, a URL) instead of the data, or raise the setting; "
                "nothing was stored"
            )

    def stats(self) -> dict[str, int]:
        """Counts of calls per state over every shard (see ``RedisDelay.stats``)."""
        return self.shards.total([store.stats() for store in self.shards.all()])

    def eviction_policy(self) -> str | None:
        """The store's Redis ``maxmemory-policy``; None when it refuses ``CONFIG``."""
        return eviction_policy(self.client)

    def ping(self) -> bool:
        """Check that the store's Redis answers; raises :class:`StoreUnavailableError` when it does not."""
        with redis_errors("ping Redis"):
            return bool(self.client.ping())


class HoldsDepot(Protocol):
    """Anything that holds a depot: the extension (``rd.depot``)."""

    @property
    def depot(self) -> Depot: ...


def depot_of(source: Depot | HoldsDepot) -> Depot:
    """The depot of ``source``: a depot, or what holds one. Public functions of the layers below the
    extension that were documented as taking ``rd`` take either."""
    return source if isinstance(source, Depot) else source.depot
