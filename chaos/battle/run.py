"""One battle: the servers, the processes, the producers, the faults, the samples, the drain, the ledger read.

The store and the broker share one durable redis-server (``chaos/topology.py``, ``appendonly yes``,
``appendfsync everysec``), or with ``--broker rabbitmq`` the broker is a RabbitMQ node of its own (classic durable
queues, Celery's default); the ledger is a redis-server of its own that no fault touches. The producers are
threads of the runner, sending at ``--rate`` calls a second in all, as an application does: ``apply_async``,
``add`` for a batch item, ``rd.cancel`` (``revoke`` with plain Celery) for a cancel. A send that raises (Redis
down) is made again with the same task id, as a careful application would, and noted: a call due now sent
twice after an error whose first send went through runs twice, and the report says so. The pace, the sends
made again, the drain and the ledger's records are the harness's (``chaos/harness/``), as the validation's
runner's are.
"""

from __future__ import annotations

import argparse
import heapq
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any
from uuid import uuid4

import redis

from celery_redisdelay.testing import RedisServer

from ..faults import Clock, Fault
from ..harness.console import say
from ..harness.ledger import RedisLedger, send_record
from ..harness.sending import Resender, paced, run_producers
from ..harness.settle import SETTLED, Level, drain, redis_broker_idle, store_idle
from ..measure import children_of, inventory, rss_kib
from ..topology import Standalone, StoreAndRabbit
from .analysis import CELERY_ETA, CELERY_NOW, PARKED, TRACKED, WORKER_LOST
from .config import (
    ENV_ACKS_LATE,
    ENV_BATCH,
    ENV_BROKER_URL,
    ENV_KOMBU_UNACKED,
    ENV_LEASE,
    ENV_LEDGER_URL,
    ENV_PLAIN,
    ENV_TRACK,
    ENV_URL,
    ENV_VISIBILITY,
    QUEUE,
)
from .plan import BATCH, CANCEL, LOCK, RETRY, SLEEP, Call, Mix
from .processes import BattleCluster, BattleInjector

#: How long a producer keeps trying one send (Redis restarting).
SEND_PATIENCE = 120.0
SEND_RETRY_SECONDS = 0.2
PRODUCERS = 2
FLUSH_SECONDS = 0.25
SAMPLE_SECONDS = 5.0
PROGRESS_SECONDS = 15.0
TICK = b'"redisdelay.tick"'
#: Dead letters read a page at a time, and purged this many per script call (the store's largest step).
DEAD_PAGE = 1000


class Battle:
    """The servers and processes of one battle; :meth:`stop` stops everything it started, by PID."""

    def __init__(
        self,
        args: argparse.Namespace,
        seed: int,
        run_dir: Path,
        faults: list[Fault],
        mix: Mix,
        pools: list[tuple[str, int]],
    ) -> None:
        self.args = args
        self.seed = seed
        self.run_dir = run_dir
        self.faults = faults
        self.mix = mix
        self.pools = pools
        self.plain = bool(args.plain)
        self.ledger_server = RedisServer(directory=run_dir / "ledger")
        self.rabbit = args.broker == "rabbitmq"
        self.topology = StoreAndRabbit(run_dir, "everysec") if self.rabbit else Standalone(run_dir, "everysec")
        self._broker: Any = None  # a kombu connection to the RabbitMQ node, for its queue's depth
        self.cluster: BattleCluster | None = None
        self.injector: BattleInjector | None = None
        self.app: ModuleType | None = None
        self.ledger: RedisLedger | None = None
        self._sent_lock = threading.Lock()
        self._cancels: list[tuple[float, int, str, str]] = []  # (when, n, unit, task id)
        self._cancels_lock = threading.Lock()
        self._numbers: dict[str, int] = {}  # task id -> its call's number (a retry keeps its call's id)
        self.producing = threading.Event()
        self.stopping = threading.Event()
        # Any error of a send is a refusal, made again, as an application would.
        self.resender = Resender((Exception,), SEND_PATIENCE, SEND_RETRY_SECONDS, repr, self.stopping)
        self.send_errors = self.resender.refused  # sends that raised and were made again
        self.producer_errors: list[str] = []
        self.sent = 0
        self.samples: list[dict[str, Any]] = []
        self.began = time.monotonic()
        self.keys_start: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []

    # -- starting and stopping --------------------------------------------------------------------

    def start(self) -> None:
        self.ledger_server.start()
        self.topology.start()
        say(f"{self.topology.describe()}; ledger on {self.ledger_server.url}")
        if isinstance(self.topology, StoreAndRabbit):
            say(f"RabbitMQ started in {self.topology.rabbit.startup_seconds:.1f}s")
        env = {
            ENV_URL: self.topology.store_url,
            ENV_BROKER_URL: self.topology.broker_url if self.rabbit else "",
            ENV_LEDGER_URL: f"{self.ledger_server.url}/0",
            ENV_PLAIN: "1" if self.plain else "0",
            ENV_VISIBILITY: str(self.args.visibility_timeout),
            ENV_LEASE: str(self.args.lease or ""),
            ENV_KOMBU_UNACKED: "1" if self.args.kombu_unacked else "0",
            ENV_TRACK: "1" if self.args.track_due_now else "0",
            ENV_ACKS_LATE: "1" if self.args.acks_late else "0",
            ENV_BATCH: f"{self.args.batch_size},{self.args.batch_wait}",
        }
        os.environ.update(env)
        from . import app as battle_app  # builds the app from the environment

        if self.topology.store_url != battle_app.URL:
            raise RuntimeError("chaos.battle.app was imported before the runner set its environment")
        self.app = battle_app
        self.ledger = RedisLedger.from_url(env[ENV_LEDGER_URL], socket_timeout=60)
        self.cluster = BattleCluster(env, self.run_dir, say, self.pools)
        roles = [("worker", slot) for slot in range(len(self.pools))]
        if not self.plain:
            roles += [("beat", 0), ("releaser", 0)]
        failures: list[str] = []

        def start_one(role: str, slot: int) -> None:
            assert self.cluster is not None
            try:
                member = self.cluster.start(role, slot)
                say(f"{member.name} ready (pid {member.pid}) in {member.ready_seconds:.1f}s")
            except Exception as exc:  # noqa: BLE001 - reported below
                failures.append(f"{role} {slot}: {exc}")

        starters = [threading.Thread(target=start_one, args=role) for role in roles]
        for thread in starters:
            thread.start()
        for thread in starters:
            thread.join()
        if failures:
            raise RuntimeError("; ".join(failures))
        self.cluster.supervise()
        with self.topology.store_client() as client:
            self.keys_start = inventory(client)

    def stop(self) -> None:
        self.stopping.set()
        if self.injector is not None:
            self.injector.finish()
        for thread in self._threads:
            thread.join(30)
        if self.cluster is not None:
            self.cluster.close()
        if self.ledger is not None:
            self.ledger.close()
        if self._broker is not None:
            self._broker.release()
        self.topology.stop()
        self.ledger_server.terminate()

    # -- sending ----------------------------------------------------------------------------------

    def path(self, call: Call) -> str:
        if self.plain:
            return CELERY_ETA if call.countdown > 0 else CELERY_NOW
        if call.countdown > 0 or call.kind in (BATCH, LOCK):
            return PARKED
        return TRACKED if self.args.track_due_now else CELERY_NOW

    def send(self, call: Call) -> None:
        app, ledger = self.app, self.ledger
        assert app is not None and ledger is not None
        began = time.time()
        task_id = str(uuid4())
        due = began + call.countdown
        options: dict[str, Any] = {"task_id": task_id}
        if call.countdown > 0:
            options["eta"] = datetime.fromtimestamp(due, tz=UTC)
        attempt: Callable[[], Any]
        if call.kind == BATCH and not self.plain:
            attempt = lambda: app.batch.add(call.key, {"n": call.n})  # noqa: E731
        elif call.kind == LOCK and not self.plain:
            attempt = lambda: app.locked.apply_async((call.n, call.slot, call.sleep), **options)  # noqa: E731
        elif call.kind == RETRY:
            attempt = lambda: app.retrying.apply_async((call.n, call.retry_countdown, 1), **options)  # noqa: E731
        elif call.kind in (SLEEP, LOCK):
            attempt = lambda: app.work.apply_async((call.n, call.sleep), **options)  # noqa: E731
        else:
            attempt = lambda: app.work.apply_async((call.n,), **options)  # noqa: E731
        _, retried = self.resender.until_taken(attempt, call.n)
        acknowledged = time.time()
        unit = f"{call.n}.0"
        record = send_record(call.kind, round(due, 4), round(acknowledged, 4), task_id, self.path(call), again=retried)
        with self._sent_lock:
            ledger.send(unit, record)
            self._numbers[task_id] = call.n
            self.sent += 1
        if call.kind == CANCEL:
            with self._cancels_lock:
                heapq.heappush(self._cancels, (acknowledged + call.cancel_after, call.n, unit, task_id))

    def produce(self, index: int, began: float, seconds: float) -> None:
        for _ in paced(index, PRODUCERS, self.args.rate, seconds, began, self.stopping):
            call = self.mix.next()
            try:
                self.send(call)
            except Exception as exc:  # noqa: BLE001 - reported; the producer goes on
                self.producer_errors.append(f"call {call.n}: {type(exc).__name__}: {exc}"[:300])

    def flush(self) -> None:
        assert self.ledger is not None
        self.ledger.flush()

    def flusher(self) -> None:
        while not self.stopping.wait(FLUSH_SECONDS):
            self.flush()

    def canceller(self) -> None:
        """Cancels each call of the cancel kind ``cancel_after`` seconds after its send."""
        app, ledger = self.app, self.ledger
        assert app is not None and ledger is not None
        while not self.stopping.is_set():
            with self._cancels_lock:
                due = self._cancels[0] if self._cancels and self._cancels[0][0] <= time.time() else None
                if due is not None:
                    heapq.heappop(self._cancels)
            if due is None:
                if not self.producing.is_set() and not self._cancels:
                    return
                time.sleep(0.02)
                continue
            _, n, unit, task_id = due
            ledger.cancelled(unit, self.cancel(app, task_id, n))

    def cancel(self, app: ModuleType, task_id: str, n: int) -> bool:
        """``rd.cancel``; with plain Celery, ``revoke`` (asked: no worker that hears it runs the call)."""
        if self.plain:
            self.resender.until_taken(lambda: app.app.control.revoke(task_id), n)
            return True
        cancelled, _ = self.resender.until_taken(lambda: app.rd.cancel(task_id), n)
        return bool(cancelled)

    # -- measuring --------------------------------------------------------------------------------

    def processes(self) -> dict[str, list[int]]:
        """Every live process of the run by name: a worker with its pool processes, beat, the releaser, the
        store's and the ledger's redis-server, the runner."""
        found: dict[str, list[int]] = {"runner": [os.getpid()]}
        if self.cluster is not None:
            for member in list(self.cluster.members):
                if member.how or member.exited():
                    continue
                pids = [member.pid]
                if member.role == "worker":
                    pids += children_of(member.pid)
                found[member.name] = pids
        for name, server in (("redis", self.topology.store), ("ledger", self.ledger_server)):
            if server.pid is not None:
                found[name] = [server.pid]
        return found

    def sample(self) -> None:
        row: dict[str, Any] = {"t": round(time.monotonic() - self.began, 1), "sent": self.sent}
        rss = {}
        for name, pids in self.processes().items():
            values = [kib for kib in (rss_kib(pid) for pid in pids) if kib is not None]
            if values:
                rss[name] = sum(values)
        row["rss_kib"] = rss
        try:
            with self.topology.store_client() as client:
                memory = client.info("memory")
                row["redis_used_memory"] = int(memory["used_memory"])
                row["redis_rss"] = int(memory["used_memory_rss"])
                row["dbsize"] = int(client.dbsize())
                if not self.rabbit:
                    row["queue"] = int(client.llen(QUEUE))
                    row["unacked"] = int(client.hlen("unacked"))
            if self.rabbit:
                row["queue"] = self.broker_depth()
            if not self.plain and self.app is not None:
                stats = self.app.rd.stats()
                row["parked"] = int(stats["delayed"])
                row["inflight"] = int(stats["inflight"])
            if self.ledger is not None:
                row["done"] = self.ledger.done()
        except redis.RedisError as exc:
            row["error"] = repr(exc)[:100]
        except Exception as exc:  # noqa: BLE001 - the extension's errors while Redis restarts
            row["error"] = repr(exc)[:100]
        self.samples.append(row)

    def sampler(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            self.stopping.wait(SAMPLE_SECONDS)

    def background(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- the battle -------------------------------------------------------------------------------

    def fight(self) -> dict[str, Any]:
        """Send for ``--minutes`` under the faults, drain, list the keys left: the run's part of the report."""
        assert self.cluster is not None
        seconds = self.args.minutes * 60.0
        self.began = time.monotonic()
        clock = Clock(seconds)
        self.injector = BattleInjector(self.faults, clock, self.cluster, self.topology, say, lambda fault: None)
        self.injector.plain = self.plain
        self.producing.set()
        self.background(self.sampler, "battle-sampler")
        self.background(self.flusher, "battle-flusher")
        self.background(self.canceller, "battle-canceller")
        self.injector.start()
        planned = ", ".join(f"{fault.kind}@{fault.at * seconds:.0f}s" for fault in self.faults) or "none"
        say(f"battle: {self.args.minutes:g} min at {self.args.rate:g} calls/s; faults (seed {self.seed}): {planned}")
        began = time.monotonic()
        producers = [
            threading.Thread(target=self.produce, args=(index, began, seconds), name=f"producer-{index}", daemon=True)
            for index in range(PRODUCERS)
        ]
        run_producers(producers, PROGRESS_SECONDS, lambda: f"sent {self.sent:,}, ran {self.done():,}{self.backlog()}")
        sending = time.monotonic() - began
        self.producing.clear()
        self.injector.finish()
        say(f"sending over after {sending:.0f}s ({self.sent:,} calls, {self.sent / sending:.1f}/s); draining")
        drained = self.drain()
        drain_seconds = time.monotonic() - began - sending
        self.flush()
        if not self.plain and self.args.quiet:
            say(f"drained ({drained}) in {drain_seconds:.0f}s; letting expiring keys expire ({self.args.quiet:g}s)")
            time.sleep(self.args.quiet)
        letters = self.dead_letters()
        purged = self.purge_worker_lost(letters)
        if letters:
            say(f"{len(letters):,} dead letters read; the {purged:,} of runs cut short with their worker purged")
        self.sample()
        with self.topology.store_client() as client:
            keys_end = inventory(client)
        return {
            "sending_seconds": round(sending, 1),
            "drain_seconds": round(drain_seconds, 1),
            "drained": drained,
            "rate_reached": round(self.sent / sending, 1) if sending else None,
            "keys_start": self.keys_start,
            "keys_end": keys_end,
            "dead_letters": letters,
            "worker_lost_purged": purged,
        }

    def done(self) -> int:
        assert self.ledger is not None
        try:
            return self.ledger.done()
        except redis.RedisError:
            return -1

    def backlog(self) -> str:
        row = self.samples[-1] if self.samples else {}
        parts = [f"{name} {row[name]:,}" for name in ("queue", "unacked", "parked", "inflight") if name in row]
        return f" ({', '.join(parts)})" if parts else ""

    def settled(self) -> bool:
        """Nothing parked, in flight or in a batch group, no message in the queue, none held unacknowledged but
        the tick's, no cancel left to make. Dead letters are settled: the store holds them, nothing delivers them."""
        if self._cancels:
            return False
        try:
            if self.rabbit:
                if self.broker_depth() or self.broker_unacknowledged():
                    return False
            else:
                with self.topology.store_client() as client:
                    if not redis_broker_idle(client, QUEUE, but=TICK):
                        return False
            if not self.plain:
                assert self.app is not None
                return store_idle(self.app.rd)
        except Exception:  # noqa: BLE001 - Redis still restarting: not settled
            return False
        return True

    def broker_depth(self) -> int:
        """The messages ready in the battle's queue on the RabbitMQ node (a passive declare); a broken connection is
        made again at the next call."""
        assert isinstance(self.topology, StoreAndRabbit)
        if self._broker is None:
            from kombu import Connection

            self._broker = Connection(self.topology.broker_url, connect_timeout=5)
        try:
            return self.topology.rabbit.queue_depth(self._broker, QUEUE)
        except Exception:
            self._broker.release()
            self._broker = None
            raise

    def broker_unacknowledged(self) -> int:
        """The messages of the battle's queue that consumers hold unacknowledged (``rabbitmqctl``: a second of an
        Erlang VM's start, so only the drain asks): plain Celery's eta messages wait there until due."""
        assert isinstance(self.topology, StoreAndRabbit)
        out = self.topology.rabbit.ctl("list_queues", "-q", "name", "messages_unacknowledged")
        for line in out.splitlines():
            name, _, count = line.strip().partition("\t")
            if name == QUEUE:
                return int(count)
        return 0

    def expected(self) -> int:
        assert self.ledger is not None
        return self.ledger.expected()

    def drain(self) -> str:
        """Wait until every unit expected has run (or is a dead letter of a run cut short with its worker, which
        never runs) and nothing is left, or nothing has been left to deliver anything for ``--settle`` seconds, or
        the deadline: which of the three."""

        def look() -> Level:
            expected, done, settled = self.expected(), self.done(), self.settled()
            if settled and 0 <= done < expected:
                done += self.dead_lettered_units()  # they never run: the drain does not wait for them
            return Level(done, expected, settled)

        def progress(level: Level) -> None:
            say(f"draining: ran {level.done:,} of {level.expected:,}{self.backlog()}")

        drained = drain(
            look,
            deadline=self.args.deadline,
            settle=self.args.settle,
            pause=1.0,
            every=PROGRESS_SECONDS,
            progress=progress,
        )
        if drained.how == SETTLED:
            return f"settled, {drained.last.expected - drained.last.done} units not run"
        return drained.how

    # -- the dead letters -------------------------------------------------------------------------

    def dead_letters(self) -> list[dict[str, Any]]:
        """Every dead letter of the store (none with plain Celery): its call id, its reason (``why``), and when it
        was dead-lettered (wall clock)."""
        if self.plain or self.app is None:
            return []
        found: list[dict[str, Any]] = []
        while True:
            page = self.app.rd.dead_letters(DEAD_PAGE, len(found))
            found += [
                {"id": entry.id, "why": str(entry.meta.get("why") or ""), "at": round(entry.score_ms / 1000, 3)}
                for entry in page
            ]
            if len(page) < DEAD_PAGE:
                return found

    def dead_lettered_units(self) -> int:
        """The units not run whose call is a dead letter of a run cut short with its worker: by the delivery
        contract of a task that acknowledges early, they are not run again."""
        assert self.ledger is not None
        try:
            letters = self.dead_letters()
        except Exception:  # noqa: BLE001 - Redis still restarting: none known yet
            return 0
        numbers = {self._numbers.get(letter["id"]) for letter in letters if letter["why"].startswith(WORKER_LOST)}
        units = [f"{n}.{attempt}" for n in numbers if n is not None for attempt in (0, 1)]  # a retry's two attempts
        if not units:
            return 0
        return self.ledger.sent_not_done(units)

    def purge_worker_lost(self, letters: list[dict[str, Any]]) -> int:
        """Purge the dead letters of runs cut short with their worker, once read (the analysis judges each), so
        that the keys left after the drain are judged without them: how many."""
        ids = [letter["id"] for letter in letters if letter["why"].startswith(WORKER_LOST)]
        if not ids or self.app is None:
            return 0
        purged = 0
        for store in self.app.rd.shards.all():
            for start in range(0, len(ids), DEAD_PAGE):
                purged += len(store.purge_many(ids[start : start + DEAD_PAGE]))
        return purged

    # -- the ledger -------------------------------------------------------------------------------

    def read_ledger(self) -> tuple[dict[str, Any], list[Any], list[Any], dict[str, bool], list[Any]]:
        assert self.ledger is not None
        return self.ledger.read()
