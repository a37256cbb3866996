"""A producer that parks Celery's task message in Redis instead of publishing it.

``DelayedTask.apply_async`` hands this producer to Celery's own ``send_task``, so routing,
headers, links, parent ids, stamping and the ``before/after_task_publish`` signals all happen
exactly as for a normal task; only the final publish is replaced by the park script. Anything else
published through it (the call's task-sent event) goes to the real producer: the caller's, when it gave one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kombu import Exchange, Queue
from kombu.compression import compress
from kombu.exceptions import EncodeError
from kombu.serialization import dumps

from ..errors import PayloadError
from ..message.envelope import Envelope

# AMQP publish flags kombu takes as arguments and does not put in the message.
_DROPPED_PROPERTIES = ("mandatory", "immediate")


class ParkingProducer:
    """Stands in for a :class:`kombu.Producer` during one ``apply_async``."""

    def __init__(
        self,
        real: Any,
        task_id: str,
        park: Callable[[Envelope], tuple[int, str]],
        accept: frozenset[str] | None = None,
        eta: str | None = None,
    ) -> None:
        self._real = real
        self._task_id = task_id
        self._park = park
        self._accept = accept  # content types workers accept (None: anything)
        self._eta = eta  # the eta Celery would have given the call (its message has none)
        #: What the park script answered: (status, id of the call parked or kept).
        self.outcome: tuple[int, str] = (0, task_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def publish(self, body: Any, **kwargs: Any) -> None:
        headers = kwargs.get("headers") or {}
        if headers.get("id") == self._task_id:
            self.outcome = self._park(self.envelope(body, **kwargs))
            return
        if isinstance(body, dict) and body.get("type") == "task-sent" and body.get("uuid") == self._task_id:
            # The event tells the eta as Celery's would. Set in Celery's own event, which its dispatcher
            # buffers when this publish fails.
            body["eta"] = self._eta
        self._real.publish(body, **kwargs)

    def envelope(  # noqa: PLR0913 - the keyword arguments of kombu's Producer.publish, which Celery calls
        self,
        body: Any,
        *,
        headers: dict[str, Any],
        exchange: str | Exchange | None = None,
        routing_key: str | None = None,
        serializer: str | None = None,
        content_type: str | None = None,
        content_encoding: str | None = None,
        compression: str | None = None,
        declare: list[Any] | None = None,
        delivery_mode: int | None = None,
        retry_policy: dict[str, Any] | None = None,
        retry: bool | None = None,
        timeout: float | None = None,
        confirm_timeout: float | None = None,
        **properties: Any,
    ) -> Envelope:
        task = headers.get("task") or "?"
        if content_type is None:
            try:
                content_type, content_encoding, data = dumps(body, serializer=serializer)
            except EncodeError as exc:
                raise PayloadError(
                    f"cannot serialize the arguments of {task} with serializer {serializer!r}: {exc}; "
                    "pass arguments that serializer can encode (or change task_serializer), nothing was stored"
                ) from exc
            if self._accept is not None and content_type not in self._accept:
                raise PayloadError(
                    f"{task} would be serialized as {content_type!r} (serializer {serializer!r}), which the "
                    f"app's accept_content does not allow, so no worker would run it; add it to accept_content "
                    "or use an accepted serializer; nothing was stored"
                )
        elif isinstance(body, str):
            content_encoding = content_encoding or "utf-8"
            data = body.encode(content_encoding)
        else:
            data, content_encoding = body, content_encoding or "binary"
        raw = data.encode(content_encoding or "utf-8") if isinstance(data, str) else bytes(data)
        headers = dict(headers)
        if compression:
            raw, headers["compression"] = compress(raw, compression)
        for name in _DROPPED_PROPERTIES:
            properties.pop(name, None)
        return Envelope(
            task=task,
            body=raw,
            content_type=content_type,
            content_encoding=content_encoding or "binary",
            headers=headers,
            properties=properties,
            exchange=exchange.name if isinstance(exchange, Exchange) else (exchange or ""),
            routing_key=routing_key or "",
            queues=[q.name for q in declare or () if isinstance(q, Queue)],
            delivery_mode=delivery_mode,
            retry=True if retry is None else bool(retry),
            retry_policy=retry_policy,
        )
