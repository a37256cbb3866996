"""kombu's unacknowledged-message bookkeeping, left out for the calls the store released (``redisdelay_skip_unacked``).

kombu's Redis transport notes each message a worker receives in its unacked hash and index, and removes it there
when the message is acknowledged: two round trips a message in the worker's main process, the process that
receives every message, so that kombu can put back what a worker that died or stopped held. A call the store
released is tracked by the store already: its worker holds it under a lease (:mod:`.leases`), and the sweep
delivers it again once the lease runs out. With the setting on, the worker's task channel skips kombu's two round
trips for those messages (the deliveries release.lua tags ``<id>.<n>``) and keeps only kombu's count of the
messages it holds in memory, which its prefetch limit reads. What kombu would have put back goes back through the
store instead:

- a message rejected with requeue (``Reject(requeue=True)``, ``message.requeue()``): its call goes back to the
  delay set due now, at once, and the next release delivers it again;
- the messages the worker's channel holds unacknowledged when it closes (the worker stops warmly, or lost its
  connection), as kombu restores its own then, but for the calls still running: the same. Not before: a worker
  that stops fetches until its channel closes, and would take a call put back earlier again;
- the calls of a worker that died or lost its connection: their leases run out and the sweep delivers them
  again, within a lease (kombu would have restored them after its visibility timeout, an hour by default).

Every other message (published through kombu, such as Celery's own calls due now) keeps kombu's bookkeeping.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual

from .. import patching
from ..errors import RedisDelayError
from ..store.calls import LARGEST_STEP
from .running import running_requests

if TYPE_CHECKING:
    from ..store.depot import Depot

logger = logging.getLogger(__name__)


def store_delivery(call_id: Any, tag: Any) -> bool:
    """Whether a delivery tag is one the store's release gave (``<id>.<n>``, the call's id and its delivery)."""
    if not isinstance(call_id, str) or not isinstance(tag, str) or not tag.startswith(call_id):
        return False
    rest = tag[len(call_id) :]
    return len(rest) > 1 and rest[0] == "." and rest[1:].isdigit()


def install(channel: Any, depot: Depot) -> bool:
    """Leave kombu's unacked bookkeeping out, on ``channel``, for the deliveries of the store's calls; whether it
    was set up (only kombu's Redis transport keeps such bookkeeping: a py-amqp channel has no ``qos``)."""
    qos = getattr(channel, "qos", None)
    if qos is None or not hasattr(qos, "unacked_key") or not hasattr(qos, "_remove_from_indices"):
        return False
    if not patching.applied(qos, "qos.unacked"):
        bookkeeping = _Bookkeeping(qos, depot)
        replacements = {name: getattr(bookkeeping, name) for name in ("append", "ack", "reject", "restore_unacked")}
        patching.apply("qos.unacked", qos, replacements)
    return True


class _Bookkeeping:
    """A task channel's ``QoS`` methods, kombu's for every delivery but those the store's release gave (``own``):
    kombu's in-memory bookkeeping only for those, which the store tracks itself."""

    def __init__(self, qos: Any, depot: Depot) -> None:
        self.qos, self.depot = qos, depot
        self.own: set[str] = set()  # the tags of the store's deliveries this channel holds
        self.kombu_append, self.kombu_ack = qos.append, qos.ack
        self.kombu_reject, self.kombu_restore_unacked = qos.reject, qos.restore_unacked

    def append(self, message: Any, delivery_tag: Any) -> None:
        headers = getattr(message, "headers", None) or {}
        if store_delivery(headers.get("id"), delivery_tag):
            self.own.add(delivery_tag)
            virtual.QoS.append(self.qos, message, delivery_tag)
        else:
            self.kombu_append(message, delivery_tag)

    def ack(self, delivery_tag: Any) -> None:
        if delivery_tag in self.own:
            self.own.discard(delivery_tag)
            virtual.QoS.ack(self.qos, delivery_tag)
        else:
            self.kombu_ack(delivery_tag)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if delivery_tag not in self.own:
            self.kombu_reject(delivery_tag, requeue=requeue)
            return
        self.own.discard(delivery_tag)
        if requeue:
            put_back(self.depot, str(delivery_tag), rejected=True)
        virtual.QoS.ack(self.qos, delivery_tag)  # as kombu's Redis QoS ends a reject: the message leaves its count

    def restore_unacked(self, client: Any = None) -> Any:
        # The channel closes (the worker stops, or lost its connection): kombu puts back the messages it holds
        # unacknowledged, and the store the calls of its own deliveries among them, but for those still running
        # (an acks_late run that its lease keeps).
        running = {request.id for request in running_requests()}
        delivered = self.qos._delivered
        mine = [tag for tag in list(delivered) if tag in self.own]
        back = [tag for tag in mine if tag.rpartition(".")[0] not in running]
        for tag in mine:
            self.own.discard(tag)
            delivered.pop(tag, None)
        put_back(self.depot, *back)
        return self.kombu_restore_unacked(client)


def put_back(depot: Depot, *tags: str, rejected: bool = False) -> None:
    """Put the calls of these deliveries back in the delay set, due now: one script per shard and step (see
    :meth:`CallStore.put_back`). ``rejected``: their runs were rejected with requeue, so a start of them that
    reaches Redis afterwards (a pool process writes its starts in batches, see :mod:`..store.outbox`) is stale
    and leaves the call where it is, instead of taking it back as running as a late start does after the
    sweep; it would then have waited for its lease."""
    for store, calls in depot.shards.by_home((tag.rpartition(".")[0], tag) for tag in tags).values():
        for start in range(0, len(calls), LARGEST_STEP):
            step = calls[start : start + LARGEST_STEP]
            try:
                store.put_back(depot.worker_name or "", step, rejected=rejected)
            except RedisDelayError as exc:
                logger.warning(
                    "redisdelay: could not put back %d call(s); they run again once their leases run out: %s",
                    len(step),
                    exc,
                )
