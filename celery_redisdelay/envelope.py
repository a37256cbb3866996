"""The stored form of a parked call: the broker message Celery built, minus its eta.

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
    delivery_mode: int | None = None
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
        """Parse a stored envelope; raise :class:`EnvelopeError` saying what is wrong with it."""
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
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
        if not isinstance(envelope.headers, dict) or not isinstance(envelope.task, str):
            raise EnvelopeError("malformed celery-redisdelay envelope (headers or task name)")
        return envelope
