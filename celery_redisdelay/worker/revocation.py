"""Ending a parked call unrun as Celery ends a revoked task: the result REVOKED, a ``task-revoked`` event.

:func:`cancel_many` drops parked calls and records each so: ``rd.cancel``, the operator's cancel, and a
worker that hears a ``revoke`` broadcast all go through it.

A call that never reaches a worker (cancelled while parked, or dropped when a worker receives the
``revoke`` broadcast) is not discarded by any worker, so nothing would record it; these helpers do
what a Celery worker does when it discards a revoked message (``Request._announce_revoked``): mark
the result as revoked in the task's result backend, with the call's own request so a chord it
belongs to counts it, and send the ``task-revoked`` event when task events are on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from celery.app.task import Context

from ..errors import RedisDelayError
from ..message.envelope import EnvelopeError
from ..message.stored import BatchCall, decode_body, decode_stored
from ..store.shards import chunks, on_shards

if TYPE_CHECKING:
    from ..store.calls import CallStore, Cancelled
    from ..store.depot import Depot

logger = logging.getLogger(__name__)


def request_of(call_id: str, payload: bytes, accept: Any = None) -> Context:
    """The request a worker would build from a stored call's message: its headers, its embedded
    callbacks and chord, and its arguments (only the id and the task when the payload is unreadable)."""
    fields: dict[str, Any] = {"id": call_id}
    try:
        envelope = decode_stored(payload)
    except EnvelopeError:
        return Context(fields)
    if isinstance(envelope, BatchCall):
        fields.update(task=envelope.task, args=[envelope.key, envelope.items], kwargs={})
        return Context(fields)
    fields.update(envelope.headers)
    fields["id"] = call_id
    try:
        decoded = decode_body(envelope, accept)
    except EnvelopeError as exc:
        logger.debug("redisdelay: the arguments of call %s are not readable here: %r", call_id, exc)
        return Context(fields)
    if isinstance(decoded, list | tuple) and len(decoded) == 3:  # protocol 2: (args, kwargs, embed)
        args, kwargs, embed = decoded
        fields.update(embed or {}, args=args, kwargs=kwargs)
    return Context(fields)


def announce_revoked(
    depot: Depot, call_id: str, payload: bytes, reason: str = "revoked", dispatcher: Any = None
) -> None:
    """Record a parked call that was dropped unrun as Celery records a revoked task. ``dispatcher``: an
    event dispatcher to send ``task-revoked`` with (one for many calls), else the app's default one."""
    app = depot.app
    request = request_of(call_id, payload, depot.accepted_content_types)
    name = vars(request).get("task")
    task = app.tasks.get(name) if isinstance(name, str) else None
    # As a worker's Request: the message's ignore_result header, else the task's attribute.
    ignore_result = vars(request).get("ignore_result")
    if ignore_result is None:
        ignore_result = getattr(task, "ignore_result", False)
    store = not ignore_result or bool(getattr(task, "store_errors_even_if_ignored", False))
    backend = task.backend if task is not None else app.backend
    backend.mark_as_revoked(call_id, reason, request=request, store_result=store)
    if app.conf.worker_send_task_events and getattr(task, "send_events", True):
        with (
            contextlib.nullcontext(dispatcher) if dispatcher is not None else app.events.default_dispatcher() as sender
        ):
            sender.send("task-revoked", uuid=call_id, terminated=False, signum=None, expired=False)


def cancel_many(depot: Depot, task_ids: Sequence[str], *, take_over: bool = True) -> list[str]:
    """Drop the calls among ``task_ids`` that are still parked, 1,000 per script call, and record each
    as revoked (:func:`announce_revoked`); returns the ids cancelled (the others were not parked).

    A cancel sent again because its reply was lost (to a dropped connection: redis-py or the caller sends
    it once more) is answered as the first attempt would have been, and records the call revoked, which
    that attempt's caller could not: the store keeps each cancelled call's payload until its caller says it
    is recorded (for ten minutes at most). Once recorded, a cancel of it answers False like any other. Two
    callers cancelling one call at the same instant may both record it. Without ``take_over`` (the workers
    that all hear one ``revoke`` broadcast), only a call this cancel dropped is recorded and answered."""
    dropped: list[tuple[CallStore, Cancelled]] = []

    def cancel(store: CallStore, ids: list[str]) -> tuple[list[str], list[str]]:
        found = [call for call in store.cancel_many(ids, take_over=take_over) if call.record]
        dropped.extend((store, call) for call in found)
        return [call.id for call in found], []

    cancelled = on_shards(depot.shards, task_ids, cancel)[0]
    app, failed = depot.app, []
    recorded: dict[int, tuple[CallStore, list[str]]] = {}
    with contextlib.ExitStack() as stack:
        # One event dispatcher for the lot, where task-revoked events are sent at all.
        dispatcher = None
        if app.conf.worker_send_task_events and len(dropped) > 1:
            with contextlib.suppress(Exception):  # then each call tries on its own, and says if it fails
                dispatcher = stack.enter_context(app.events.default_dispatcher())
        for store, call in dropped:
            try:
                announce_revoked(depot, call.id, call.payload, dispatcher=dispatcher)
            except Exception as exc:  # noqa: BLE001 - every call is recorded that can be; then the error
                logger.warning("redisdelay: cancelled %s but could not record it revoked: %r", call.id, exc)
                failed.append(call.id)
            else:
                recorded.setdefault(id(store), (store, []))[1].append(call.id)
    for store, ids in recorded.values():
        try:
            for chunk in chunks(ids):
                store.cancel_done(chunk)
        except RedisDelayError as exc:  # a cancel sent again records them again; they expire anyway
            logger.warning("redisdelay: recorded %d cancelled call(s) revoked but could not say so: %s", len(ids), exc)
    if failed:
        raise RedisDelayError(
            f"{len(failed)} cancelled call(s) will not run, but their result could not be marked revoked "
            f"(the result backend failed): {', '.join(failed[:10])}"
        )
    return cancelled
