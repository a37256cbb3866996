"""The fast release path: the broker message is built at park time, and released by one script.

When the broker is a Redis that the store shares (same server and database), a parked call is stored
as the exact message kombu's Redis transport would push onto the queue's list, with the delivery tag
of its first delivery (``<id>.1``), and its metadata names the list (``"l"``). ``release.lua`` then
claims due calls and pushes their messages in one atomic step: no Python per message, no window
between claim and publish; a later delivery gets its own tag (``<id>.<delivery>``). Every other case
(another broker, a topic or fanout exchange, a queue with ``x-expires``) keeps the generic path
through kombu.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kombu.entity import PERSISTENT_DELIVERY_MODE, TRANSIENT_DELIVERY_MODE
from kombu.utils import json

from .envelope import Envelope, EnvelopeError

if TYPE_CHECKING:
    from celery import Celery

#: How a stored broker message starts (an envelope starts with ``{"v":``).
PREFIX = b'{"body": "'
_DELIVERY_MODES = {"persistent": PERSISTENT_DELIVERY_MODE, "transient": TRANSIENT_DELIVERY_MODE}


@dataclass(frozen=True)
class BrokerLayout:
    """How kombu's Redis transport names queue lists for this app (``broker_transport_options``)."""

    global_keyprefix: str = ""
    sep: str = "\x06\x16"
    priority_steps: tuple[int, ...] = (0, 3, 6, 9)
    unacked_key: str = "unacked"
    unacked_index_key: str = "unacked_index"

    @classmethod
    def of(cls, app: Celery) -> BrokerLayout:
        options = app.conf.broker_transport_options or {}
        return cls(
            global_keyprefix=str(options.get("global_keyprefix", "")),
            sep=str(options.get("sep", cls.sep)),
            priority_steps=tuple(options.get("priority_steps", cls.priority_steps)),
            unacked_key=str(options.get("unacked_key", cls.unacked_key)),
            unacked_index_key=str(options.get("unacked_index_key", cls.unacked_index_key)),
        )

    def unacked_keys(self) -> tuple[str, str]:
        """kombu's hash of the deliveries workers hold unacknowledged, and its index by time."""
        return self.global_keyprefix + self.unacked_key, self.global_keyprefix + self.unacked_index_key

    def list_key(self, queue: str, priority: int) -> str:
        """The list kombu pushes a message of ``priority`` for ``queue`` onto (``Channel._q_for_pri``)."""
        steps = sorted(self.priority_steps)
        step = max([s for s in steps if s <= priority] or [steps[0]])
        name = f"{queue}{self.sep}{step}" if step else queue
        return self.global_keyprefix + name

    def list_keys(self, app: Celery) -> list[str]:
        """Every list the app's queues can receive on: the keys the release script may push to."""
        return sorted(
            {self.list_key(name, step) for name in app.amqp.queues for step in self.priority_steps}
            | {self.list_key(name, 0) for name in app.amqp.queues}
        )


def direct_queue(app: Celery, envelope: Envelope) -> str | None:
    """The one list a message goes to when kombu would route it without reading Redis, else None.

    That is the default (anonymous) exchange, through which Celery sends to a direct queue: kombu
    pushes onto the list the routing key names. A named exchange is routed by kombu through the
    bindings it keeps in the broker (other apps' queues may be bound to it), and a queue with an
    expiry has it refreshed on every publish: both go through kombu itself.
    """
    if envelope.exchange != "":
        return None
    queue = app.amqp.queues.get(envelope.routing_key)
    if queue is None or queue.expires is not None:
        return None
    if queue.queue_arguments and "x-expires" in queue.queue_arguments:
        return None
    return envelope.routing_key


class Template:
    """The fast-path form of calls that share one envelope's routing and options.

    ``render`` gives the stored form of the envelope itself; ``text`` that of the same message with
    other headers, properties and body (see :mod:`celery_redisdelay.producer.templates`).
    """

    def __init__(self, key: str, envelope: Envelope, properties: dict[str, Any]) -> None:
        self.key = key  # the list the message goes to
        self.envelope = envelope
        self.properties = properties

    @classmethod
    def of(cls, app: Celery, layout: BrokerLayout, envelope: Envelope) -> Template | None:
        """The template of ``envelope``, or None when the generic path must publish it."""
        queue = direct_queue(app, envelope)
        if queue is None:
            return None
        properties: dict[str, Any] = dict(envelope.properties)
        priority = properties.pop("priority", None) or 0
        expiration = properties.pop("expiration", None)
        if not isinstance(priority, int) or isinstance(priority, bool):
            return None
        # In the order kombu's Producer.publish and the Redis channel add them.
        mode = envelope.delivery_mode or PERSISTENT_DELIVERY_MODE
        properties["delivery_mode"] = _DELIVERY_MODES.get(mode, mode) if isinstance(mode, str) else mode
        if isinstance(expiration, str):
            properties["expiration"] = expiration  # read back from a broker message: kombu's form already
        elif expiration is not None:
            # As Celery computed it at the call: kombu's Redis transport keeps it as information only
            # (the worker goes by the message's absolute ``expires`` header).
            properties["expiration"] = str(int(expiration * 1000))
        properties["delivery_info"] = {
            **properties.get("delivery_info", {}),
            "exchange": envelope.exchange,
            "routing_key": envelope.routing_key,
        }
        properties["priority"] = priority
        properties.pop("delivery_tag", None)
        properties.update(body_encoding="base64")
        key = layout.list_key(queue, max(0, min(priority, 9)))
        if '"' in key or "\\" in key:
            return None  # the release script finds the list's name in the metadata JSON unescaped
        return cls(key, envelope, properties)

    def render(self) -> bytes:
        """The stored form of the envelope."""
        envelope = self.envelope
        body = base64.b64encode(envelope.body).decode()
        return self.text(envelope.headers, self.properties, body, f"{envelope.headers['id']}.1").encode()

    def text(self, headers: dict[str, Any], properties: dict[str, Any], body: str, tag: str) -> str:
        """The message text for these headers and properties, with the base64 ``body`` and the first
        delivery's ``tag`` (also used with placeholders by
        :class:`~celery_redisdelay.producer.templates.CallTemplate`)."""
        envelope = self.envelope
        # The delivery tag comes last, so the release script finds it at the end of the message.
        message = {
            "body": body,
            "content-encoding": envelope.content_encoding,
            "content-type": envelope.content_type,
            "headers": headers,
            "properties": {**properties, "delivery_tag": tag},
        }
        text: str = json.dumps(message)
        return text


def message_for(call_id: str, payload: bytes, delivery: int) -> bytes | None:
    """The message to push for a delivery of a stored broker message (release.lua's ``message_for``):
    as stored for the first, with the tag ``<id>.<delivery>`` for a later one; None when ``payload`` is
    not a broker message of this call."""
    ending = f'"delivery_tag": "{call_id}.1"}}}}'.encode()
    if not payload.startswith(PREFIX) or not payload.endswith(ending):
        return None
    if delivery == 1:
        return payload
    return redelivered(payload[: -len(ending)] + f'"delivery_tag": "{call_id}.{delivery}"}}}}'.encode(), delivery - 1)


_HEADERS, _DELIVERY_INFO = b'"headers": {', b'"delivery_info": {'


def redelivered(message: bytes, earlier: int) -> bytes:
    """A later delivery says so, as kombu's restore and RabbitMQ's quorum queues do: ``redelivered`` in the
    headers and in ``delivery_info`` (Celery's ``request.delivery_info['redelivered']``, which
    ``worker_deduplicate_successful_tasks`` reads), and ``x-delivery-count``, the deliveries before this one, in
    the headers. The message is JSON in the order :meth:`WireFormat.text` writes it (headers before properties,
    ``delivery_info`` the last object opened in it): the marks go in as text, as release.lua puts them."""
    head, info = message.find(_HEADERS), message.rfind(_DELIVERY_INFO)
    if head < 0 or info < head:
        return message
    head_end, info_end = head + len(_HEADERS), info + len(_DELIVERY_INFO)
    marks = b'"redelivered": true, "x-delivery-count": %d' % earlier
    return b"".join(
        [
            message[:head_end],
            marks if message[head_end : head_end + 1] == b"}" else marks + b", ",
            message[head_end:info_end],
            b'"redelivered": true' if message[info_end : info_end + 1] == b"}" else b'"redelivered": true, ',
            message[info_end:],
        ]
    )


def to_envelope(raw: bytes) -> Envelope:
    """The envelope a stored broker message came from, for the generic path and for inspection."""
    try:
        message = json.loads(raw)
        properties = dict(message["properties"])
        info = properties.pop("delivery_info")
        for name in ("delivery_tag", "body_encoding"):
            properties.pop(name, None)
        envelope = Envelope(
            task=str(message["headers"].get("task", "?")),
            body=base64.b64decode(message["body"]),
            content_type=message["content-type"],
            content_encoding=message["content-encoding"],
            headers=message["headers"],
            properties={k: v for k, v in properties.items() if k != "delivery_mode"},
            exchange=info["exchange"],
            routing_key=info["routing_key"],
            # Through the default exchange the routing key names the queue Celery declared.
            queues=[info["routing_key"]] if info["exchange"] == "" else [],
            delivery_mode=properties.get("delivery_mode"),
        )
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError) as exc:
        raise EnvelopeError(f"malformed celery-redisdelay broker message ({exc!r})") from exc
    envelope.check()
    return envelope
