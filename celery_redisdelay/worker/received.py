"""Eta messages a worker receives are parked, not held (``redisdelay_park_received``).

A Celery worker keeps a message with an eta in its memory until the eta, and on a Redis broker a delay
longer than the broker's visibility timeout gets it delivered again and again. Producers without the
extension send such messages (another service, the deploy before this one, ``self.retry`` run by an older
worker), and kombu restores those a worker held when it died. With the setting on (``redisdelay_all_tasks``
turns it on), the worker's message handler of each task whose calls may be parked takes a message whose eta
is more than ``redisdelay_park_received_after`` seconds away, stores it as the call it is (the message minus
its eta, due at its eta; :mod:`celery_redisdelay.message.received`) and acknowledges it. Nearer ones, and
those already expired or revoked, go to Celery's own handler.

The store takes a message only if it does not know its id: a message received twice is one call. Where the
broker is the store's Redis, the same script removes the delivery from kombu's unacked hash, so a worker
killed between the park and the acknowledgement leaves the call either parked or still in the broker, never
both. With the broker elsewhere, a message the broker delivers again after the call already ran (a Redis
broker restores it after its visibility timeout) is taken again: see README, "Adopting it".
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery.worker.state import revoked

from ..errors import RedisDelayError
from ..message.envelope import EnvelopeError
from ..message.received import envelope_of
from ..producer.adoption import park_waiting, waiting_due_ms
from ..store.calls import CONFLICT, BrokerCopy
from . import strategies

if TYPE_CHECKING:
    from ..producer.rules import CallRules
    from ..store.depot import Depot

logger = logging.getLogger(__name__)


class ReceivedParking:
    """Parks the eta messages a worker receives for the tasks ``rules_of`` gives rules for (None: left to
    Celery). :meth:`install` wraps those tasks' message handlers; :meth:`take` parks one message."""

    def __init__(self, depot: Depot, rules_of: Callable[[Any], CallRules | None]) -> None:
        self.depot = depot
        self.rules_of = rules_of

    def install(self, tasks: Any) -> int:
        """Wrap the message handler of each task whose calls may be parked (see :mod:`.strategies`); how many."""

        def step_for(task: Any) -> Callable[[Any], bool] | None:
            rules = self.rules_of(task)
            return None if rules is None else functools.partial(self.park_if_waiting, rules=rules)

        return strategies.wrap(tasks, "strategy.received", step_for)

    def park_if_waiting(self, message: Any, rules: CallRules) -> bool:
        """Park ``message`` if it is one to park; whether it was taken (parked, or a call another worker took).
        Nothing is taken when Redis fails: Celery holds the message, as it would without the extension."""
        due_ms = self.due_ms(message)
        if due_ms is None:
            return False
        try:
            status = self.take(message, rules, due_ms)
        except (RedisDelayError, EnvelopeError) as exc:
            logger.warning("redisdelay: could not park received call %s: %s", message.headers.get("id"), exc)
            return False
        if status == CONFLICT:
            logger.info("redisdelay: received call %s was taken by another worker", message.headers["id"])
        return True

    def due_ms(self, message: Any) -> int | None:
        """When a received message is due, if it is one to park (:func:`waiting_due_ms`) and this worker has
        not heard it revoked."""
        headers = getattr(message, "headers", None) or {}
        due = waiting_due_ms(self.depot, headers)
        return None if due is None or headers["id"] in revoked else due

    def take(self, message: Any, rules: CallRules, due_ms: int) -> int:
        """Store a received message as its call, due at ``due_ms``, unless the store knows its id (see
        :func:`~celery_redisdelay.producer.adoption.park_waiting`)."""
        return park_waiting(self.depot, rules, envelope_of(message), due_ms, self._broker_copy(message))

    def _broker_copy(self, message: Any) -> BrokerCopy | None:
        """kombu's unacked entry of ``message``, where the broker is the store's Redis and kombu keeps one."""
        channel: Any = getattr(message, "channel", None)
        if channel is None or not self.depot.fast_release or not getattr(channel, "ack_emulation", False):
            return None
        prefix = self.depot.broker_layout.global_keyprefix
        keys = (prefix + channel.unacked_key, prefix + channel.unacked_index_key)
        return BrokerCopy("unacked", keys, message.delivery_tag)
