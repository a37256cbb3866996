"""What one app's extension offers its operator in Python: the actions on a call (cancel, reschedule, requeue), a
lock for code outside tasks, pauses, counts, the dead letters, a tick and a ping; :class:`Operations` is a part of
:class:`celery_redisdelay.RedisDelay`, each method the face of the layer that does the work."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import RedisDelayError, ScheduleError
from ..producer.locks import Lock
from ..producer.schedule import resolve_due
from ..release.releaser import TickReport
from ..store.calls import LARGEST_STEP, Entry
from ..worker import revocation
from . import checks, pausing
from . import queues as queue_latency
from .listing import Scanner

if TYPE_CHECKING:
    from ..release.releaser import Releasers
    from ..store.depot import Depot
    from ..store.shards import ShardSet

logger = logging.getLogger("celery_redisdelay.extension")  # the tick's log lines keep the name they had


def check_task_id(task_id: object, argument: str = "task_id") -> None:
    """Refuse an id that is not a string, naming the argument (a Celery task id is a string)."""
    if not isinstance(task_id, str):
        raise TypeError(f"{argument} must be a string (a Celery task id), not {task_id!r}")


class Operations:
    """The operator's API of :class:`~celery_redisdelay.RedisDelay` (which gives it these attributes)."""

    app: Any
    depot: Depot
    releasers: Releasers

    @property
    def shards(self) -> ShardSet:
        """The call stores: ``redisdelay_shards`` of them, plus retired ones that still hold calls."""
        return self.depot.shards

    def check_size(self, what: str, size: int) -> None:
        """Refuse to store more than ``redisdelay_max_payload_bytes`` for one call (or batch item)."""
        self.depot.check_size(what, size)

    def check_server(self) -> list[str]:
        """Problems of the store's Redis that can lose parked calls; logged loudly when workers and beat start."""
        return checks.server_problems(self.depot)

    def check_config(self) -> list[str]:
        """Settings that make the broker deliver calls we track a second time; logged loudly at start-up."""
        return checks.config_problems(self.depot)

    def cancel(self, task_id: str) -> bool:
        """Drop a call that is still parked and record it as Celery records a revoked task: the result
        ``REVOKED`` (``AsyncResult.get()`` raises ``TaskRevokedError``), a ``task-revoked`` event where
        task events are on. False when it was already released, finished or unknown."""
        check_task_id(task_id)
        return bool(self.cancel_many([task_id]))

    def reschedule(self, task_id: str, *, countdown: float | None = None, eta: Any = None) -> bool:
        """Move a parked call to ``countdown`` seconds from now or to ``eta``; False when it is no longer parked."""
        check_task_id(task_id)
        if countdown is None and eta is None:
            raise ScheduleError("reschedule needs countdown or eta")
        due = resolve_due(countdown, eta, timezone=self.app.conf.timezone)
        moved = self.shards.first(
            task_id, lambda store: store.reschedule(task_id, countdown_ms=due.countdown_ms, due_ms=due.at_ms)
        )
        return moved is not None

    def lock(self, name: str, timeout: float = 60.0, blocking_timeout: float | None = None) -> Lock:
        """The lock ``name`` for code outside tasks: ``with rd.lock("order:42", timeout=60): ...``.

        It is the same lock tasks declared with ``lock=`` take, expiring ``timeout`` seconds after it
        is taken; ``with`` waits up to ``blocking_timeout`` seconds (None: as long as it takes) and
        raises :class:`LockTimeout` after that. Releasing it wakes the first call deferred behind it.
        """
        return Lock(self.shards.for_name(name), name, timeout, blocking_timeout)

    def requeue(self, task_id: str) -> bool:
        """Give a dead-lettered call a fresh start, due now; False when it is not dead-lettered."""
        check_task_id(task_id)
        status = self.shards.first(task_id, lambda store: store.requeue(task_id))
        if status < 0:
            raise RedisDelayError(f"call {task_id} has no payload left to run; it stays dead-lettered")
        return status == 1

    def cancel_many(self, task_ids: Sequence[str]) -> list[str]:
        """Drop the calls among ``task_ids`` that are still parked, 1,000 per script call, and record
        each as revoked (see :meth:`cancel`); returns the ids cancelled (the others were not parked)."""
        return revocation.cancel_many(self.depot, task_ids)

    def pause(
        self, task: str | None = None, queue: str | None = None, seconds: float | str | None = None, reason: str = ""
    ) -> dict[str, Any]:
        """Pause a task (by name) or a queue for the whole fleet, until :meth:`resume` or for ``seconds`` (a number,
        or a text like ``10m``): no call of it starts meanwhile; its calls wait in the store and go out, in due
        order, when the pause ends. A call already running finishes. Pausing again keeps the first pause's start
        and sets its end. Bad input raises :class:`~celery_redisdelay.operations.pausing.PauseError` (a
        ``ValueError``) and stores nothing. Returns the pause as :meth:`paused` lists it."""
        return pausing.pause(self.depot, task=task, queue=queue, seconds=seconds, reason=reason)

    def resume(self, task: str | None = None, queue: str | None = None) -> bool:
        """End the pause of a task or a queue: its calls go out with the next releases. Whether it was paused."""
        return pausing.resume(self.depot, task=task, queue=queue)

    def paused(self) -> list[dict[str, Any]]:
        """What is paused: a dict per target with ``kind`` (task or queue), ``name``, ``since``, ``until`` (aware
        datetimes; until None: until resumed), ``reason`` and ``waiting`` (calls waiting on it in the store)."""
        return pausing.paused(self.depot)

    def queues(self) -> dict[str, dict[str, Any]]:
        """Per queue (those tasks route to, and those seen in the store): ``ready`` (in the broker's lists, priority
        lists included), ``oldest_ready_seconds`` (since the oldest became ready: its release, not its due time),
        ``in_flight``, ``paused``, ``held`` (by limits) and ``release_lag_p50_seconds``, ``release_lag_p99_seconds``
        (all queues, the last 15 minutes). See :mod:`celery_redisdelay.operations.queues`."""
        return queue_latency.queues(self.depot)

    def stats(self) -> dict[str, int]:
        """Counts of calls per state: ``delayed``, ``inflight``, ``dead``, plus ``due`` and ``inflight_expired``,
        and the open batch groups (``batch_groups``) and the items waiting in them (``batch_items``)."""
        return self.depot.stats()

    def find(self, task_id: str) -> Entry | None:
        """Where a call is (delayed, inflight or dead) with its metadata, or None."""
        check_task_id(task_id)
        return self.shards.find(task_id)

    def dead_letters(self, limit: int = 100, offset: int = 0) -> list[Entry]:
        """A page of dead-lettered calls, oldest first over all shards; each entry's ``meta['why']`` says why."""
        stores = self.shards.all()
        # One shard starts at its offset; merged shards are read from their starts, a bounded step at a time.
        skip = 0 if len(stores) == 1 else offset
        offsets = [offset] if len(stores) == 1 else [0] * len(stores)
        scanner = Scanner(self.depot, stores, "dead", offsets, chunk=max(1, min(skip + limit, LARGEST_STEP)))
        found = [scanner.next() for _ in range(skip + limit)]
        return [entry for _, entry in filter(None, found)][skip:]

    def tick(self, shards: Sequence[int] | None = None) -> dict[str, int]:
        """Sweep timed-out calls and release due ones (the body of the ``redisdelay.tick`` task): on every
        shard, retired ones included, or on the configured shards of these indexes only."""
        report: TickReport = self.releasers.tick(shards)
        if report.released or report.requeued or report.dead:
            logger.info("redisdelay tick: %s", report.as_dict())
        return report.as_dict()

    def ping(self) -> bool:
        """Check that the store's Redis answers; raises :class:`StoreUnavailableError` when it does not."""
        return self.depot.ping()
