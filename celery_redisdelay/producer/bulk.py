"""``task.park_many``: park many calls of one task with the same options, fast.

Celery builds the first call's message as usual (routing, headers, options); the others are rendered
from it by a :class:`~celery_redisdelay.producer.templates.CallTemplate`, each with its own id, arguments and
argument repr, without going through Celery's ``send_task`` again, and a thousand calls go to Redis in
one script call. What is stored for each call is what ``apply_async`` would have stored, except that
Celery's ``before/after_task_publish`` signals are sent for the first call only, and the ``expires``
and ``eta`` instants of a countdown are computed once for all of them.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from celery.result import AsyncResult

from ..errors import PayloadError
from ..message.envelope import Envelope
from ..message.marks import ETA_HEADER
from ..store.calls import CallStore, due_args
from ..store.meta import Limits, meta_json, routed
from .templates import CallTemplate

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
    depot = task.depot
    app = task._get_app()
    if one_by_one(task, options):
        return [task.apply_async(args, kwargs, **options) for args in every]
    # Each chunk of calls goes to one shard (one script call), the chunks in turns from a random one.
    stores = depot.shards.stores
    first_shard = random.randrange(len(stores))

    def store_of(index: int) -> CallStore:
        return stores[(first_shard + index // CHUNK) % len(stores)]

    ids: list[str] = []
    for start in range(0, len(every), CHUNK):
        ids.extend(depot.shards.new_ids(min(CHUNK, len(every) - start), store_of(start)))
    captured: list[tuple[Envelope, Due, Limits]] = []
    task.apply_async(every[0], kwargs, task_id=ids[0], _redisdelay_capture=captured, **options)
    [(envelope, due, limits)] = captured
    first, fast = depot.encode(envelope)
    template = CallTemplate.of(
        app,
        envelope,
        first,
        fast,
        given=(every[0], kwargs),
        fixed_reprs=("argsrepr" in options, "kwargsrepr" in options),
        per_call_only=False,
    )
    if template is None:  # something a template cannot copy: each call through Celery
        return [task.apply_async(args, kwargs, **options) for args in every]
    depot.check_size(envelope.task, len(first))
    meta = meta_json(routed(limits, fast.key) if fast else limits)
    # Every message is built before anything is written: a call that cannot be serialized stores nothing.
    flat = rendered(task, template, every, kwargs or {}, ids, envelope, first)
    when = due_args(due.countdown_ms, due.at_ms)
    for start in range(0, len(flat), 2 * CHUNK):
        store_of(start // 2).park_many(flat[start : start + 2 * CHUNK], meta, when)
    ignored = bool(options.get("ignore_result", task.ignore_result))
    return [_result(app.AsyncResult(call_id, backend=task.backend, task_name=task.name), ignored) for call_id in ids]


def one_by_one(task: DelayedTask, options: dict[str, Any]) -> bool:
    """Whether ``park_many`` parks each call through ``apply_async``: in eager mode, for compressed calls, keyed ones
    (each depends on what is stored), a locked task's calls over several shards (each goes beside its own lock) and
    a limited task's (each with its own gate)."""
    app = task._get_app()
    locked_apart = task.lock is not None and task.depot.shards.count > 1
    per_call = locked_apart or task.task_limits is not None or any(k in options for k in KEYED)
    return bool(app.conf.task_always_eager or options.get("compression") or per_call)


def rendered(
    task: DelayedTask,
    template: CallTemplate,
    every: list[tuple[Any, ...]],
    kwargs: Any,
    ids: list[str],
    envelope: Envelope,
    first: bytes,
) -> list[Any]:
    """``[id, stored, id, stored, ...]`` of every call: the first as Celery built it (``first``, from ``envelope``),
    the others rendered from its ``template``, each checked as ``apply_async`` checks a call first."""
    depot = task.depot
    check_arguments = task.__header__ if task.typing else None  # Celery's own check of each call's arguments
    fitting = {len(every[0])}  # the first call went through Celery's apply_async, which checked it
    kwargsrepr, body_rest = template.kwargsrepr(kwargs), template.body_rest(kwargs)
    reply_to, eta = envelope.properties.get("reply_to"), envelope.headers.get(ETA_HEADER)
    flat: list[Any] = [ids[0], first]
    for index, args in enumerate(every[1:], start=1):
        if check_arguments is not None and len(args) not in fitting:
            # Celery's check looks at how many arguments there are and their names, not their values:
            # with the same kwargs, one call of each length tells for all.
            check_arguments(*args, **kwargs)
            fitting.add(len(args))
        if task.lock is not None:
            task.lock_name(args, kwargs)  # a lock its arguments cannot name is refused, as by apply_async
        call_id = ids[index]
        try:
            stored = template.render(call_id, args, kwargs, reply_to, kwargsrepr, body_rest, eta)
        except PayloadError as exc:
            raise PayloadError(f"call {index} of park_many: {exc}; none of the calls was parked") from exc
        depot.check_size(envelope.task, len(stored))
        flat.extend((call_id, stored))
    return flat


def _result(result: AsyncResult, ignored: bool) -> AsyncResult:
    result.ignored = ignored
    return result
