"""``task.park_many``: park many calls of one task with the same options, fast.

Celery builds the first call's message as usual (routing, headers, options); every other call gets
a copy of it with its own id, arguments and argument repr, built without going through Celery's
``send_task`` again, and a thousand calls go to Redis in one script call. What is stored for each
call is what ``apply_async`` would have stored, except that Celery's ``before/after_task_publish``
signals are sent for the first call only.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from celery.result import AsyncResult
from celery.utils.saferepr import saferepr
from kombu.exceptions import EncodeError
from kombu.serialization import dumps, loads

from . import wire
from .envelope import Envelope
from .errors import PayloadError
from .store import CallStore, due_args

if TYPE_CHECKING:
    from .schedule import Due
    from .task import DelayedTask

#: Calls per script call.
CHUNK = 1000
#: Options that make each call depend on what is stored: those calls are parked one by one.
KEYED = ("unique_key", "debounce_key")


def park_many(
    task: DelayedTask, calls: Iterable[Sequence[Any]], kwargs: Any, options: dict[str, Any]
) -> list[AsyncResult]:
    """Park ``task(*args, **kwargs)`` for each ``args`` in ``calls``; see :meth:`DelayedTask.park_many`."""
    every = [tuple(args) for args in calls]
    if not every:
        return []
    rd = task.redisdelay
    one_by_one = task.lock is not None and rd.shards.count > 1  # each call goes beside its own lock
    if task.app.conf.task_always_eager or options.get("compression") or one_by_one or any(k in options for k in KEYED):
        return [task.apply_async(args, kwargs, **options) for args in every]
    # Each chunk of calls goes to one shard (one script call), the chunks in turns from a random one.
    stores = rd.shards.stores
    first_shard = random.randrange(len(stores))

    def store_of(index: int) -> CallStore:
        return stores[(first_shard + index // CHUNK) % len(stores)]

    first_id = rd.shards.new_id(store_of(0))
    captured: list[tuple[Envelope, Due, dict[str, Any]]] = []
    task.apply_async(every[0], kwargs, task_id=first_id, _redisdelay_capture=captured, **options)
    [(template, due, limits)] = captured
    _, body_kwargs, embed = loads(template.body, template.content_type, template.content_encoding, accept=None)
    serializer = options.get("serializer") or task.serializer or task.app.conf.task_serializer
    when = due_args(due.countdown_ms, due.at_ms)
    # Every message is built before anything is written: a call that cannot be serialized stores nothing.
    check_arguments = task.__header__ if task.typing else None  # Celery's own check of each call's arguments
    fast = wire.Template.of(task.app, rd.broker_layout, template) if rd.wire_format else None
    meta = CallStore.meta_json({**limits, "l": fast.key} if fast else limits)
    first = fast.render() if fast else template.encode()
    rd.check_size(template.task, len(first))
    flat: list[Any] = [first_id, first, meta]
    given_repr = options.get("argsrepr")  # the caller's (say, to keep secrets out of logs) holds for every call
    for index, args in enumerate(every[1:], start=1):
        if check_arguments is not None:
            check_arguments(*args, **(kwargs or {}))
        call_id = rd.shards.new_id(store_of(index))
        body = _body(template, args, body_kwargs, embed, serializer)
        shown = given_repr if given_repr is not None else argsrepr(task.app, args)
        if fast is not None:
            stored = fast.render(call_id, body, shown)
        else:
            stored = _copy(template, first_id, call_id, body, shown).encode()
        rd.check_size(template.task, len(stored))
        flat.extend((call_id, stored, meta))
    for start in range(0, len(flat), 3 * CHUNK):
        store_of(start // 3).park_many(flat[start : start + 3 * CHUNK], when)
    return [task.AsyncResult(flat[i]) for i in range(0, len(flat), 3)]


def argsrepr(app: Any, args: tuple[Any, ...]) -> str:
    """Celery's ``argsrepr`` header of a call, computed as ``app.amqp`` computes it."""
    levels = app.conf.get("task_repr_maxlevels") or 3  # a setting of Celery 5.7; 3 before, as saferepr's default
    return str(saferepr(args, app.amqp.argsrepr_maxsize, maxlevels=levels))


def _body(template: Envelope, args: tuple[Any, ...], kwargs: Any, embed: Any, serializer: str) -> bytes:
    try:
        _, _, body = dumps((args, kwargs, embed), serializer=serializer)
    except EncodeError as exc:
        raise PayloadError(
            f"cannot serialize the arguments {args!r} of {template.task} with serializer {serializer!r}: {exc}; "
            "none of the calls was parked"
        ) from exc
    return body if isinstance(body, bytes) else body.encode()


def _copy(template: Envelope, first_id: str, call_id: str, body: bytes, shown: str) -> Envelope:
    """The envelope of another call like ``template``, for the kombu path."""
    headers = {**template.headers, "id": call_id, "argsrepr": shown}
    if headers.get("root_id") == first_id:
        headers["root_id"] = call_id
    properties = dict(template.properties)
    if properties.get("correlation_id") == first_id:
        properties["correlation_id"] = call_id
    return replace(template, body=body, headers=headers, properties=properties)
