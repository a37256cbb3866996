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
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery.utils.imports import instantiate
from celery.utils.time import maybe_iso8601, maybe_make_aware
from celery.worker.state import revoked

from ..errors import RedisDelayError
from ..message.envelope import EnvelopeError
from ..message.received import envelope_of, received_eta
from ..producer.schedule import resolve_due
from ..store.calls import CONFLICT, BrokerCopy
from ..store.meta import meta_json, routed

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
        """Wrap the Celery strategy (message handler factory) of each task whose calls may be parked; how many."""
        wrapped = 0
        for task in list(tasks.values()):
            rules = self.rules_of(task)
            if rules is None or getattr(task, "_redisdelay_strategy", None) is not None:
                continue
            task._redisdelay_strategy = task.Strategy
            task.Strategy = functools.partial(_strategy, parking=self, rules=rules, original=task.Strategy)
            wrapped += 1
        return wrapped

    def due_ms(self, message: Any) -> int | None:
        """When a received message is due, if it is one to park: an eta more than the threshold away, not
        expired, not revoked in this worker."""
        eta = received_eta(message)
        if eta is None:
            return None
        timezone = self.depot.app.conf.timezone
        try:
            due = resolve_due(eta=eta, timezone=timezone).at_ms
            expires = message.headers.get("expires")
            if expires is not None and maybe_make_aware(maybe_iso8601(expires), timezone).timestamp() <= time.time():
                return None  # Celery discards it, and marks it expired
        except (RedisDelayError, ValueError, TypeError, OverflowError):
            return None  # Celery's handler says what is wrong with it
        if due is None or due - time.time() * 1000 <= self.depot.settings.park_received_after * 1000:
            return None
        return None if message.headers["id"] in revoked else due

    def take(self, message: Any, rules: CallRules, due_ms: int) -> int:
        """Store a received message as its call, due at ``due_ms`` (unless the store knows its id); the
        store's status (:data:`~celery_redisdelay.store.calls.STORED`, ``KEPT`` or ``CONFLICT``)."""
        depot = self.depot
        envelope = envelope_of(message)
        payload, fast = depot.encode(envelope)
        depot.check_size(envelope.task, len(payload))
        limits = rules.call_limits()
        meta = meta_json(routed(limits, fast.key) if fast else limits)
        call_id = str(envelope.headers["id"])
        return depot.shards.home(call_id).adopt(call_id, payload, meta, due_ms, self._broker_copy(message))

    def _broker_copy(self, message: Any) -> BrokerCopy | None:
        """kombu's unacked entry of ``message``, where the broker is the store's Redis and kombu keeps one."""
        channel: Any = getattr(message, "channel", None)
        if channel is None or not self.depot.fast_release or not getattr(channel, "ack_emulation", False):
            return None
        prefix = self.depot.broker_layout.global_keyprefix
        keys = (prefix + channel.unacked_key, prefix + channel.unacked_index_key)
        return BrokerCopy("unacked", keys, message.delivery_tag)


def _strategy(
    task: Any, app: Any, consumer: Any, *, parking: ReceivedParking, rules: CallRules, original: Any, **options: Any
) -> Callable[..., Any]:
    """A task's message handler: Celery's own (``original``), with eta messages to park taken first."""
    handle: Callable[..., Any] = instantiate(original, task, app, consumer, **options)

    def handler(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **more: Any) -> Any:
        due_ms = parking.due_ms(message)
        if due_ms is not None:
            try:
                status = parking.take(message, rules, due_ms)
            except (RedisDelayError, EnvelopeError) as exc:
                # Nothing was stored: Celery holds the message, as it would without the extension.
                logger.warning("redisdelay: could not park received call %s: %s", message.headers.get("id"), exc)
            else:
                if status == CONFLICT:
                    logger.info("redisdelay: received call %s was taken by another worker", message.headers["id"])
                ack(logger, consumer.connection_errors)  # as Celery's request acknowledges
                return None
        return handle(message, body, ack, reject, callbacks, **more)

    return handler
