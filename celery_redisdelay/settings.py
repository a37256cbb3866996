"""The ``redisdelay_*`` settings, read once from ``app.conf`` and checked."""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .broker_redis import broker_connection, broker_setting, read, speaks_amqp
from .errors import ConfigurationError

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
#: Store URLs beyond redis-py's own: a Redis Cluster (any node), and masters found through Sentinel.
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
STORE_SCHEMES = REDIS_SCHEMES + CLUSTER_SCHEMES + SENTINEL_SCHEMES

#: Every setting with its default. ``None`` defaults are derived (see :meth:`Settings.from_conf`).
DEFAULTS: dict[str, Any] = {
    "redisdelay_url": None,
    "redisdelay_key_prefix": "redisdelay",
    "redisdelay_tick_interval": 1.0,
    "redisdelay_visibility_timeout": 3600.0,
    "redisdelay_queue_timeout": None,
    "redisdelay_claim_timeout": 30.0,
    "redisdelay_max_deliveries": 10,
    "redisdelay_release_batch": 500,
    "redisdelay_fast_release": None,
    "redisdelay_precise_release": None,
    "redisdelay_max_payload_bytes": 1024 * 1024,
    "redisdelay_shards": 1,
    "redisdelay_cluster": False,
    "redisdelay_connection_options": None,
    "redisdelay_wait_replicas": 0,
    "redisdelay_wait_timeout": 1.0,
    "redisdelay_all_tasks": False,
    "redisdelay_park_received": None,
    "redisdelay_park_received_after": 1.0,
    "redisdelay_lease": 30.0,
    "redisdelay_lease_renewal": 10.0,
    "redisdelay_skip_unacked": None,
    "redisdelay_track_due_now": None,
    "redisdelay_worker_lost": None,
    "redisdelay_probe_file": None,
    "redisdelay_quotas": None,  # checked by store/limits.py when a call names a quota
    "redisdelay_task_limits": None,  # checked by producer/adoption.py at a plain task's first call
}
#: The start of every setting's name (after Celery's namespace, where the app has one: ``CELERY_REDISDELAY_URL``).
PREFIX = "redisdelay_"


def check_names(conf: Iterable[Any], namespace: str | None = None) -> None:
    """Refuse a setting named as ours (``redisdelay_*``) that celery-redisdelay does not read, naming the closest
    one it reads: Celery keeps whatever it is given, and a misspelt setting would be ignored without a word.

    ``conf``: the settings (``app.conf``, or the names set before it is loaded); ``namespace``: the app's (by
    default ``app.conf``'s own), from ``app.config_from_object(..., namespace="CELERY")``, under which Celery reads
    ``CELERY_REDISDELAY_URL`` for ``redisdelay_url`` (and still ``redisdelay_url`` itself). Upper-case names
    outside it (``REDISDELAY_URL``) are refused too: Celery reads upper-case names without a namespace for its own
    settings only, never for ours."""
    keys = list(conf)  # first: listing app.conf loads it, and Celery gives it the app's namespace then
    namespace = namespace or getattr(conf, "prefix", None)
    prefix = namespace.rstrip("_") + "_" if namespace else ""
    for key in keys:
        name = _setting_named(key, prefix)
        if name is not None and key not in _spellings(name, prefix):
            raise ConfigurationError(_unread(key, name, prefix))


def _setting_named(key: Any, prefix: str) -> str | None:
    """The setting a key names, lower-case and without a namespace (the app's, or the usual ``CELERY_``); None for
    a key that is not named as one of ours."""
    if not isinstance(key, str):
        return None
    name = key.lower()
    for namespace in (prefix.lower(), "celery_"):
        if namespace and name.startswith(namespace + PREFIX):
            name = name[len(namespace) :]
            break
    return name if name.startswith(PREFIX) else None


def _spellings(name: str, prefix: str) -> tuple[str, ...]:
    """The keys Celery reads a setting under: its name, and under a namespace the namespaced name in the namespace's
    case (Celery's ``ConfigurationView``); none for a name that is not one of ours."""
    if name not in DEFAULTS:
        return ()
    if not prefix:
        return (name,)
    namespaced = prefix + name
    return name, namespaced.upper() if prefix.isupper() else namespaced.lower()


def _spelt_like(key: str, name: str, prefix: str) -> str:
    """The setting ``name`` spelt as ``key`` would be read: namespaced where the key is, or is upper-case."""
    if prefix and (key.lower().startswith(prefix.lower()) or not key.islower()):
        return _spellings(name, prefix)[-1]
    return name


def _unread(key: str, name: str, prefix: str) -> str:
    """Why celery-redisdelay refuses ``key``, and what to write instead."""
    if name in DEFAULTS:  # one of ours, where Celery does not look for it
        return (
            f"{key} is not read: this app reads that setting as {_spelt_like(key, name, prefix)} (Celery reads "
            "celery-redisdelay's settings in upper case only under a namespace: CELERY_REDISDELAY_... after "
            "app.config_from_object(..., namespace='CELERY')); rename it (nothing was stored)"
        )
    # Compared without the prefix they share, which would make every name look close to every other.
    names = [known.removeprefix(PREFIX) for known in DEFAULTS]
    close = difflib.get_close_matches(name.removeprefix(PREFIX), names, n=1)
    if close:
        hint = f"did you mean {_spelt_like(key, PREFIX + close[0], prefix)}? Rename it"
    else:
        every = ", ".join(_spelt_like(key, known, prefix) for known in DEFAULTS)
        hint = f"rename it to one of its settings ({every}), or remove it"
    return f"{key} is not a setting of celery-redisdelay, which would ignore it: {hint} (nothing was stored)"


def positive_setting(conf: Mapping[str, Any], name: str, *, integer: bool = False) -> Any:
    """The setting ``name`` (or its default), checked to be a positive number; ConfigurationError if not."""
    value = conf.get(name)
    if value is None:
        value = DEFAULTS[name]
    valid_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not valid_type or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ConfigurationError(f"{name} must be {kind}, not {value!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """The extension's configuration; durations in seconds."""

    url: str
    key_prefix: str
    tick_interval: float
    visibility_timeout: float
    queue_timeout: float
    claim_timeout: float
    max_deliveries: int
    release_batch: int
    fast_release: bool | None = None
    #: Each worker runs a precise releaser (release/precise.py): it releases due calls and sweeps the ones whose
    #: lease ran out, so no beat is needed. None (the default) and True: every worker does; False: only beat's tick
    #: or ``celery -A proj redisdelay releaser`` release and sweep.
    precise_release: bool | None = None
    max_payload_bytes: int = 1024 * 1024
    shards: int = 1
    cluster: bool = False
    #: Keyword arguments for redis-py's client (``ssl_ca_certs``, ``username``, ``socket_timeout``...).
    connection_options: dict[str, Any] = field(default_factory=dict)
    #: Replicas that must confirm each park (Redis ``WAIT``) within ``wait_timeout`` seconds; 0: none.
    wait_replicas: int = 0
    wait_timeout: float = 1.0
    #: Every task of the app parks its calls with a countdown or eta (not only ``@rd.delayed`` ones).
    all_tasks: bool = False
    #: A worker parks the eta messages it receives for the app's tasks (default: as ``all_tasks``) ...
    park_received: bool = False
    #: ... whose eta is more than this many seconds away (nearer ones it runs as Celery does).
    park_received_after: float = 1.0
    #: A worker holds the calls it has received under a lease this long, renewed every ``lease_renewal``
    #: seconds: a call whose lease runs out (its worker died) is delivered again.
    lease: float = 30.0
    lease_renewal: float = 10.0
    #: A worker leaves kombu's unacknowledged-message bookkeeping out for the calls the store released: their
    #: leases track them, and a call given back or requeued goes back through the store (worker/unacked.py).
    #: None (the default): where the broker is the store's Redis through kombu's Redis transport; True insists
    #: (a warning where it cannot); False keeps kombu's bookkeeping.
    skip_unacked: bool | None = None
    #: With ``all_tasks``, a call due now of the app's plain tasks goes through the store too: written in flight and
    #: pushed onto the broker's queue in one script (``send.lua``), then held under a lease like a released call.
    #: None (the default): where the broker is the store's Redis; True insists (a warning where it cannot); False
    #: leaves calls due now on Celery's own path.
    track_due_now: bool | None = None
    #: What becomes of a call whose run was cut short with its worker, for every task that does not say
    #: (``redisdelay_worker_lost`` on the task): :data:`DEAD_LETTER` or :data:`RUN_AGAIN`; None (the default): as
    #: each task acknowledges (see :mod:`celery_redisdelay.worker.contract`).
    worker_lost: str | None = None
    #: A file each worker touches (at most once a second) while its event loop turns, it consumes every queue it
    #: should and its leases are renewed: for a liveness probe that cannot reach the store (``redisdelay probe
    #: --file``). Celery's ``%h``, ``%n`` and ``%d`` are expanded as in ``--pidfile``. None (the default):
    #: no file.
    probe_file: str | None = None

    @property
    def workers_release(self) -> bool:
        """Whether each worker runs a precise releaser (``redisdelay_precise_release`` not False)."""
        return self.precise_release is not False

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> Settings:
        """Read and check the settings; raise :class:`ConfigurationError` naming the bad one (an unknown
        ``redisdelay_*`` one too, see :func:`check_names`)."""
        check_names(conf)
        url, broker_options = _store_url(conf)
        options = _connection_options(conf)
        wait_replicas = conf.get("redisdelay_wait_replicas") or 0
        if isinstance(wait_replicas, bool) or not isinstance(wait_replicas, int) or wait_replicas < 0:
            raise ConfigurationError(f"redisdelay_wait_replicas must be an integer >= 0, not {wait_replicas!r}")
        cluster = conf.get("redisdelay_cluster") or False
        if not isinstance(cluster, bool):
            raise ConfigurationError(f"redisdelay_cluster must be True or False, not {cluster!r}")
        prefix = conf.get("redisdelay_key_prefix") or DEFAULTS["redisdelay_key_prefix"]
        if not isinstance(prefix, str):
            raise ConfigurationError(f"redisdelay_key_prefix must be a string, not {prefix!r}")
        all_tasks = bool(_optional_bool(conf, "redisdelay_all_tasks"))
        park_received = _optional_bool(conf, "redisdelay_park_received")
        park_received_after = _park_received_after(conf)
        lease, lease_renewal = _lease(conf)
        return cls(
            url=url,
            key_prefix=prefix,
            tick_interval=float(positive_setting(conf, "redisdelay_tick_interval")),
            visibility_timeout=float(positive_setting(conf, "redisdelay_visibility_timeout")),
            queue_timeout=_queue_timeout(conf),
            claim_timeout=float(positive_setting(conf, "redisdelay_claim_timeout")),
            max_deliveries=int(positive_setting(conf, "redisdelay_max_deliveries", integer=True)),
            release_batch=int(positive_setting(conf, "redisdelay_release_batch", integer=True)),
            fast_release=_optional_bool(conf, "redisdelay_fast_release"),
            precise_release=_optional_bool(conf, "redisdelay_precise_release"),
            max_payload_bytes=int(positive_setting(conf, "redisdelay_max_payload_bytes", integer=True)),
            shards=int(positive_setting(conf, "redisdelay_shards", integer=True)),
            cluster=cluster or url.startswith(CLUSTER_SCHEMES),
            connection_options={**broker_options, **options},
            wait_replicas=wait_replicas,
            wait_timeout=float(positive_setting(conf, "redisdelay_wait_timeout")),
            all_tasks=all_tasks,
            park_received=all_tasks if park_received is None else park_received,
            park_received_after=park_received_after,
            lease=lease,
            lease_renewal=lease_renewal,
            skip_unacked=_optional_bool(conf, "redisdelay_skip_unacked"),
            track_due_now=_optional_bool(conf, "redisdelay_track_due_now"),
            worker_lost=worker_lost_choice(conf.get("redisdelay_worker_lost"), "redisdelay_worker_lost"),
            probe_file=_probe_file(conf.get("redisdelay_probe_file")),
        )


def _store_url(conf: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The store's URL, and the connection options it takes from the broker's settings (when it is the broker's)."""
    url = conf.get("redisdelay_url")
    if not url:
        # The store shares the broker's Redis: where kombu connects, as whom, with its TLS options.
        return _broker_store(conf)
    if not isinstance(url, str) or not url.startswith(STORE_SCHEMES):
        raise ConfigurationError(
            "redisdelay_url must be a redis://, rediss://, unix://, redis+cluster:// or redis+sentinel:// "
            f"URL, not {url!r}"
        )
    return url, {}


def _connection_options(conf: Mapping[str, Any]) -> Mapping[str, Any]:
    options = conf.get("redisdelay_connection_options")
    if options is None:
        return {}
    if not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options):
        raise ConfigurationError(
            f"redisdelay_connection_options must be a dict of redis-py client options, not {options!r}"
        )
    return options


def _park_received_after(conf: Mapping[str, Any]) -> float:
    after = conf.get("redisdelay_park_received_after")
    if after is None:
        after = DEFAULTS["redisdelay_park_received_after"]
    if isinstance(after, bool) or not isinstance(after, (int, float)) or not 0 <= after < math.inf:
        raise ConfigurationError(f"redisdelay_park_received_after must be a number of seconds >= 0, not {after!r}")
    return float(after)


def _lease(conf: Mapping[str, Any]) -> tuple[float, float]:
    """The lease and its renewal period, the lease the longer."""
    lease = float(positive_setting(conf, "redisdelay_lease"))
    lease_renewal = float(positive_setting(conf, "redisdelay_lease_renewal"))
    if lease <= lease_renewal:
        raise ConfigurationError(
            f"redisdelay_lease ({lease:g} s) must be longer than redisdelay_lease_renewal ({lease_renewal:g} s): "
            "a lease must outlast the wait for its renewal (the defaults are 30 and 10)"
        )
    return lease, lease_renewal


#: The default queue timeout where the broker speaks AMQP (RabbitMQ): a day. A durable queue keeps a message the
#: broker confirmed until a consumer takes it, however old the backlog; the sweep is there for a queue purged or
#: deleted, or a message dropped by a TTL or a length limit, and a backlog older than this is published again (the
#: older copy, checked against the store when a worker takes it, is dropped unrun: worker/stale.py).
AMQP_QUEUE_TIMEOUT = 86_400.0


def _queue_timeout(conf: Mapping[str, Any]) -> float:
    queue_timeout = conf.get("redisdelay_queue_timeout")
    if queue_timeout is None and _broker_speaks_amqp(conf):
        queue_timeout = AMQP_QUEUE_TIMEOUT
    elif queue_timeout is None:
        # Outlast the broker's own visibility timeout: kombu restores messages a dead worker had
        # prefetched after that long, and sweeping them earlier would deliver them twice.
        transport = conf.get("broker_transport_options") or {}
        queue_timeout = 2 * max(float(transport.get("visibility_timeout", 3600)), 3600.0)
    return float(positive_setting({"redisdelay_queue_timeout": queue_timeout}, "redisdelay_queue_timeout"))


#: A run cut short with its worker is run again (at-least-once) ...
RUN_AGAIN = "run_again"
#: ... or dead-lettered, not run again (at most once past its start).
DEAD_LETTER = "dead_letter"
WORKER_LOST_CHOICES = (DEAD_LETTER, RUN_AGAIN)


def worker_lost_choice(value: Any, where: str) -> str | None:
    """``value`` if it is one of :data:`WORKER_LOST_CHOICES` or None; ConfigurationError naming ``where`` and the
    choices if not."""
    if value is None or (isinstance(value, str) and value in WORKER_LOST_CHOICES):
        return value
    allowed = " or ".join(repr(choice) for choice in WORKER_LOST_CHOICES)
    raise ConfigurationError(f"{where} must be {allowed}, or None (as the task acknowledges), not {value!r}")


def _probe_file(value: Any) -> str | None:
    """``redisdelay_probe_file``: a path (``os.PathLike`` too) or None; ConfigurationError if not."""
    if value is None:
        return None
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str) or not path.strip():
        raise ConfigurationError(
            f"redisdelay_probe_file must be the path of a file the worker may write (a string, such as "
            f"'/tmp/celery-alive'), or None for no file, not {value!r}"
        )
    return path


def _optional_bool(conf: Mapping[str, Any], name: str) -> bool | None:
    value = conf.get(name)
    if value is not None and not isinstance(value, bool):
        automatic = " or None (automatic)" if DEFAULTS[name] is None else ""
        raise ConfigurationError(f"{name} must be True or False{automatic}, not {value!r}")
    return value


def _broker_speaks_amqp(conf: Mapping[str, Any]) -> bool:
    """Whether the broker, as Celery's ``app.connection_for_write()`` reaches it, speaks AMQP (no broker URL at all is
    Celery's default, a RabbitMQ on localhost). A URL kombu cannot read is not refused here: a store of its own may
    not need it, and the worker says what is wrong with it."""
    try:
        connection = broker_connection(conf)
    except ConfigurationError:
        return False
    try:
        return speaks_amqp(connection)
    except (ValueError, TypeError, KeyError, ImportError):
        return False
    finally:
        connection.release()


def _broker_store(conf: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The store URL and client options of the broker's Redis, as kombu reaches it."""
    setting = broker_setting(conf)
    broker = read(broker_connection(conf), setting)
    if broker is None:
        raise ConfigurationError(
            f"redisdelay_url is not set and the broker ({setting}) is not a Redis; "
            "set app.conf.redisdelay_url = 'redis://host:6379/0'"
        )
    return broker.store_url(), broker.client_options()


def check_protocol(conf: Any) -> None:
    """Refuse Celery's task message protocol 1: its countdown cannot be taken out of the message.

    Before the app is configured, ``conf`` is what was set so far (Celery's ``app._preconf``): reading
    ``app.conf`` then would load the configuration before the user is done with it."""
    protocol = conf.get("task_protocol") or 2
    if protocol != 2:
        raise ConfigurationError(
            f"task_protocol = {protocol!r}: celery-redisdelay needs Celery's task message protocol 2 (the default); "
            "remove the task_protocol setting"
        )
