"""One chaos run: the Redis side, the worker, beat and releaser processes, the runner's parks, the faults.

The validation (``chaos/validate.py``) and the soak (``chaos/soak.py``) both drive a :class:`Run`.

The runner's own extension gets a client that retries connection errors with backoff (the workers,
beat and releaser run the package as it is), and its parks go through :meth:`Run.park`, which retries
a park Redis did not take (unreachable, or with ``redisdelay_wait_replicas`` not confirmed by a
replica: parking again under the same task id replaces it; ``chaos/harness/sending.py``) and writes every
acknowledged park to the ledger (``chaos/ledger.py``) the moment it returned.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import SentinelManagedConnection

from celery_redisdelay import NotReplicatedError, RedisDelay, StoreUnavailableError
from celery_redisdelay.settings import SENTINEL_SCHEMES, Settings
from celery_redisdelay.store.connection import connect

from .cluster import Cluster
from .config import (
    ENV_MAX_TASKS_PER_CHILD,
    ENV_PRECISE_IN_WORKER,
    ENV_QUEUE_TIMEOUT,
    ENV_SHARDS,
    ENV_WAIT_REPLICAS,
    QUEUE,
)
from .faults import (
    BEAT_KILL,
    BROKER_KILL,
    BROKER_RESTART,
    CLIENT_KILL,
    REDIS_KILL,
    REDIS_RESTART,
    RELEASER_KILL,
    WORKER_KILL,
    Fault,
    Injector,
    Progress,
)
from .harness.attribution import FSYNC_BOUND_SECONDS
from .harness.console import say
from .harness.sending import Resender
from .harness.settle import redis_broker_idle, store_idle
from .hung import HungWatch
from .ledger import CALL, ITEM, LOCKED, Entry, Ledger, exposure
from .topology import Sentinels, Standalone, Topology

WORKERS = 2
#: How long the runner keeps trying to park one call (Redis restarting, a failover, no replica yet).
PARK_PATIENCE = 180.0
PARK_RETRY_SECONDS = 0.2

T = TypeVar("T")


class LoggedRetry(Retry):
    """Retries connection errors (with backoff) and notes each one, with its thread, for the report."""

    log: ClassVar[list[dict[str, Any]]] = []

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        def noted(error: Exception, *count: int) -> Any:
            thread = threading.current_thread().name
            LoggedRetry.log.append({"t": round(time.time(), 4), "thread": thread, "error": repr(error)[:200]})
            return fail(error, *count)

        return super().call_with_retry(do, noted, is_retryable, with_failure_count)

    @classmethod
    def retried_since(cls, mark: int) -> bool:
        """Whether this thread's commands were retried since ``len(log)`` was ``mark``."""
        me = threading.current_thread().name
        return any(record["thread"] == me for record in cls.log[mark:])


class NotedFailures:
    """A connection that notes each failed command in :attr:`LoggedRetry.log`, with its thread, before it
    raises: the store's direct script path (``store/evalsha.py``) sends a call again through redis-py after a
    failure of its own, which redis-py's retry policy never sees, and a park sent twice may be stored twice."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            thread = threading.current_thread().name
            LoggedRetry.log.append({"t": round(time.time(), 4), "thread": thread, "error": repr(exc)[:200]})
            raise


class NotingConnection(NotedFailures, redis.Connection):
    pass


class MasterSeekingConnection(NotedFailures, SentinelManagedConnection):
    """A Sentinel-managed connection that asks the Sentinels for the master whenever it connects again.

    redis-py's own reconnects inside a command's retries to the address it had (redis-py#3874): after a
    failover, once the old master is back as a replica, every retry gets READONLY ("The previous master
    is now a slave") until the retries run out, a minute with this client's retries.
    """

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if self._sock is None and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health, retry_socket_connect)


def retrying_client(settings: Settings) -> Any:
    """The store's client (a single server or Sentinel's master) riding out a Redis restart or a failover:
    up to about a minute of retries with backoff."""
    options = {
        **settings.connection_options,
        "socket_connect_timeout": 2,
        "retry": LoggedRetry(ExponentialBackoff(cap=1.0, base=0.05), 70),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
    }
    if settings.url.startswith(SENTINEL_SCHEMES):
        options["connection_class"] = MasterSeekingConnection
    elif settings.url.startswith("redis://"):
        options["connection_class"] = NotingConnection
    return connect(dataclasses.replace(settings, connection_options=options))


def make_topology(args: argparse.Namespace, run_dir: Path) -> Topology:
    if args.sentinel:
        return Sentinels(run_dir, args.appendfsync)
    return Standalone(run_dir, args.appendfsync, apart=args.broker_apart)


def fault_counts(args: argparse.Namespace) -> dict[str, int]:
    return {
        WORKER_KILL: args.worker_kills,
        BEAT_KILL: args.beat_kills,
        RELEASER_KILL: args.releaser_kills,
        REDIS_RESTART: args.redis_restarts,
        REDIS_KILL: args.redis_kills,
        BROKER_RESTART: args.broker_restarts,
        BROKER_KILL: args.broker_kills,
        CLIENT_KILL: args.client_kills,
    }


class Run:
    """The processes and Redis servers of one run, and what the runner parked; stops all it started."""

    def __init__(self, args: argparse.Namespace, seed: int, run_dir: Path, faults: list[Fault]) -> None:
        self.args = args
        self.seed = seed
        self.run_dir = run_dir
        self.topology = make_topology(args, run_dir)
        self.cluster: Cluster | None = None
        self.injector: Injector | None = None
        self.faults = faults
        self.ledger = Ledger(run_dir / "ledger.jsonl")
        self.progress = Progress(1)
        self.started_wall = 0.0
        self.park_retried: set[str] = set()  # calls, and
        self.numbers_retried: set[int] = set()  # messages, whose park was retried (it may be stored twice)
        # Only the store's own refusals are retried: any other error of a park is the run's to report.
        self.resender = Resender((NotReplicatedError, StoreUnavailableError), PARK_PATIENCE, PARK_RETRY_SECONDS, str)
        self.parks_refused = self.resender.refused  # errors of parks the runner then retried
        self.lost_ids: set[str] = set()
        self.run_id: str | None = None
        self.rd: RedisDelay | None = None
        self._broker: redis.Redis | None = None
        self.hung_watch: HungWatch | None = None
        self.hung: list[dict[str, Any]] = []  # pool processes blocked on a lock for good

    @property
    def wait_replicas(self) -> int:
        return int(self.args.wait_replicas)

    # -- starting and stopping --------------------------------------------------------------------

    def start(self) -> RedisDelay:
        self.topology.start()
        say(self.topology.describe())
        env = {
            **self.topology.env(),
            ENV_SHARDS: str(self.args.shards),
            ENV_WAIT_REPLICAS: str(self.wait_replicas),
            ENV_PRECISE_IN_WORKER: "1" if self.args.precise_in_worker else "0",
            ENV_MAX_TASKS_PER_CHILD: str(self.args.max_tasks_per_child),
            # Calls without a queue timeout of their own (a batch's flush, a retry) are swept by the one the
            # runner judges by, not the app default of two hours.
            ENV_QUEUE_TIMEOUT: str(self.args.queue_timeout),
        }
        os.environ.update(env)
        from . import app as chaos_app  # builds the app from the environment

        if self.topology.broker_url != chaos_app.BROKER_URL:
            raise RuntimeError("chaos.app was imported before the runner set its environment")
        rd = chaos_app.rd
        if {"client", "shards"} & set(vars(rd.depot)):
            raise RuntimeError("the extension's client was made before the runner could replace it")
        retrying = vars(rd.depot)["client"] = retrying_client(rd.settings)
        if rd.client is not retrying or rd.store.client is not retrying:
            raise RuntimeError("the runner's retrying client is not the one the extension uses")
        self.rd = rd
        self._broker = self.topology.broker_client()
        self.cluster = Cluster(env, self.run_dir, say)
        for role, slot in [*(("worker", slot) for slot in range(WORKERS)), ("beat", 0), ("releaser", 0)]:
            member = self.cluster.start(role, slot)
            say(f"{member.name} ready (pid {member.pid}) in {member.ready_seconds:.1f}s")
        self.cluster.supervise()
        self.hung_watch = HungWatch(self.cluster.workers)
        self.hung_watch.start()
        return rd

    def start_faults(self, progress: Progress) -> None:
        assert self.cluster is not None
        self.progress = progress
        self.started_wall = time.time()
        self.injector = Injector(self.faults, progress, self.cluster, self.topology, say, self.check_losses)
        self.injector.start()

    def stop_faults(self) -> None:
        if self.injector is not None:
            self.injector.finish()
        left = sum(not fault.injected for fault in self.faults)
        if left:
            say(f"{left} planned faults were not injected: the run finished first")

    def check_hung(self) -> list[dict[str, Any]]:
        """Stop watching the pool processes, after a last look: the hung ones seen during the run."""
        if self.hung_watch is not None:
            self.hung = self.hung_watch.finish()
            self.hung_watch = None
        return self.hung

    def stop(self) -> None:
        self.stop_faults()
        self.check_hung()
        if self.cluster is not None:
            self.cluster.close()
        if self._broker is not None:
            self._broker.close()
        self.ledger.close()
        self.topology.stop()

    # -- parking ----------------------------------------------------------------------------------

    def park(self, task: Any, args: tuple[Any, ...], options: dict[str, Any], *, kind: str = CALL) -> str:
        """Park one call until Redis takes it, record it in the ledger, return its id.

        Plain and locked calls get their task id here, so a park retried after an error replaces the
        first if that one was stored after all; keyed calls keep theirs by their key.
        """
        assert self.rd is not None
        run_id, number = str(args[0]), int(args[1])
        self.run_id = self.run_id or run_id
        if kind in (CALL, LOCKED) and "task_id" not in options:
            home = self.rd.shards.for_name(task.lock_name(args, {})) if kind == LOCKED else None
            options = {**options, "task_id": self.rd.shards.new_id(home)}
        due = options.get("eta")
        return self._until_stored(
            lambda: str(task.apply_async(args, **options).id), number, kind, due.timestamp() if due else None
        )

    def add_item(self, task: Any, key: str, run_id: str, number: int) -> str:
        """Add a batch item (message ``number``) until Redis takes it; the id of the batch call it filled, or ""."""
        self.run_id = self.run_id or run_id

        def add() -> str:
            result = task.add(key, {"run": run_id, "n": number})
            return str(result.id) if result is not None else ""

        return self._until_stored(add, number, ITEM)

    def _until_stored(self, attempt: Callable[[], str], number: int, kind: str, due: float | None = None) -> str:
        marks: list[int] = []  # the client's retries before each attempt: the last one's count

        def marked() -> str:
            marks.append(len(LoggedRetry.log))
            return attempt()

        call_id, retried = self.resender.until_taken(marked, number)
        if retried or LoggedRetry.retried_since(marks[-1]):
            self.numbers_retried.add(number)
            if call_id:
                self.park_retried.add(call_id)
        self.ledger.record(call_id, number, kind, due)
        self.progress.on_parked()
        return call_id

    def park_validation(self, task: Any, args: tuple[Any, ...], options: dict[str, Any]) -> str:
        """``run_validation``'s way of parking a message."""
        return self.park(task, args, options)

    # -- what a SIGKILL of the store cost ---------------------------------------------------------

    def check_losses(self, fault: Fault) -> None:
        """After a SIGKILL of the store (Redis answering again, or a new master): the calls acknowledged to
        the producer before it that are now neither stored nor processed."""
        assert self.rd is not None and fault.wall is not None
        before = fault.wall
        fault.exposed = exposure(list(self.ledger.entries), before)
        if self.run_id is None:
            fault.lost = []
            return
        processed_key = self.rd.keys.validation_keys(self.run_id)[0]
        client = self.topology.store_client()
        try:
            # Parks acknowledged up to now were acknowledged before the kill or by the restarted server.
            lost = self.ledger.lost(client, self.rd.shards.stores, processed_key, time.time())
        finally:
            client.close()
        fresh = [entry for entry in lost if entry.id not in self.lost_ids]
        self.lost_ids.update(entry.id for entry in fresh)
        fault.lost = [lost_row(entry, before) for entry in fresh]
        say(
            f"  {len(fault.lost)} acknowledged parks gone after the kill ({fault.exposed} were acknowledged in the "
            f"{FSYNC_BOUND_SECONDS:g} s before it)"
        )

    def loss_bound(self) -> float:
        """Seconds before a SIGKILL within which a lost acknowledged park is Redis's documented loss: the fsync
        bound of a standalone server; none for a failover, which loses nothing confirmed by a replica
        (``redisdelay_wait_replicas``) and, without it, whatever the old master had not passed on, unbounded."""
        return 0.0 if isinstance(self.topology, Sentinels) else FSYNC_BOUND_SECONDS

    # -- is anything left that could deliver a message? -------------------------------------------

    def settled(self) -> bool:
        """Whether nothing can deliver a message any more (``chaos/harness/settle.py``): no call parked or in
        flight in the store and no batch group open, no message in the broker queue, none prefetched (kombu's
        unacked hash)."""
        assert self.rd is not None and self._broker is not None
        try:
            return store_idle(self.rd) and redis_broker_idle(self._broker, QUEUE)
        except redis.RedisError:
            return False

    def broker_backlog(self) -> str:
        assert self._broker is not None
        try:
            return f", {self._broker.llen(QUEUE)} messages waiting in the broker queue"
        except redis.RedisError:
            return ""


def lost_row(entry: Entry, kill_wall: float) -> dict[str, Any]:
    return {"n": entry.n, "id": entry.id, "kind": entry.kind, "before_kill": round(kill_wall - entry.t, 3)}
