"""A worker that loses its broker connection lets go of the old task channel without dying of it.

On a lost connection, Celery 5.7's consumer (``Consumer.on_connection_error_after_connected``) calls the kombu
connection's ``collect()``, then its ``close()`` (celery#10242; Celery 5.6 only collected it). ``collect()`` closes
the channels, then the transport, which drops its connection parameters (``Transport.client = None``). kombu's
Redis channel builds its connection pool from those parameters whenever it has none (``Channel._connparams``), and
it has none once it closed. Two things then need one, and raise ``AttributeError`` (not a connection error, so
Celery does not ignore it: the worker exits with "Unrecoverable error"):

- the second close. A Redis channel's ``close()`` first reads the reply of the BRPOP it has in flight; with the
  broker gone that read raises before the channel marks itself closed, and ``collect()`` ignores the error. The
  ``close()`` that follows closes it again, and this time it puts back the messages it holds unacknowledged
  (``QoS.restore_unacked``): ``'NoneType' object has no attribute 'hostname'`` (kombu#582 is the same on an older
  path). So whenever the store, which is the broker, is killed while a worker waits in BRPOP with messages held;
- the acknowledgement of a message received on the old channel and run since (``QoS.ack``, ``QoS.reject``):
  ``'NoneType' object has no attribute 'client'``, the channel having left its transport.

Plain Celery 5.7 does the same, with every kombu release it accepts (>= 5.7.0). The guard, on the worker's task
channel, skips the Redis side of these once kombu would have to build a connection the channel cannot have. Those
messages stay in kombu's unacked hash, and kombu's visibility-timeout restore delivers them again (as for a worker
that died); the calls the store released are put back by :mod:`.unacked` first (the guard is installed under
it), and the store tracks their runs itself. Celery then reconnects, on a new channel, and the worker consumes
again.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import virtual

from .. import patching

logger = logging.getLogger(__name__)


def cut_off(channel: Any) -> bool:
    """Whether kombu would have to build the channel a connection pool without the parameters for it: it has none
    (it closed) and its transport was closed under it, or it left its transport."""
    if getattr(channel, "_pool", None) is not None:
        return False
    transport = getattr(channel, "connection", None)
    return transport is None or getattr(transport, "client", None) is None


def guard(channel: Any) -> bool:
    """Skip the Redis side of restoring, acknowledging and rejecting on ``channel`` once it is cut off from its
    broker (:func:`cut_off`); whether the guard is in place (only kombu's Redis transport needs it: a py-amqp
    channel, RabbitMQ's, has no ``qos`` at all)."""
    qos = getattr(channel, "qos", None) if hasattr(channel, "_connparams") else None
    if qos is None or not hasattr(qos, "unacked_key"):
        return False
    if patching.applied(qos, "qos.broker_loss"):
        return True
    base = virtual.QoS
    kombu_ack, kombu_reject, kombu_restore_unacked = qos.ack, qos.reject, qos.restore_unacked

    def ack(delivery_tag: Any) -> None:
        if not cut_off(channel):
            kombu_ack(delivery_tag)
            return
        base.ack(qos, delivery_tag)
        logger.warning(
            "redisdelay: could not acknowledge message %s: the broker connection it came on is closed (kombu "
            "delivers the messages it tracks again after its visibility timeout)",
            delivery_tag,
        )

    def reject(delivery_tag: Any, requeue: bool = False) -> None:
        if not cut_off(channel):
            kombu_reject(delivery_tag, requeue=requeue)
            return
        base.ack(qos, delivery_tag)  # as kombu's Redis QoS ends a reject: the message leaves its count
        logger.warning(
            "redisdelay: could not reject message %s: the broker connection it came on is closed (kombu delivers "
            "the messages it tracks again after its visibility timeout)",
            delivery_tag,
        )

    def restore_unacked(client: Any = None) -> Any:
        if client is not None or not cut_off(channel):
            return kombu_restore_unacked(client)
        held = len(qos._delivered)
        qos._delivered.clear()  # as kombu's restore ends
        if held:
            logger.warning(
                "redisdelay: the broker connection closed before its channel, which held %d message(s) "
                "unacknowledged: kombu delivers them again after its visibility timeout",
                held,
            )
        return None

    patching.apply("qos.broker_loss", qos, {"ack": ack, "reject": reject, "restore_unacked": restore_unacked})
    return True
