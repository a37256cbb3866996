"""What a parked call stores as its payload, and the one place that writes and reads it.

Three forms, told apart by how they begin:

``broker message`` (:data:`MESSAGE_PREFIX`)
    when the broker is a Redis: the exact message kombu's Redis transport would push onto the queue's
    list, ending with the first delivery's tag (see :mod:`celery_redisdelay.message.wire`);
``envelope`` (:data:`ENVELOPE_PREFIX`)
    any other broker, or routing only kombu can do: Celery's message as built, minus its eta, which the
    releaser publishes through kombu (see :mod:`celery_redisdelay.message.envelope`);
``batch`` (:data:`BATCH_PREFIX`)
    a flushed batch group (written by the Lua scripts): the task, the key and the items, which the
    releaser turns into the call ``task(key, items)``.

The Lua scripts see the same prefixes: :mod:`celery_redisdelay.store.scripts` hands them these constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kombu.compression import decompress
from kombu.serialization import loads
from kombu.utils import json

from ..errors import PayloadError
from . import wire
from .envelope import Envelope, EnvelopeError

if TYPE_CHECKING:
    from celery import Celery

MESSAGE_PREFIX = wire.PREFIX
ENVELOPE_PREFIX = b'{"v": '
BATCH_PREFIX = b'{"redisdelay":"batch"'
#: The names of the forms, for operators.
KINDS = {MESSAGE_PREFIX: "broker message", ENVELOPE_PREFIX: "envelope", BATCH_PREFIX: "batch"}


@dataclass(frozen=True)
class BatchCall:
    """A flushed batch as stored: which task, which key, and the items in arrival order."""

    task: str
    key: str
    items: list[Any]


def kind_of(raw: bytes) -> str | None:
    """The name of a stored payload's form, or None when it is none of ours."""
    return next((kind for prefix, kind in KINDS.items() if raw.startswith(prefix)), None)


def decode_stored(raw: bytes) -> Envelope | BatchCall:
    """A stored payload read back; :class:`EnvelopeError` says what is wrong with one that cannot be."""
    if raw.startswith(BATCH_PREFIX):
        return _batch(raw)
    if raw.startswith(MESSAGE_PREFIX):
        return wire.to_envelope(raw)
    return Envelope.decode(raw)


def decode_body(envelope: Envelope, accept: Any) -> Any:
    """The body of a stored message decoded as a worker decodes it: decompressed (the ``compression``
    header), then deserialized with ``accept``. :class:`EnvelopeError` says why a body cannot be; every
    codec fails in its own way (``zlib.error``, ``OSError``, an unknown codec's ``KeyError``, ...)."""
    try:
        body = envelope.body
        if envelope.headers.get("compression"):
            body = decompress(body, envelope.headers["compression"])
        return loads(body, envelope.content_type, envelope.content_encoding, accept=accept)
    except Exception as exc:
        raise EnvelopeError(f"undecodable {envelope.content_type} body: {exc!r}") from exc


def encode_stored(
    app: Celery, layout: wire.BrokerLayout | None, envelope: Envelope
) -> tuple[bytes, wire.Template | None]:
    """The payload a call built by Celery is stored as: a broker message when ``layout`` (the broker is a
    Redis) and kombu would route it without the broker's help, with its :class:`~wire.Template`; else
    an envelope. Headers or options that cannot be stored are a :class:`PayloadError`."""
    try:
        fast = wire.Template.of(app, layout, envelope) if layout is not None else None
        return (fast.render() if fast is not None else envelope.encode()), fast
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"cannot store the message of {envelope.task}: its headers or options are not JSON-serializable "
            f"({exc}); nothing was stored"
        ) from exc


def _batch(raw: bytes) -> BatchCall:
    try:
        data = json.loads(raw)
        group, items = data["group"], data["items"]
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError) as exc:
        raise EnvelopeError(f"malformed celery-redisdelay batch ({exc!r})") from exc
    if not isinstance(group, list) or len(group) != 2:
        raise EnvelopeError(f"malformed celery-redisdelay batch (group {group!r} is not [task, key])")
    task, key = group
    if not isinstance(task, str) or not isinstance(key, str) or not isinstance(items, list):
        raise EnvelopeError("malformed celery-redisdelay batch (group or items of the wrong type)")
    return BatchCall(task, key, items)
