"""A task message as a worker received it, turned back into the envelope its producer's ``send_task`` built.

A worker that parks an eta message it received (``redisdelay_park_received``) stores what a delayed task's
``apply_async`` would have stored for the same call: the message minus its eta, which moves to the private
header the running task's ``request.eta`` is set from (:data:`~celery_redisdelay.message.marks.ETA_HEADER`).
Where the broker is a Redis this is exact: kombu's Redis transport keeps the message as it was pushed
(``message._raw``), and :func:`~celery_redisdelay.message.wire.to_envelope` reads it as it reads a stored broker
message. For another broker the envelope is made of the message's parts: its body, headers, the routing it came
by and the properties a Celery producer sets.
"""

from __future__ import annotations

from typing import Any

from kombu.utils import json

from . import wire
from .envelope import Envelope, EnvelopeError
from .marks import ETA_HEADER

#: The AMQP properties Celery's ``send_task_message`` gives a task message (the rest belong to the transport).
PUBLISHED_PROPERTIES = ("correlation_id", "reply_to", "priority")


def envelope_of_pushed(raw: bytes) -> Envelope:
    """The envelope of a task message as kombu's Redis transport pushed it onto a queue list, its eta taken out."""
    return _without_eta(wire.to_envelope(raw))


def envelope_of(message: Any) -> Envelope:
    """The envelope of a received task message, its eta taken out (as a parked call's message has none)."""
    raw = getattr(message, "_raw", None)
    if isinstance(raw, dict) and isinstance(raw.get("properties"), dict) and "body" in raw:
        # kombu's virtual transports (Redis) keep the message as it was pushed.
        return envelope_of_pushed(json.dumps(raw).encode())
    info = message.delivery_info or {}
    properties = message.properties or {}
    exchange, routing_key = str(info.get("exchange") or ""), str(info.get("routing_key") or "")
    body = message.body
    if isinstance(body, str):  # py-amqp decodes a body whose content encoding it knows
        body = body.encode(message.content_encoding or "utf-8")
    envelope = Envelope(
        task=str(message.headers.get("task", "?")),
        body=bytes(body),
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        headers=dict(message.headers),
        properties={name: properties[name] for name in PUBLISHED_PROPERTIES if name in properties},
        exchange=exchange,
        routing_key=routing_key,
        queues=[routing_key] if exchange == "" else [],
        delivery_mode=properties.get("delivery_mode"),
    )
    return _without_eta(envelope)


def _without_eta(envelope: Envelope) -> Envelope:
    if "eta" not in envelope.headers:
        raise EnvelopeError("the message has no eta header to take out")
    # As a delayed task's call is stored: Celery's eta kept for the running task, none for the worker's timer.
    envelope.headers[ETA_HEADER] = envelope.headers["eta"]
    envelope.headers["eta"] = None
    return envelope
