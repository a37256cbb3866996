"""A worker holds back the calls of a paused task or queue that it receives (see docs/pausing.rst).

The release keeps the due calls of a paused target in the store, but a call may already be in the broker's queue
when the pause is set. The worker's message handler of each task whose calls may be parked looks at the pauses
before Celery's handler gets a message: the set of paused tasks and queues, cached and read again from Redis at
most every :data:`REFRESH_SECONDS` (one round trip, in the worker's main process, only when a message comes). A
message of a paused task, or one that came by a paused queue, is held: its call leaves flight for its pause in the
store (``pause.lua``, ``hold``; a call the store does not track, one Celery sent itself, is adopted into the store
due now, and the release puts it aside), and the message is acknowledged. It goes out again, as a later delivery,
when the pause ends.

The bound: a worker sees a pause within :data:`REFRESH_SECONDS` of the messages it receives. What its consumer had
received before (the calls handed to its pool: up to its prefetch, concurrency times the prefetch multiplier) and
the calls running at the pause run to their end. With no pause set, a message costs a look at the clock and two
empty sets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import RedisDelayError
from ..message.envelope import EnvelopeError
from ..message.marks import delivered_from_store, delivery_number
from ..producer.schedule import resolve_due
from ..store.calls import CONFLICT
from ..store.pauses import active_pauses
from . import strategies
from .received import ReceivedParking

if TYPE_CHECKING:
    from ..producer.rules import CallRules
    from ..store.depot import Depot

logger = logging.getLogger(__name__)

#: How often, at most, a worker reads the pauses again (seconds).
REFRESH_SECONDS = 1.0


class PausedCalls:
    """Holds back the received messages of paused tasks and queues (see the module's text)."""

    def __init__(
        self,
        depot: Depot,
        rules_of: Callable[[Any], CallRules | None],
        owns: Callable[[Any], bool],
        hostname: str = "",
        refresh: float = REFRESH_SECONDS,
    ) -> None:
        self.depot = depot
        self.rules_of = rules_of  # the rules a task's calls are parked by (None: not parked)
        self.owns = owns  # whether a task's calls may be parked in this depot
        self.hostname = hostname
        self.refresh = refresh
        self.tasks: frozenset[str] = frozenset()
        self.queues: frozenset[str] = frozenset()
        self._read_at = -float("inf")
        self._failing = False
        self._parking = ReceivedParking(depot, rules_of)

    def install(self, tasks: Any) -> int:
        """Wrap the message handler of each task whose calls may be parked (see :mod:`.strategies`); how many."""

        def step_for(task: Any) -> Callable[[Any], bool] | None:
            rules = self.rules_of(task) if self.owns(task) else None
            if rules is None:
                return None
            return lambda message: self.hold_if_paused(message, rules)

        return strategies.wrap(tasks, "strategy.paused", step_for)

    def current(self) -> tuple[frozenset[str], frozenset[str]]:
        """The paused tasks and queues, read again when the last read is :attr:`refresh` seconds old."""
        now = time.monotonic()
        if now - self._read_at >= self.refresh:
            self._read_at = now
            try:
                server_ms, records = self.depot.store.pause_records()
            except RedisDelayError as exc:
                if not self._failing:
                    logger.warning("redisdelay: could not read the pauses; the last ones read stand: %s", exc)
                self._failing = True
            else:
                self._failing = False
                pauses = active_pauses(records, server_ms).values()
                self.tasks = frozenset(pause.name for pause in pauses if pause.kind == "task")
                self.queues = frozenset(pause.name for pause in pauses if pause.kind == "queue")
        return self.tasks, self.queues

    def paused(self, message: Any) -> bool:
        """Whether a received message is of a paused task, or came by a paused queue."""
        tasks, queues = self.current()
        if not tasks and not queues:
            return False
        headers = getattr(message, "headers", None) or {}
        if headers.get("task") in tasks:
            return True
        info = getattr(message, "delivery_info", None) or {}
        return bool(queues) and info.get("routing_key") in queues

    def due_ms(self, headers: dict[str, Any]) -> int:
        """When a message Celery sent is due: its eta (a message with one keeps it), or now."""
        now = int(time.time() * 1000)
        eta = headers.get("eta")
        if eta is None:
            return now
        try:
            due = resolve_due(eta=eta, timezone=self.depot.app.conf.timezone).at_ms
        except (RedisDelayError, ValueError, TypeError, OverflowError):
            return now
        return now if due is None else max(due, now)

    def hold_if_paused(self, message: Any, rules: CallRules) -> bool:
        """Hold ``message`` back if its target is paused: whether it was taken (to be acknowledged unrun)."""
        if not self.paused(message):
            return False
        headers = getattr(message, "headers", None) or {}
        call_id = headers.get("id")
        if call_id is None:
            return False  # protocol 1: Celery's
        call_id = str(call_id)
        tag = getattr(message, "delivery_tag", None)
        try:
            if delivered_from_store(call_id, tag, headers):
                number = delivery_number(call_id, tag, headers) or 0
                held = self.depot.shards.first(call_id, lambda store: store.hold_paused(call_id, self.hostname, number))
                if held == 1:
                    logger.info("redisdelay: held call %s back: its task or queue is paused", call_id)
                return held == 1  # else: no longer paused, or not this delivery's to hold (the stale check says)
            # A call Celery sent itself: into the store, due at its eta or now; the release puts it aside while the
            # pause lasts.
            status = self._parking.take(message, rules, self.due_ms(headers))
        except (RedisDelayError, EnvelopeError) as exc:
            logger.warning("redisdelay: could not hold back call %s of a paused target; it runs: %s", call_id, exc)
            return False
        if status == CONFLICT:
            logger.info("redisdelay: call %s of a paused target was taken by another worker", call_id)
        else:
            logger.info("redisdelay: held call %s back: its task or queue is paused", call_id)
        return True
