"""A worker's heartbeat, for ``celery -A proj redisdelay probe``: what its main process writes so that a probe can
tell a worker that works from one that only answers (``celery inspect ping`` answers while it consumes nothing).

A thread of the worker's main process (``redisdelay-probe``) writes one record every :data:`BEAT_SECONDS` to the
store, at ``{prefix}:probe:<worker name>`` in the first shard (``Keyspace.probe``): one ``SET ... PX`` of a small
JSON object (about 250 bytes), which expires :data:`RECORD_TTL_SECONDS` after the last write, so a gone worker's
record does not stay. No script, no read: the write is atomic and costs one round trip a second. Its fields, in
seconds by the worker's monotonic clock as of the write, each counted from the worker's start while what it counts
has not happened yet:

``loop``
    since the worker's event loop last turned: the leases note each turn every ``TURN_SECONDS``
    (:mod:`.leases`); null where no event loop is watched (eventlet, gevent).
``busy``
    whether a run holds the loop's thread (the solo pool runs its calls there): the loop is waiting for the run
    then, not stuck, as the leases' stall watch sees it.
``renewed``
    since a renewal of the worker's leases last reached Redis (the lease thread renews every
    ``redisdelay_lease_renewal`` seconds, also when it holds nothing).
``short``
    for how long its consumer has consumed fewer queues than it should; 0 when it consumes them all.
``should``, ``consumes``
    the queues the worker consumed when it started (``-Q``, or the app's queues) and those its consumer consumes
    now: its task consumer has a consumer tag for the queue and, on kombu's virtual transports (Redis), its channel
    polls the queue. A queue added since (``add_consumer``) is not missed; one cancelled (``cancel_consumer``) is.
``up``, ``lease``, ``pid``, ``stopping``
    since the worker started, its ``redisdelay_lease``, its process id, and whether it is stopping (the last
    record, written when its steps stop).

How long ago the record was written is what its expiry has counted down (:data:`RECORD_TTL_SECONDS` less ``PTTL``),
by the Redis server's clock: the probe needs no clock of its own, and the worker's and the probe's hosts need not
agree on the time. :func:`read_beat` reads it back; :mod:`celery_redisdelay.operations.probe` judges it.

With ``redisdelay_probe_file``, the same thread touches that file (sets its mtime, creating it) when the loop turned
since the last touch (or a run holds it), the consumer consumes every queue it should and the leases were renewed
within a lease: its age is how long the worker has not looked healthy, for a probe without store access. The file
is removed when the worker stops.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery.utils.nodenames import node_format
from redis.cluster import RedisCluster

from ..errors import RedisDelayError
from ..store.calls import redis_errors, text
from .leases import TURN_SECONDS, Leases

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..store.calls import CallStore
    from ..store.depot import Depot

logger = logging.getLogger(__name__)

#: How often the worker writes its heartbeat (seconds): as often as its event loop notes a turn.
BEAT_SECONDS = TURN_SECONDS
#: A heartbeat expires this long after its last write (seconds): the record of a worker gone that long is forgotten.
RECORD_TTL_SECONDS = 600
RECORD_TTL_MS = RECORD_TTL_SECONDS * 1000


class ProbedLeases(Leases):
    """The worker's leases, which also note when a renewal last reached Redis, and tell whether a run holds the
    event loop's thread, for the heartbeat."""

    #: When (the leases' clock) a renewal last reached Redis on every shard; None: not yet.
    renewed: float | None = None

    def _hold(self, calls: Sequence[tuple[str, str]], renewal: bool) -> bool:
        reached = super()._hold(calls, renewal)
        if reached and renewal:
            self.renewed = self.clock()
        return reached

    @property
    def loop_busy(self) -> bool:
        """Whether a run holds the event loop's thread (the solo pool's), which then waits for it."""
        return self._runs_in_loop > 0


def should_consume(app: Any) -> list[str]:
    """The queues a worker of ``app`` consumes as it starts: ``-Q`` (Celery selects them before the worker's steps
    are made), else every queue of the app."""
    return sorted(str(name) for name in app.amqp.queues.consume_from)


def consumed_queues(consumer: Any) -> list[str]:
    """The queues Celery's worker consumer consumes now: its task consumer's channel is open and holds a consumer tag
    for each, and on kombu's virtual transports (Redis) polls each. Empty while the consumer (re)connects.
    Read from another thread than the consumer's: copies, and membership tests only."""
    task_consumer = getattr(consumer, "task_consumer", None)
    if task_consumer is None:
        return []
    channel = getattr(task_consumer, "channel", None)
    polled = getattr(channel, "_active_queues", None)  # kombu's virtual channels: the queues they pop from
    if channel is None or getattr(channel, "is_open", True) is False:  # py-amqp's (RabbitMQ)
        return []
    if polled is not None and getattr(channel, "closed", False):
        return []
    names = {str(queue.name) for queue in list(task_consumer.queues) if task_consumer.consuming_from(queue)}
    if polled is not None:
        names &= {str(name) for name in list(polled)}
    return sorted(names)


class Heartbeat:
    """One worker's heartbeat: see the module's docstring. ``controller`` is Celery's ``WorkController``."""

    def __init__(self, depot: Depot, worker: str, leases: ProbedLeases, controller: Any) -> None:
        self.store = depot.store
        self.key = self.store.keys.probe(worker)
        self.leases = leases
        self.controller = controller
        self.clock = leases.clock
        self.lease = depot.settings.lease
        self.should = should_consume(controller.app)
        self.watched = bool(getattr(controller, "use_eventloop", False))  # LoopTurnStep notes its turns
        path = depot.settings.probe_file
        self.file = Path(node_format(path, worker)) if path else None
        self.started = self.clock()
        self.complete: float | None = None  # when the consumer was last seen consuming every queue it should
        self.stopping = False
        self._touched_at_turn: float | None = None
        self._stopped = threading.Event()
        self._failing: set[str] = set()  # what failed (the write, the touch), told once until it works again

    def record(self) -> dict[str, Any]:
        """The record as of now (see the module's docstring)."""
        now = self.clock()
        consumes = consumed_queues(getattr(self.controller, "consumer", None))
        if set(self.should) <= set(consumes):
            self.complete = now
        turned = self.leases.turned
        renewed = self.leases.renewed
        return {
            "loop": round(now - (self.started if turned is None else turned), 3) if self.watched else None,
            "busy": self.leases.loop_busy,
            "renewed": round(now - (self.started if renewed is None else renewed), 3),
            "short": 0 if self.complete == now else round(now - (self.complete or self.started), 3),
            "should": self.should,
            "consumes": consumes,
            "up": round(now - self.started, 3),
            "lease": self.lease,
            "pid": os.getpid(),
            "stopping": self.stopping,
        }

    def beat(self) -> None:
        """Write the record, and touch the file if the worker looks healthy."""
        record = self.record()
        try:
            with redis_errors("write the worker's heartbeat"):
                self.store.client.set(self.key, json.dumps(record, separators=(",", ":")), px=RECORD_TTL_MS)
        except RedisDelayError as exc:
            self._failed("write", "redisdelay: could not write the worker's heartbeat for the probe: %s", exc)
        else:
            self._works("write")
        if self.file is not None and not self.stopping and self.healthy(record):
            try:
                self.file.touch()
            except OSError as exc:
                self._failed("touch", "redisdelay: could not touch the probe file (redisdelay_probe_file): %s", exc)
            else:
                self._works("touch")

    def healthy(self, record: dict[str, Any]) -> bool:
        """Whether to touch the file: the loop turned since the last touch (or a run holds it, or it is not
        watched), the consumer consumes every queue it should, and the leases were renewed within a lease."""
        turned = self.leases.turned
        turning = not self.watched or record["busy"] or (turned is not None and turned != self._touched_at_turn)
        if not (turning and record["short"] == 0 and record["renewed"] <= self.lease):
            return False
        self._touched_at_turn = turned
        return True

    def run(self) -> None:
        """Beat every :data:`BEAT_SECONDS` until :meth:`stop`; then write the last record and remove the file."""
        while not self._stopped.is_set():
            self._beat_once()
            self._stopped.wait(BEAT_SECONDS)
        self._beat_once()
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.unlink()

    def _beat_once(self) -> None:
        try:
            self.beat()
        except Exception:  # noqa: BLE001 - the heartbeat must outlive what it reads (Celery's consumer, mid-change)
            self._failed("beat", "redisdelay: the worker's heartbeat failed; it tries again in a second", exc_info=True)

    def stop(self) -> None:
        """The worker stops: the thread writes a last record that says so, removes the file, and ends."""
        self.stopping = True
        self._stopped.set()

    def _failed(self, what: str, message: str, *args: Any, exc_info: bool = False) -> None:
        if what not in self._failing:
            self._failing.add(what)
            logger.warning(message, *args, exc_info=exc_info)

    def _works(self, what: str) -> None:
        self._failing.discard(what)


@dataclass(frozen=True)
class Beat:
    """A worker's heartbeat as read back: its record, and how long ago it was written (seconds, by the clock of the
    Redis server that holds it)."""

    record: dict[str, Any]
    age: float


def read_beat(store: CallStore, worker: str) -> Beat | None:
    """The heartbeat of the worker named ``worker`` (its full name, ``celery@host``), None when it has none (never
    written, or expired). A record that is not a JSON object reads as none.

    The expiry is read before the record, in one pipeline of two single-key commands (a Redis Cluster takes it): a
    write between them makes the record newer than its age says, never older."""
    key = store.keys.probe(worker)
    with redis_errors(f"read the heartbeat of worker {worker}"):
        pipe = store.client.pipeline(transaction=False)
        pipe.pttl(key)
        pipe.get(key)
        left, raw = pipe.execute()
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    left = int(left)
    age = (RECORD_TTL_MS - left) / 1000 if 0 <= left <= RECORD_TTL_MS else 0.0
    return Beat(record, max(0.0, age))


def heartbeat_names(store: CallStore, limit: int = 20, budget: int = 20) -> tuple[list[str], bool]:
    """The names of the workers with a heartbeat in ``store``, for the message of a probe of an unknown name: at most
    ``limit`` of them, found by at most ``budget`` SCAN calls of 1,000 keys each; and whether the list is complete.
    None are listed on a Redis Cluster (its SCAN goes node by node)."""
    if isinstance(store.client, RedisCluster):
        return [], False
    prefix = store.keys.probe("")
    found: set[str] = set()
    cursor = 0
    with redis_errors("list the workers' heartbeats"):
        for _ in range(budget):
            cursor, keys = store.client.scan(cursor=cursor, match=f"{_glob_escape(prefix)}*", count=1000)
            found.update(text(key).removeprefix(prefix) for key in keys)
            if len(found) > limit:
                return sorted(found)[:limit], False
            if int(cursor) == 0:
                return sorted(found), True
    return sorted(found), False


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis glob pattern (the hash tag's braces are not special; ``*?[]\\`` are)."""
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)
