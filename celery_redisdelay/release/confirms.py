"""Releasing to an AMQP broker (RabbitMQ) on the broker's word: publisher confirms and returned messages.

AMQP's ``basic.publish`` returns before the broker has looked at the message. Without more, "released" would mean
"written to a socket": a message the broker then refuses (a missing exchange closes the channel, 404) or routes
nowhere (no queue bound for its routing key) would be gone while the store counts it delivered, and come back
only after the queue timeout, again and again, until it is dead-lettered for its deliveries.

On an AMQP broker the release therefore publishes on a connection of its own with publisher confirms
(``confirm_publish``) and the ``mandatory`` flag:

- a call counts as released (:meth:`CallStore.confirm`) only once the broker confirmed it;
- a call the broker refuses for what the call itself asks (:data:`REFUSALS`: no such exchange, unroutable, not
  allowed, too large) is dead-lettered with the broker's reason, and the release of the others goes on, on a
  new channel where the refusal closed the old one;
- anything else the broker says (a ``nack``, a closed connection, a publish blocked past its confirm timeout,
  half the claim timeout, or less as the claim nears its end: see :meth:`~.releaser.Releaser._time_left`) is the
  broker failing: the calls not yet published go back to the store
  (:class:`~.releaser.Releaser`). The call whose confirm never came counts as delivered: the broker may hold it
  (a memory alarm blocks a publish, it does not refuse it), and another releaser must not publish it again as the
  same delivery once the claim times out; should it be lost (a restart), the sweep delivers it again within a
  lease, as a later delivery.

Each publish waits for its confirm: a round trip per call (bench ``release_rabbitmq`` measures what it costs against
Celery's own ``send_task`` to the same server).
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

from kombu import Producer

if TYPE_CHECKING:
    from celery import Celery

#: AMQP reply codes that refuse a message for what it asks, not the broker failing: 312 NO_ROUTE (returned),
#: 403 ACCESS_REFUSED, 404 NOT_FOUND (no such exchange), 406 PRECONDITION_FAILED (say, a message over the
#: broker's ``max_message_size``).
REFUSALS = frozenset({312, 403, 404, 406})


class CallRefused(Exception):
    """The broker refused one call (:data:`REFUSALS`); the message is its reason."""


def refusal(exc: BaseException) -> str | None:
    """The broker's reason, when ``exc`` is a refusal of the message rather than the broker failing."""
    code = getattr(exc, "reply_code", None) or getattr(exc, "code", None)
    if code not in REFUSALS:
        return None
    text = getattr(exc, "reply_text", None) or str(exc)
    return f"the broker refused it: {code} {text}"


class MandatoryProducer(Producer):  # type: ignore[misc]  # kombu is untyped
    """A producer whose every publish is ``mandatory`` (the broker returns what no queue takes), waits at most
    ``confirm_timeout`` seconds for the broker's confirm, and is never retried by kombu: a publish that timed out
    may still reach the queue (a blocked connection's frames wait in its socket), and kombu's retry would write
    the same delivery again on a new connection (the call's ``retry_policy`` then sent it up to four times). The
    release decides instead: it gives back the calls not sent, and counts the one in doubt as delivered (see
    :meth:`~.releaser.Releaser._publish_confirmed`)."""

    confirm_timeout: float | None = None

    def publish(self, body: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["mandatory"] = True
        kwargs["retry"] = False
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.confirm_timeout  # py-amqp waits this long for the confirm (kombu < 5.4 too)
        return super().publish(body, *args, **kwargs)


class ConfirmingPublisher:
    """A connection of its own with publisher confirms, and a producer on it that notes returned calls.

    Used as a context manager around one batch of publishes; :meth:`check` after each publish raises
    :class:`CallRefused` for a call the broker returned, and :meth:`renew` gives the producer a new channel after a
    refusal that closed the old one.
    """

    def __init__(self, app: Celery, confirm_timeout: float) -> None:
        self.app = app
        self.confirm_timeout = confirm_timeout
        self.connection: Any = None
        self.producer: Any = None
        self.returned: dict[str, str] = {}  # call id -> the broker's reason

    def __enter__(self) -> ConfirmingPublisher:
        self.connection = self.app.connection_for_write(transport_options={"confirm_publish": True})
        self.producer = MandatoryProducer(self.connection.default_channel, on_return=self._on_return)
        self.producer.confirm_timeout = self.confirm_timeout
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.connection is not None:
            if exc is None:
                self.connection.release()
            else:
                # Not a polite close: a broker that blocks publishers (its memory alarm) reads nothing more from
                # this connection, and would never answer it.
                self.connection.collect()
            self.connection = None

    def _on_return(self, exc: BaseException, exchange: str, routing_key: str, message: Any) -> None:
        headers = getattr(message, "headers", None) or {}
        call_id = headers.get("id")
        if isinstance(call_id, bytes):
            call_id = call_id.decode()
        if isinstance(call_id, str):
            reason = refusal(exc) or f"the broker returned it: {exc}"
            self.returned[call_id] = f"{reason} (exchange {exchange!r}, routing key {routing_key!r})"

    def check(self, call_id: str) -> None:
        """Raise :class:`CallRefused` if the broker returned the call just published."""
        reason = self.returned.pop(call_id, None)
        if reason is not None:
            raise CallRefused(reason)

    def renew(self) -> None:
        """A new channel for the producer: a refusal such as a missing exchange closed the one it had."""
        self.producer.revive(self.connection.channel())
