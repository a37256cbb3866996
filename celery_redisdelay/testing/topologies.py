"""Real local Redis topologies for tests and benchmarks: a Redis Cluster, a master with a replica watched by a
Sentinel, and a TLS-only server with an ACL user.

They build on :mod:`celery_redisdelay.testing`: every process listens on 127.0.0.1 only, runs in its own session
and is stopped by its PID. Each topology is a context manager; ``stop()`` stops whatever ``start()`` got to start,
also after a failed start. A topology the redis-server binary cannot run raises :class:`TopologyUnavailable`.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redisdelay.testing import RedisServer, free_port, redis_server_binary, wait_for
from celery_redisdelay.testing.processes import PORT_ATTEMPTS, PortTaken

HOST = "127.0.0.1"
CLUSTER_SLOTS = 16384
ADDSLOTS_CHUNK = 1024
# A first sync would wait 5 s for more replicas to join; a replica's offset, and so its place in CLUSTER SLOTS
# (Redis 7 leaves out replicas at offset 0), would only move with the master's ping every 10 s.
FAST_REPLICATION = ("--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1")


class TopologyUnavailable(RuntimeError):
    """The redis-server binary cannot run this topology (too old, or built without TLS)."""


def binary_version(binary: str) -> str:
    output = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout
    for word in output.split():
        if word.startswith("v="):
            return word[2:]
    return output.strip() or "unknown version"


def _quick_client(port: int, **options: Any) -> redis.Redis:
    return redis.Redis(
        host=HOST, port=port, socket_connect_timeout=0.5, socket_timeout=5, retry=Retry(NoBackoff(), 0), **options
    )


def _launch(server: RedisServer, needs: str, timeout: float) -> None:
    """``server.start()``, turning a configuration the binary rejects into :class:`TopologyUnavailable`."""
    try:
        server.start(timeout)
    except RuntimeError:
        log = server.log_path.read_text(errors="replace") if server.log_path.exists() else ""
        if "Failed finding TLS support" in log:  # Valkey (and Redis 7) built without TLS say so at start
            raise TopologyUnavailable(
                f"{server.binary} (version {binary_version(server.binary)}) cannot {needs}: it has no TLS support"
            ) from None
        if "Bad directive" not in log:
            raise
        rejected = next((line[4:] for line in log.splitlines() if line.startswith(">>> ")), "an option")
        raise TopologyUnavailable(
            f"{server.binary} (Redis {binary_version(server.binary)}) cannot {needs}: it rejects {rejected}"
        ) from None


class _Topology:
    """The processes of one topology, under one temporary directory."""

    def __init__(self, binary: str | None, prefix: str) -> None:
        self.binary = binary or redis_server_binary()
        self.dir = Path(tempfile.mkdtemp(prefix=f"redisdelay-{prefix}-"))
        self.servers: list[RedisServer] = []

    def _add(self, server: RedisServer) -> RedisServer:
        self.servers.append(server)
        return server

    def _node_dir(self, name: str) -> Path:
        path = self.dir / name
        path.mkdir()
        return path

    @property
    def pids(self) -> list[int]:
        return [server.pid for server in self.servers if server.pid is not None]

    def start(self, timeout: float = 30.0) -> Self:
        """Start every process and wait until the topology is ready; on failure stop what was started."""
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cluster_slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The slots of each master, first to last, as ``redis-cli --cluster create`` assigns them."""
    per_node = CLUSTER_SLOTS / masters
    ranges = []
    first = 0
    for index in range(masters):
        last = CLUSTER_SLOTS - 1 if index == masters - 1 else round(per_node * (index + 1) - 1)
        ranges.append((first, last))
        first = last + 1
    return ranges


class LocalCluster(_Topology):
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each; needs Redis 7 (``--cluster-port``).

    Masters come first in ``ports``; master ``i`` owns the ``i``-th of ``cluster_slot_ranges(masters)``.
    """

    def __init__(self, masters: int = 3, replicas: int = 0, binary: str | None = None) -> None:
        super().__init__(binary, "cluster")
        if masters < 1 or replicas < 0:
            raise ValueError("a cluster needs at least one master and no negative number of replicas")
        self.masters = masters
        self.replicas = replicas
        self.bus_ports: list[int] = []

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(HOST, port) for port in self.ports]

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.ports[0]}"

    def client(self, **options: Any) -> redis.cluster.RedisCluster:
        return redis.cluster.RedisCluster(host=HOST, port=self.ports[0], **options)

    def node_for_slot(self, slot: int) -> tuple[str, int]:
        """(host, port) of the master serving ``slot``, as the first node sees it."""
        with _quick_client(self.ports[0], decode_responses=True) as client:
            for first, last, master, *_ in client.cluster("SLOTS"):
                if first <= slot <= last:
                    return HOST, int(master[1])
        raise LookupError(f"no node serves slot {slot}")

    def _start(self, timeout: float) -> None:
        for index in range(self.masters * (1 + self.replicas)):
            directory = self._node_dir(f"node{index}")
            bus_port = free_port()
            self.bus_ports.append(bus_port)
            options = ["--cluster-enabled", "yes", "--cluster-config-file", str(directory / "nodes.conf")]
            options += ["--cluster-port", str(bus_port), "--cluster-node-timeout", "5000", *FAST_REPLICATION]
            server = self._add(RedisServer(self.binary, options, directory=directory))
            _launch(server, "run a cluster node on an explicit bus port (--cluster-port, Redis 7.0)", timeout)
        clients = [_quick_client(port, decode_responses=True) for port in self.ports]
        try:
            self._create(clients, timeout)
        finally:
            for client in clients:
                client.close()

    def _create(self, clients: list[redis.Redis], timeout: float) -> None:
        ranges = cluster_slot_ranges(self.masters)
        for epoch, (client, (first, last)) in enumerate(zip(clients[: self.masters], ranges, strict=True), 1):
            for chunk in range(first, last + 1, ADDSLOTS_CHUNK):
                client.cluster("ADDSLOTS", *range(chunk, min(chunk + ADDSLOTS_CHUNK, last + 1)))
            client.cluster("SET-CONFIG-EPOCH", epoch)
        for port, bus_port in zip(self.ports[1:], self.bus_ports[1:], strict=True):
            clients[0].cluster("MEET", HOST, port, bus_port)
        count = len(clients)
        wait_for(lambda: all(int(_info(c)["cluster_known_nodes"]) == count for c in clients), timeout, "nodes to meet")
        ids = [str(client.cluster("MYID")) for client in clients]
        for index, client in enumerate(clients[self.masters :]):
            master_id = ids[index % self.masters]
            wait_for(lambda: master_id in _node_ids(client), timeout, "the replica to know its master")  # noqa: B023
            client.cluster("REPLICATE", master_id)
        wait_for(lambda: all(self._healthy(c) for c in clients), timeout, "cluster_state:ok on every node")

    def _healthy(self, client: redis.Redis) -> bool:
        info = _info(client)
        if info["cluster_state"] != "ok" or int(info["cluster_slots_ok"]) != CLUSTER_SLOTS:
            return False
        served = client.cluster("SLOTS")
        expected = {(first, last) for first, last in cluster_slot_ranges(self.masters)}
        if {(first, last) for first, last, *_ in served} != expected:
            return False
        if any(len(nodes) != self.replicas for _, _, _, *nodes in served):
            return False
        replication = client.info("replication")
        return replication["role"] == "master" or replication.get("master_link_status") == "up"


def _info(client: redis.Redis) -> dict[str, str]:
    info: dict[str, str] = client.cluster("INFO")
    return info


def _node_ids(client: redis.Redis) -> set[str]:
    return {node["node_id"] for node in client.cluster("NODES").values()}


def _replication(port: int) -> dict[str, Any]:
    with _quick_client(port) as client:
        info: dict[str, Any] = client.info("replication")
        return info


class LocalSentinel(_Topology):
    """A master and its replica, watched under ``master_name`` by ``sentinels`` Sentinels, a majority of which
    (the quorum) must agree that the master is down before one of them fails over.

    ``data_args`` go to the master and the replica (``--appendonly yes ...`` makes them durable).
    """

    def __init__(
        self,
        master_name: str = "redisdelay",
        binary: str | None = None,
        *,
        sentinels: int = 1,
        data_args: Sequence[str] = (),
    ) -> None:
        super().__init__(binary, "sentinel")
        if sentinels < 1:
            raise ValueError("a Sentinel topology needs at least one sentinel")
        self.master_name = master_name
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.quorum = sentinels // 2 + 1
        self.data_args = list(data_args)
        self.data_ports: list[int] = []

    @property
    def sentinel_port(self) -> int:
        """The first sentinel's port."""
        return self.sentinel_ports[0]

    @property
    def sentinel_url(self) -> str:
        hosts = ",".join(f"{HOST}:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.master_name}/0"

    @property
    def kombu_broker_url(self) -> str:
        return ";".join(f"sentinel://{HOST}:{port}/0" for port in self.sentinel_ports)

    @property
    def kombu_transport_options(self) -> dict[str, Any]:
        return {"master_name": self.master_name}

    def sentinel_client(self, index: int = 0) -> redis.Redis:
        return _quick_client(self.sentinel_ports[index], decode_responses=True)

    def master_port(self) -> int:
        """The master's port, as the first Sentinel reports it."""
        with self.sentinel_client() as sentinel:
            address = sentinel.sentinel_get_master_addr_by_name(self.master_name)
        if not address:
            raise LookupError(f"the sentinel does not know {self.master_name!r}")
        return int(address[1])

    def replica_port(self) -> int:
        master = self.master_port()
        return next(port for port in self.data_ports if port != master)

    def node(self, port: int) -> RedisServer:
        """The master or replica process listening on ``port``."""
        return next(server for server in self.servers if server.port == port)

    def _start(self, timeout: float) -> None:
        data = [*self.data_args, *FAST_REPLICATION]
        master = self._add(RedisServer(self.binary, data, directory=self._node_dir("master")))
        _launch(master, "run a master", timeout)
        replica_args = [*data, "--replicaof", HOST, str(master.port)]
        replica = self._add(RedisServer(self.binary, replica_args, directory=self._node_dir("replica")))
        _launch(replica, "run a replica", timeout)
        self.data_ports = [master.port, replica.port]
        for index in range(len(self.sentinel_ports)):
            self._start_sentinel(index, master.port, timeout)
        self._wait_settled(master.port, replica.port, timeout, "the sentinels to see master and replica")

    def _start_sentinel(self, index: int, master_port: int, timeout: float) -> None:
        """Sentinel ``index``, on its port, or on another should a process take that one first."""
        name = self.master_name
        for attempt in range(PORT_ATTEMPTS):
            port = self.sentinel_ports[index]
            directory = self._node_dir(f"sentinel{index}")
            config = directory / "sentinel.conf"
            lines = [f"port {port}", f"bind {HOST}", f"dir {directory}", "daemonize no"]
            lines += [f"sentinel monitor {name} {HOST} {master_port} {self.quorum}"]
            lines += [f"sentinel down-after-milliseconds {name} 1000", f"sentinel failover-timeout {name} 5000"]
            config.write_text("\n".join(lines) + "\n")
            sentinel = RedisServer(self.binary, port=port, directory=directory, arguments=[str(config), "--sentinel"])
            try:
                _launch(self._add(sentinel), "run a sentinel", timeout)
                return
            except PortTaken:
                self.servers.remove(sentinel)
                if attempt == PORT_ATTEMPTS - 1:
                    raise
                self.sentinel_ports[index] = free_port()

    def _unsettled(self, master_port: int, replica_port: int) -> str | None:
        """What is not yet so of: every Sentinel names ``master_port`` as master, lists the replica (whose link
        to it is up) and knows the other Sentinels. None once all of it is."""
        replication = _replication(replica_port)
        if replication.get("master_port") != master_port or replication.get("master_link_status") != "up":
            return f"port {replica_port}'s replication: {replication}"
        for index in range(len(self.sentinel_ports)):
            with self.sentinel_client(index) as sentinel:
                address = sentinel.sentinel_get_master_addr_by_name(self.master_name)
                if not address or int(address[1]) != master_port:
                    return f"sentinel {index} names {address} as master"
                others = int(sentinel.sentinel_master(self.master_name)["num-other-sentinels"])
                replicas = sentinel.sentinel_slaves(self.master_name)
            if others != len(self.sentinel_ports) - 1:
                return f"sentinel {index} knows {others} other sentinels"
            if not any(
                known["port"] == replica_port and not (known["is_sdown"] or known["is_disconnected"])
                for known in replicas
            ):
                seen = [(known["port"], known.get("flags")) for known in replicas]
                return f"sentinel {index} lists no working replica on port {replica_port}: {seen}"
        return None

    def _unsettled_either_way(self) -> str | None:
        """:meth:`_unsettled` for the master the first Sentinel names now and the other data node."""
        with self.sentinel_client(0) as sentinel:
            address = sentinel.sentinel_get_master_addr_by_name(self.master_name)
        master = int(address[1]) if address else None
        others = [port for port in self.data_ports if port != master]
        if master is None or len(others) != 1:
            return f"sentinel 0 names {address} as master, not one of ports {self.data_ports}"
        return self._unsettled(master, others[0])

    def _wait_settled(self, master_port: int | None, replica_port: int, timeout: float, what: str) -> None:
        """Wait until :meth:`_unsettled` finds nothing (with ``master_port`` None, for whichever data node the
        Sentinels name master). A Sentinel that still lists the replica as down halfway through (seen once in CI: a
        restarted old master, listed by some Sentinel as down for over a minute) is told ``SENTINEL RESET``: it
        forgets its replicas and finds them again at its next INFO of the master."""
        deadline = time.monotonic() + timeout
        halfway = time.monotonic() + timeout / 2
        reset = False

        def unsettled() -> str | None:
            if master_port is None:
                return self._unsettled_either_way()
            return self._unsettled(master_port, replica_port)

        while (why := unsettled()) is not None:
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}: {why}")
            if not reset and now > halfway and "lists no working replica" in why:
                reset = True
                for index in range(len(self.sentinel_ports)):
                    with self.sentinel_client(index) as sentinel:
                        sentinel.sentinel_reset(self.master_name)
            time.sleep(0.05)

    def rejoin(self, port: int, timeout: float = 60.0) -> None:
        """Start the node on ``port`` again, from its data directory, as a replica of the current master (as
        its supervisor would after a failover); return once every Sentinel names one master and lists the other
        node as its working replica. That is usually the rejoined node as replica; on a loaded machine the
        Sentinels (down after 1 s) may fail over once more, back to it (seen in CI): ask :meth:`master_port`."""
        master = self.master_port()
        node = self.node(port)
        node.terminate()  # a process that was killed: only reaped here
        node.extra_args = [*self.data_args, *FAST_REPLICATION, "--replicaof", HOST, str(master)]
        node.start(timeout)
        self._wait_settled(None, port, timeout, f"port {port} to rejoin, as a replica of port {master} or its master")

    def _promoted(self, port: int) -> bool:
        with self.sentinel_client() as sentinel, _quick_client(port) as node:
            address = sentinel.sentinel_get_master_addr_by_name(self.master_name)
            return bool(address) and int(address[1]) == port and node.role()[0] in (b"master", "master")

    def failover(self, timeout: float = 30.0, *, wait_for_sentinel: bool = False) -> int:
        """Promote the replica with ``SENTINEL FAILOVER``; return its port once the old master replicates from it.

        The Sentinel turns the old master into a replica only some 10 s after the switch (at its next INFO of
        it); meanwhile the old master still takes writes. Unless ``wait_for_sentinel``, ``REPLICAOF`` is sent
        to the old master at once, as the Sentinel will, which brings a failover down to about a second.
        """
        old, new = self.master_port(), self.replica_port()
        deadline = time.monotonic() + timeout
        with self.sentinel_client() as sentinel:
            while True:
                try:
                    sentinel.sentinel_failover(self.master_name)
                    break
                except redis.ResponseError as exc:
                    if "NOGOODSLAVE" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        wait_for(lambda: self._promoted(new), deadline - time.monotonic(), f"the sentinel to promote port {new}")
        if not wait_for_sentinel:
            with _quick_client(old) as client:
                client.replicaof(HOST, new)
        what = f"port {old} to replicate from port {new}"
        self._wait_settled(new, old, deadline - time.monotonic(), what)
        return new


class LocalTLS(_Topology):
    """A TLS-only redis-server (certificate for 127.0.0.1 from a throwaway CA) where only the ACL user
    ``username`` may log in; the ``default`` user is off."""

    def __init__(self, username: str = "delay", password: str | None = None, binary: str | None = None) -> None:
        super().__init__(binary, "tls")
        self.username = username
        self.password = password or secrets.token_hex(16)
        self.port = free_port()
        self.ca_path = self.dir / "ca.pem"

    @property
    def url(self) -> str:
        return f"rediss://{self.username}:{self.password}@{HOST}:{self.port}/0"

    @property
    def ssl_options(self) -> dict[str, str]:
        return {"ssl_cert_reqs": "required", "ssl_ca_certs": str(self.ca_path)}

    def client(self, **options: Any) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, **{**self._client_options(), **options})

    def _client_options(self) -> dict[str, Any]:
        return {"ssl": True, "username": self.username, "password": self.password, **self.ssl_options}

    def _start(self, timeout: float) -> None:
        try:
            import trustme
        except ImportError as exc:
            raise TopologyUnavailable("LocalTLS makes its certificates with the trustme package") from exc

        authority = trustme.CA()
        certificate = authority.issue_cert(HOST)
        authority.cert_pem.write_to_path(str(self.ca_path))
        directory = self._node_dir("server")
        cert_path, key_path = directory / "cert.pem", directory / "key.pem"
        cert_path.write_bytes(b"".join(pem.bytes() for pem in certificate.cert_chain_pems))
        certificate.private_key_pem.write_to_path(str(key_path))
        arguments = ["--bind", HOST, "--port", "0", "--tls-port", str(self.port), "--dir", str(directory)]
        arguments += ["--tls-cert-file", str(cert_path), "--tls-key-file", str(key_path)]
        arguments += ["--tls-ca-cert-file", str(self.ca_path), "--tls-auth-clients", "no"]
        arguments += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        arguments += ["--user", "default", "off", "--user", self.username, "on", f">{self.password}"]
        arguments += ["~*", "&*", "+@all"]
        server = RedisServer(
            self.binary, port=self.port, directory=directory, arguments=arguments, client_options=self._client_options()
        )
        _launch(self._add(server), "serve TLS (it was built without TLS, or predates Redis 6)", timeout)
