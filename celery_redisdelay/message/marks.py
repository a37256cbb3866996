"""How a worker tells a delivery of a parked call from a call Celery sent itself, without asking Redis.

Every delivery the store makes says so: one pushed as the stored broker message (the release script, the
pipeline) has the delivery tag ``<id>.<delivery>``, and one published through kombu or ``send_task`` carries
the header :data:`PARKED_HEADER`; kombu's restore keeps both. A run of a call that has neither was never
parked: the worker does not track it, and makes no Redis call for it.

A parked call's message carries no ``eta`` (it is due when it reaches the worker, which must not hold it on
its timer), but the eta Celery wrote in it, kept in :data:`ETA_HEADER`. Both headers are taken out of the
task's request before it runs, and that eta put back as ``request.eta`` (:func:`drop_mark`): the task sees
what Celery would have given it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The header a delivery published through kombu carries (the stored message's own tag says it otherwise).
PARKED_HEADER = "x-redisdelay-parked"
#: The eta Celery wrote in a parked call's message (its ISO 8601 text), kept out of the ``eta`` header.
ETA_HEADER = "x-redisdelay-eta"
#: Which delivery of the call a message published through kombu is. A header of our own, not only
#: ``x-delivery-count``: RabbitMQ's quorum queues write that one themselves (from 0 on a first delivery in 3.10 and
#: 3.11, rabbitmq-server#7732), over what the release wrote.
DELIVERY_HEADER = "x-redisdelay-delivery"
#: When the release published the message (milliseconds since the epoch, the store's clock): a first delivery that
#: waited in a broker queue the store cannot take it back from may have been delivered again since (see
#: :func:`possibly_superseded`).
RELEASED_HEADER = "x-redisdelay-released"
_MARKS = (PARKED_HEADER, ETA_HEADER, DELIVERY_HEADER, RELEASED_HEADER)
#: The attribute of a running task's request that keeps its delivery's number once the marks are dropped.
DELIVERY_ATTRIBUTE = "redisdelay_delivery"


def delivered_from_store(call_id: str, delivery_tag: Any, headers: Mapping[str, Any] | None) -> bool:
    """Whether a message with this delivery tag and these headers is a delivery of the parked call ``call_id``."""
    prefix, dot, number = str(delivery_tag or "").rpartition(".")
    if dot and prefix == call_id and number.isdigit():
        return True
    return bool(headers and headers.get(PARKED_HEADER))


def delivery_number(call_id: str, delivery_tag: Any, headers: Mapping[str, Any] | None) -> int | None:
    """Which delivery of the parked call ``call_id`` a message is: its tag's ``<n>``, or for one published
    through kombu its :data:`DELIVERY_HEADER`, else (a message released before 0.6) 1 + its ``x-delivery-count``
    header (the deliveries before it); None when it is none."""
    prefix, dot, number = str(delivery_tag or "").rpartition(".")
    if dot and prefix == call_id and number.isdigit():
        return int(number)
    if not (headers and headers.get(PARKED_HEADER)):
        return None
    own = headers.get(DELIVERY_HEADER)
    if isinstance(own, int) and not isinstance(own, bool) and own >= 1:
        return own
    earlier = headers.get("x-delivery-count") or 0
    return 1 + earlier if isinstance(earlier, int) and earlier >= 0 else None


def strip_marks(headers: Mapping[str, Any]) -> dict[str, Any]:
    """A message's headers without the marks of this module: Celery's own message again (a drained call)."""
    return {name: value for name, value in headers.items() if name not in _MARKS}


def redelivered(message: Any) -> bool:
    """Whether a received message says it was delivered before: kombu's restore and a broker's requeue set
    ``delivery_info['redelivered']`` (kombu's Redis transport the header too), as the store's redeliveries do."""
    info = getattr(message, "delivery_info", None) or {}
    headers = getattr(message, "headers", None) or {}
    return bool(info.get("redelivered") or headers.get("redelivered"))


def possibly_superseded(headers: Mapping[str, Any] | None, now_ms: int, after_ms: int) -> bool:
    """Whether a first delivery published through kombu is old enough that the sweep may have delivered its call
    again meanwhile: it was released more than ``after_ms`` ago (see :func:`superseded_after_ms`). On the store's own
    Redis the sweep takes the old message out of its list; a broker such as RabbitMQ keeps it."""
    released = (headers or {}).get(RELEASED_HEADER)
    if not isinstance(released, int) or isinstance(released, bool):
        return False
    return now_ms - released > after_ms


def superseded_after_ms(queue_timeout: float, lease: float, amqp_broker: bool, claim_timeout: float = 0) -> int:
    """How long after its release a first delivery may have been superseded (ms): the sweep delivers again a call
    whose message waited its whole queue timeout. On an AMQP broker, where each publish is a round trip of its own
    and the store hears of it after, also a call whose publish the broker left in doubt, once a lease ran out, and
    a call whose claim ran out before its releaser recorded the publish (a stalled releaser): in both the broker may
    have kept the first copy (see ``Releaser._publish_confirmed``). Half of each leaves room for clocks that
    differ."""
    after_ms = round(queue_timeout * 1000) // 2
    if amqp_broker:
        for bound in (lease, claim_timeout):
            if bound > 0:
                after_ms = min(after_ms, round(bound * 1000) // 2)
    return after_ms


def request_from_store(request: Any) -> bool:
    """:func:`delivered_from_store` for a running task's ``self.request`` (a pool process's view)."""
    properties = getattr(request, "properties", None) or {}
    return delivered_from_store(
        str(request.id), properties.get("delivery_tag"), {PARKED_HEADER: request.get(PARKED_HEADER)}
    )


def request_delivery(request: Any) -> int | None:
    """:func:`delivery_number` for a running task's ``self.request`` (a pool process's view), kept by
    :func:`drop_mark` once the marks are taken out."""
    kept = request.__dict__.get(DELIVERY_ATTRIBUTE)
    if isinstance(kept, int):
        return kept
    properties = getattr(request, "properties", None) or {}
    headers = {
        PARKED_HEADER: request.get(PARKED_HEADER),
        DELIVERY_HEADER: request.get(DELIVERY_HEADER),
        "x-delivery-count": request.get("x-delivery-count"),
    }
    return delivery_number(str(request.id), properties.get("delivery_tag"), headers)


def received_from_store(request: Any) -> bool:
    """:func:`delivered_from_store` for a request the worker's main process received."""
    message = getattr(request, "message", None)
    return delivered_from_store(
        str(request.id), getattr(message, "delivery_tag", None), getattr(message, "headers", None)
    )


def drop_mark(request: Any) -> None:
    """Take :data:`PARKED_HEADER` and :data:`ETA_HEADER` out of a running task's ``self.request``, so that the
    task sees the request Celery would have given it: the call's eta as ``request.eta``, its custom headers
    (``None`` when none is left). The delivery's number stays, as :data:`DELIVERY_ATTRIBUTE` (a lock asks for it)."""
    number = request_delivery(request)
    if number is not None:
        request.__dict__[DELIVERY_ATTRIBUTE] = number
    for mark in (PARKED_HEADER, DELIVERY_HEADER, RELEASED_HEADER):
        request.__dict__.pop(mark, None)
    headers = getattr(request, "headers", None)
    eta = request.__dict__.pop(ETA_HEADER, None)
    if eta is None and isinstance(headers, dict):
        eta = headers.get(ETA_HEADER)
    if eta is not None:
        request.eta = eta
    if isinstance(headers, dict) and any(mark in headers for mark in _MARKS):
        request.headers = strip_marks(headers) or None
