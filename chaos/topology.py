"""The Redis side of a run, and the faults of Redis itself.

Three layouts, every server on 127.0.0.1 and durable (``chaos/server.py``):

* ``Standalone()``: the store and the broker on one redis-server (the default, and the common set-up);
* ``Standalone(apart=True)``: the broker on a redis-server of its own, so either can fail alone;
* ``Sentinels()``: a master and its replica watched by three Sentinels (quorum 2); the broker is kombu's
  ``sentinel://`` URL of the three and the store follows it (``redis+sentinel://``), on the master.

A fault of the store's Redis is a SIGTERM restart (``restart_store``), or a SIGKILL (``kill_store``):
a standalone server starts again from its append-only file; a Sentinel-managed master is replaced by
the replica the Sentinels promote, and comes back as its replica.
"""

from __future__ import annotations

import shutil
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import redis
from redis.sentinel import Sentinel

from celery_redisdelay.testing import RedisServer, kill_group, wait_for
from celery_redisdelay.testing.topologies import HOST, LocalSentinel

from .config import ENV_BROKER_URL, ENV_MASTER_NAME, ENV_URL
from .server import DurableRedis, durable_args

MASTER_NAME = "chaos"
SENTINELS = 3
PROMOTION_TIMEOUT = 60.0
SWITCH_POLL_SECONDS = 0.1


def client_for(port: int, **options: Any) -> redis.Redis:
    return redis.Redis(host=HOST, port=port, socket_connect_timeout=2, socket_timeout=10, **options)


class Topology(ABC):
    """What the runner needs of the Redis side; see the subclasses."""

    name = ""
    broker_apart = False

    @abstractmethod
    def start(self) -> None:
        """Start every server and wait until it answers."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every server (its data directory stays for the logs)."""

    @property
    @abstractmethod
    def store_url(self) -> str:
        """``redisdelay_url``; empty when the store follows the broker."""

    @property
    @abstractmethod
    def broker_url(self) -> str:
        """``broker_url``."""

    @property
    def master_name(self) -> str:
        return ""

    def env(self) -> dict[str, str]:
        return {ENV_URL: self.store_url, ENV_BROKER_URL: self.broker_url, ENV_MASTER_NAME: self.master_name}

    @abstractmethod
    def store_client(self) -> redis.Redis:
        """A new client of the store's current master (the caller closes it)."""

    def broker_client(self) -> redis.Redis:
        return self.store_client()

    @abstractmethod
    def servers(self) -> list[tuple[str, RedisServer]]:
        """Every redis-server process (and sentinel) of the run, by role, for the measurements."""

    @abstractmethod
    def pid(self, role: str) -> int | None:
        """The pid of the store's (master) or the broker's redis-server."""

    def server_name(self, role: str) -> str:
        """What serves ``role`` ("store" or "broker"), for the fault's line."""
        return "redis-server"

    @abstractmethod
    def fail(self, role: str, *, kill: bool) -> tuple[str, float]:
        """Restart the store's or the broker's Redis with SIGTERM, or SIGKILL it (``kill``), and wait until
        it answers again: (what happened, the wall clock of the signal)."""

    def version(self) -> str:
        with self.store_client() as client:
            return str(client.info("server")["redis_version"])

    @abstractmethod
    def describe(self) -> str:
        """One line for the run's log: the servers and where they listen."""


def _restart(server: DurableRedis, kill: bool) -> tuple[str, float]:
    signalled = time.time()
    if kill:
        down, loading = server.crash()
        return (
            f"SIGKILL, restarted from its append-only file, answering {loading:.2f}s later, down {down:.2f}s",
            signalled,
        )
    down, stopping = server.restart()
    return f"SIGTERM, exited after {stopping:.2f}s, down {down:.2f}s in all", signalled


class Standalone(Topology):
    """The store on a redis-server; the broker on the same one, or on one of its own (``apart``)."""

    def __init__(self, run_dir: Path, fsync: str = "everysec", *, apart: bool = False) -> None:
        self.name = "broker apart" if apart else "one redis-server"
        self.broker_apart = apart
        self.store = DurableRedis(run_dir / "redis", fsync=fsync)
        self.broker = DurableRedis(run_dir / "broker", fsync=fsync) if apart else self.store

    def start(self) -> None:
        self.store.start()
        if self.broker_apart:
            self.broker.start()

    def stop(self) -> None:
        self.store.terminate()
        if self.broker_apart:
            self.broker.terminate()

    @property
    def store_url(self) -> str:
        return f"{self.store.url}/0"

    @property
    def broker_url(self) -> str:
        return f"{self.broker.url}/0"

    def store_client(self) -> redis.Redis:
        return client_for(self.store.port)

    def broker_client(self) -> redis.Redis:
        return client_for(self.broker.port)

    def servers(self) -> list[tuple[str, RedisServer]]:
        found: list[tuple[str, RedisServer]] = [("store", self.store)]
        return [*found, ("broker", self.broker)] if self.broker_apart else found

    def pid(self, role: str) -> int | None:
        return self.broker.pid if role == "broker" else self.store.pid

    def fail(self, role: str, *, kill: bool) -> tuple[str, float]:
        return _restart(self.broker if role == "broker" else self.store, kill)

    def describe(self) -> str:
        where = f"store on {self.store.url}" + (
            f", broker on {self.broker.url}" if self.broker_apart else ", broker too"
        )
        return f"redis-server {self.version()} ({self.store.binary}), appendfsync {self.store.fsync}: {where}"


class Sentinels(Topology):
    """A master and its replica under three Sentinels (quorum 2); broker and store on the master."""

    name = "sentinel"

    def __init__(self, run_dir: Path, fsync: str = "everysec") -> None:
        self.run_dir = run_dir
        self.fsync = fsync
        self.group = LocalSentinel(MASTER_NAME, sentinels=SENTINELS, data_args=durable_args(fsync))
        self._watcher: Sentinel | None = None
        #: Every change of master the first sentinel reported, planned (after a kill) or not: wall, from, to.
        self.switches: list[dict[str, Any]] = []
        self._stopping = threading.Event()
        self._switch_watch: threading.Thread | None = None

    def start(self) -> None:
        self.group.start()
        self._watcher = Sentinel([(HOST, port) for port in self.group.sentinel_ports], socket_timeout=5)  # type: ignore[no-untyped-call]
        self._switch_watch = threading.Thread(target=self._watch_switches, name="chaos-switches", daemon=True)
        self._switch_watch.start()

    def _watch_switches(self) -> None:
        last = self._master()
        while not self._stopping.wait(SWITCH_POLL_SECONDS):
            master = self._master()
            if master is not None and last is not None and master != last:
                self.switches.append({"wall": round(time.time(), 3), "from": last, "to": master})
            last = master or last

    def stop(self) -> None:
        self._stopping.set()
        if self._switch_watch is not None:
            self._switch_watch.join(10)
        logs = self.run_dir / "redis-logs"
        logs.mkdir(parents=True, exist_ok=True)
        for index, server in enumerate(self.group.servers):
            if server.log_path.exists():
                shutil.copyfile(server.log_path, logs / f"{index}-{server.port}.log")
        self.group.stop()

    @property
    def store_url(self) -> str:
        return ""

    @property
    def broker_url(self) -> str:
        return self.group.kombu_broker_url

    @property
    def master_name(self) -> str:
        return MASTER_NAME

    def store_client(self) -> redis.Redis:
        assert self._watcher is not None
        client: redis.Redis = self._watcher.master_for(MASTER_NAME, socket_timeout=10)  # type: ignore[no-untyped-call]
        return client

    def servers(self) -> list[tuple[str, RedisServer]]:
        data = set(self.group.data_ports)
        return [
            (("master" if server.port == self._master() else "replica") if server.port in data else "sentinel", server)
            for server in self.group.servers
        ]

    def _master(self) -> int | None:
        try:
            return self.group.master_port()
        except (redis.RedisError, LookupError):
            return None

    def pid(self, role: str) -> int | None:
        master = self._master()
        return self.group.node(master).pid if master is not None else None

    def fail(self, role: str, *, kill: bool) -> tuple[str, float]:
        """SIGKILL the master; wait until the Sentinels promote the replica; start the old master again as
        its replica (from its append-only file). Broker and store are the same master here."""
        if not kill:
            raise ValueError("with Sentinel, a fault of the master is a SIGKILL and a failover")
        old = self.group.master_port()
        node = self.group.node(old)
        assert node.process is not None
        began, signalled = time.monotonic(), time.time()
        kill_group(node.process)
        node.process.wait(10)
        new = wait_for(lambda: self._promoted_away_from(old), PROMOTION_TIMEOUT, "the sentinels to fail over")
        promoted = time.monotonic() - began
        self.group.rejoin(old)
        return (
            f"SIGKILL of the master (port {old}); the Sentinels promoted port {new} after {promoted:.2f}s; the old "
            f"master rejoined as its replica after {time.monotonic() - began:.2f}s",
            signalled,
        )

    def _promoted_away_from(self, old: int) -> int | None:
        master = self._master()
        if master is None or master == old:
            return None
        try:
            with client_for(master) as client:
                return master if client.role()[0] in (b"master", "master") else None
        except redis.RedisError:
            return None

    def describe(self) -> str:
        ports = ", ".join(str(port) for port in self.group.sentinel_ports)
        return (
            f"redis-server {self.version()} ({self.group.binary}), appendfsync {self.fsync}: master port "
            f"{self.group.master_port()}, replica port {self.group.replica_port()}, {SENTINELS} sentinels "
            f"(ports {ports}, quorum {self.group.quorum}); broker {self.broker_url} and the store behind them"
        )


class StoreAndRabbit(Standalone):
    """The store on a durable redis-server, the broker a RabbitMQ node of its own (Debian's ``rabbitmq-server``,
    :class:`celery_redisdelay.testing.rabbitmq.RabbitMQServer`). A fault of the broker is a restart of the node
    (SIGTERM, then a start on the same ports and data): its durable queues and their persistent messages survive it,
    every client's connection breaks. A SIGKILL of the node is not a fault of this layout."""

    def __init__(self, run_dir: Path, fsync: str = "everysec") -> None:
        from celery_redisdelay.testing.rabbitmq import RabbitMQServer

        super().__init__(run_dir, fsync)
        self.name = "RabbitMQ broker"
        self.rabbit = RabbitMQServer(directory=run_dir / "rabbitmq")

    def start(self) -> None:
        super().start()
        self.rabbit.start()

    def stop(self) -> None:
        self.rabbit.stop()
        super().stop()

    @property
    def broker_url(self) -> str:
        return self.rabbit.url

    def broker_client(self) -> redis.Redis:
        raise TypeError("the broker is RabbitMQ: no Redis client")

    def pid(self, role: str) -> int | None:
        return self.rabbit.pid if role == "broker" else self.store.pid

    def server_name(self, role: str) -> str:
        return "RabbitMQ node" if role == "broker" else "redis-server"

    def fail(self, role: str, *, kill: bool) -> tuple[str, float]:
        if role != "broker":
            return super().fail(role, kill=kill)
        if kill:
            raise ValueError("a RabbitMQ node is restarted, not SIGKILLed, in this layout")
        signalled = time.time()
        down = self.rabbit.restart()
        return f"RabbitMQ node restarted (SIGTERM, then started on its data), down {down:.2f}s", signalled

    def describe(self) -> str:
        return (
            f"redis-server {self.version()} ({self.store.binary}), appendfsync {self.store.fsync}: store on "
            f"{self.store.url}; broker: RabbitMQ on {self.rabbit.url}"
        )
