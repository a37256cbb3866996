"""A stored call's payload made readable for an operator: its format, route, queue and arguments.

Used by ``redisdelay show``, the paged lists (the queue filter and the argument search) and the
dashboard. Nothing here writes; a payload that does not decode is described, never raised.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..message.envelope import Envelope, EnvelopeError
from ..message.stored import BatchCall, decode_body, decode_stored, kind_of
from ..store.meta import CallMeta

if TYPE_CHECKING:
    from ..store.depot import Depot

PICKLE = "application/x-python-serialize"
#: Header fields of a stored message worth showing to an operator.
SHOWN_HEADERS = (
    "task",
    "retries",
    "expires",
    "root_id",
    "parent_id",
    "group",
    "shadow",
    "timelimit",
    "argsrepr",
    "kwargsrepr",
    "origin",
)


def decode_payload(depot: Depot, raw: bytes) -> dict[str, Any]:
    """A stored payload made readable: which format, where it goes, and its arguments.

    The formats: ``envelope`` (Celery's message as the kombu path stores it), ``broker message`` (the
    message kombu's Redis transport pushes, stored by the fast path) and ``batch`` (a flushed batch).
    Arguments are decoded with kombu, honouring the content type; a pickled body only when the app's
    ``accept_content`` allows pickle, since unpickling runs code of the message's choosing.
    """
    described: dict[str, Any] = {"format": None, "bytes": len(raw), "decoded": False, "note": None}
    try:
        envelope = decode_stored(raw)
    except EnvelopeError as exc:
        described["note"] = str(exc)
        return described
    if isinstance(envelope, BatchCall):
        described.update(format="batch", task=envelope.task, batch_key=envelope.key, items=len(envelope.items))
        described.update(args=[envelope.key, envelope.items], kwargs={}, decoded=True)
        return described
    described.update(
        format=kind_of(raw),
        task=envelope.task,
        exchange=envelope.exchange,
        routing_key=envelope.routing_key,
        queue=envelope_queue(envelope),
        priority=envelope.properties.get("priority"),
        content_type=envelope.content_type,
        content_encoding=envelope.content_encoding,
        headers={name: envelope.headers[name] for name in SHOWN_HEADERS if envelope.headers.get(name) is not None},
    )
    accepted = depot.accepted_content_types
    if envelope.content_type == PICKLE and accepted is not None and PICKLE not in accepted:
        described["note"] = "(pickle; not decoded)"
        return described
    try:
        body = decode_body(envelope, accept={envelope.content_type})
    except EnvelopeError as exc:
        described["note"] = f"({exc})"
        return described
    if isinstance(body, list | tuple) and len(body) == 3:  # protocol 2: (args, kwargs, embed)
        described.update(args=body[0], kwargs=body[1], decoded=True)
    elif isinstance(body, dict):  # protocol 1
        described.update(args=body.get("args"), kwargs=body.get("kwargs"), decoded=True)
    else:
        described["note"] = f"(a body of {type(body).__name__}, not a Celery task message)"
    return described


def envelope_queue(envelope: Envelope) -> str:
    """The queue a message is routed to as far as the message itself says: the first queue Celery
    named, else the routing key (through the default exchange the routing key names the queue)."""
    return envelope.queues[0] if envelope.queues else envelope.routing_key


def queue_of_list(depot: Depot, list_key: str) -> str:
    """The queue whose broker list is ``list_key`` (kombu's ``global_keyprefix`` and priority suffix off)."""
    layout = depot.broker_layout
    if layout.global_keyprefix and list_key.startswith(layout.global_keyprefix):
        list_key = list_key[len(layout.global_keyprefix) :]
    return list_key.split(layout.sep, 1)[0]


def queue_of(depot: Depot, meta: CallMeta, raw: bytes | None) -> str | None:
    """The queue a stored call goes to: from the list its metadata names (a call stored as a broker
    message), else from its payload; None when neither says (no payload, undecodable)."""
    if isinstance(meta.get("l"), str) and meta["l"]:
        return queue_of_list(depot, meta["l"])
    if raw is None:
        return None
    try:
        stored = decode_stored(raw)
    except EnvelopeError:
        return None
    if isinstance(stored, BatchCall):
        task = depot.app.tasks.get(stored.task)
        options = getattr(task, "routing_options", {}) or {}
        return str(options.get("queue") or depot.app.conf.task_default_queue)
    return envelope_queue(stored)


def arguments_text(depot: Depot, raw: bytes | None) -> str | None:
    """The call's arguments as the dashboard shows them, for the argument search: args then kwargs, each
    as JSON (``[42, "shipped"] {"amount": 6.0}``; ``repr`` where not JSON); None when they cannot be
    decoded (no payload, pickle not accepted, corrupt)."""
    if raw is None:
        return None
    described = decode_payload(depot, raw)
    if not described["decoded"]:
        return None
    return f"{as_json(described['args'])} {as_json(described['kwargs'])}"


def as_json(value: Any) -> str:
    """``value`` as one line of JSON, or its ``repr`` when it is not JSON (pickled objects, dates)."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)
