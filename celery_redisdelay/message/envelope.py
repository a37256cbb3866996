"""The stored form of a parked call: the broker message Celery built, minus its eta (kept for the running
task in a private header, :data:`~celery_redisdelay.message.marks.ETA_HEADER`).

Celery builds the message (headers, routing, serialized arguments) exactly as it would for the
broker; we keep it as it is and publish it unchanged when the call is due. The envelope is JSON so
an operator can read it (``redis-cli HGET``); a binary body (pickle, msgpack) is kept in base64.
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, field
from typing import Any

from kombu.utils import json

FORMAT_VERSION = 1


class EnvelopeError(ValueError):
    """Stored bytes that are not an envelope this version can publish."""


@dataclass(frozen=True)
class Envelope:
    """Everything needed to publish a call to the broker later."""

    task: str
    body: bytes
    content_type: str
    content_encoding: str
    headers: dict[str, Any]
    properties: dict[str, Any] = field(default_factory=dict)
    exchange: str = ""
    routing_key: str = ""
    queues: list[str] = field(default_factory=list)
    delivery_mode: int | str | None = None
    retry: bool = True
    retry_policy: dict[str, Any] | None = None

    def encode(self) -> bytes:
        fields = asdict(self)
        try:
            fields["body"], fields["body_encoding"] = self.body.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            fields["body"], fields["body_encoding"] = base64.b64encode(self.body).decode(), "base64"
        text: str = json.dumps({"v": FORMAT_VERSION, **fields})
        return text.encode()

    @classmethod
    def decode(cls, raw: bytes | str) -> Envelope:
        """Parse a stored envelope; raise :class:`EnvelopeError` saying what is wrong with it. (Any stored
        payload is read with :func:`celery_redisdelay.message.stored.decode_stored`.)"""
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise EnvelopeError(f"not a celery-redisdelay envelope (undecodable: {exc})") from exc
        if not isinstance(data, dict) or data.get("v") != FORMAT_VERSION:
            version = data.get("v") if isinstance(data, dict) else None
            raise EnvelopeError(f"not a celery-redisdelay envelope of format {FORMAT_VERSION} (found {version!r})")
        try:
            body_text = data.pop("body")
            body_encoding = data.pop("body_encoding")
            body = base64.b64decode(body_text) if body_encoding == "base64" else body_text.encode("utf-8")
            data.pop("v")
            envelope = cls(body=body, **data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise EnvelopeError(f"malformed celery-redisdelay envelope ({exc!r})") from exc
        envelope.check()
        return envelope

    def check(self) -> None:
        """Raise :class:`EnvelopeError` naming the first field whose type cannot be published."""
        expected: dict[str, tuple[type, ...]] = {
            "task": (str,),
            "headers": (dict,),
            "properties": (dict,),
            "exchange": (str,),
            "routing_key": (str,),
            "content_type": (str,),
            "content_encoding": (str,),
            "queues": (list,),
            "delivery_mode": (int, str, type(None)),
            "retry": (bool,),
            "retry_policy": (dict, type(None)),
        }
        for name, types in expected.items():
            if not isinstance(getattr(self, name), types):
                raise EnvelopeError(f"malformed celery-redisdelay envelope (field {name!r})")
        if not all(isinstance(queue, str) for queue in self.queues):
            raise EnvelopeError("malformed celery-redisdelay envelope (field 'queues')")
        if self.delivery_mode not in (None, 1, 2, "transient", "persistent"):
            raise EnvelopeError("malformed celery-redisdelay envelope (field 'delivery_mode')")
