"""A redelivered message of a parked call runs only if it is the call's current delivery.

Besides the store's own redelivery (the sweep, once a call's lease or deadline ran out), a broker can deliver
a message again: kombu's Redis transport restores the messages a dead worker held after its visibility
timeout (where the broker is not the store's Redis; on the store's own server the sweep removes them), and
RabbitMQ requeues them as soon as the worker's connection drops. Both mark the message redelivered. The
worker's message handler of each task whose calls may be parked asks the store about such a message before
Celery's handler gets it (``delivery.lua``, one round trip, for redelivered messages only): a message of an
older delivery than the call's current one, of an earlier attempt of a call that retried (its ``retries``
header is not the stored message's: a retry's deliveries count from 1 again), of a call another worker holds
under a lease that has not run out (kombu restores a message a live worker has held past the visibility
timeout, and those of a dropped connection), or of a call that is finished, cancelled, parked again or
dead-lettered, is acknowledged and dropped, and logged. A message the store cannot be asked about runs
(at-least-once).

First deliveries are not asked about, they cost nothing, but for one that waited so long in a broker queue that the
sweep may have delivered its call again meanwhile (:func:`~..message.marks.possibly_superseded`: released more than
half the queue timeout ago, or, on an AMQP broker, half a lease or half the claim timeout ago, the shorter: a publish
the broker left in doubt is delivered again once a lease ran out, a call whose claim ran out before its releaser
recorded the publish once the claim did, and the broker may have kept the first copy). On the store's own Redis the
sweep takes the waiting message out of its list; a broker such as RabbitMQ keeps it, and both would run. So on
RabbitMQ a backlog older than 15 s (the defaults) costs a round trip a message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import RedisDelayError
from ..message.marks import delivery_number, possibly_superseded, redelivered, superseded_after_ms
from . import strategies

if TYPE_CHECKING:
    from ..store.depot import Depot

logger = logging.getLogger(__name__)


class StaleDeliveries:
    """Drops the redelivered messages of parked calls that are not the call's current delivery."""

    def __init__(self, depot: Depot, owns: Callable[[Any], bool], hostname: str = "") -> None:
        self.depot = depot
        self.owns = owns  # whether a task's calls may be parked in this depot
        self.hostname = hostname  # the worker's: a copy of a call another worker holds is stale
        self._after_ms: int | None = None  # superseded_after_ms, worked out at the first message

    def install(self, tasks: Any) -> int:
        """Wrap the message handler of each task whose calls may be parked (see :mod:`.strategies`); how many."""
        return strategies.wrap(tasks, "strategy.stale", lambda task: self.is_stale if self.owns(task) else None)

    def is_stale(self, message: Any) -> bool:
        """Whether a received message is a redelivery (or a first delivery that may have been superseded) the store
        says is not the call's current delivery."""
        headers = getattr(message, "headers", None) or {}
        if self._after_ms is None:
            settings = self.depot.settings
            self._after_ms = superseded_after_ms(
                settings.queue_timeout, settings.lease, self.depot.amqp_broker, settings.claim_timeout
            )
        if not redelivered(message) and not possibly_superseded(headers, int(time.time() * 1000), self._after_ms):
            return False
        call_id = headers.get("id")
        number = delivery_number(str(call_id), getattr(message, "delivery_tag", None), headers)
        if call_id is None or number is None:
            return False  # not a delivery of a parked call
        retries = headers.get("retries")
        attempt = retries if isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0 else None
        # An AMQP broker redelivers a message only once the channel it was delivered on closed: whoever held it then
        # can no longer acknowledge it, and its lease is no reason to wait (the store's own redeliveries say so in a
        # header, not in delivery_info). The call leaves that worker, for this one's lease to take.
        info = getattr(message, "delivery_info", None) or {}
        by_broker = bool(info.get("redelivered")) and self.depot.amqp_broker
        try:
            current = self.depot.shards.first(
                str(call_id),
                lambda store: store.current(str(call_id), number, self.hostname, attempt, by_broker=by_broker),
            )
        except RedisDelayError as exc:
            logger.warning("redisdelay: could not check redelivered call %s; it runs: %s", call_id, exc)
            return False
        if not current:
            logger.info("redisdelay: dropped delivery %d of call %s: it is not the call's current one", number, call_id)
        return not current
