"""Parking a call: through Celery's ``send_task`` with a producer that parks instead of publishing, or,
for a call like one parked before, rendered from its template without Celery.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..message.envelope import Envelope
from ..store.meta import CallMeta, Limits, meta_json, routed
from .kept import Kept, TemplateKey
from .parking_producer import ParkingProducer
from .schedule import Due
from .templates import CallTemplate

if TYPE_CHECKING:
    from ..store.depot import Depot
    from .kept import TemplateCache
    from .task import DelayedTask


@contextmanager
def parking_producer(
    depot: Depot,
    templates: TemplateCache,
    task_id: str,
    due: Due,
    meta: Limits,
    mode: str = "",
    key: str = "",
    capture: list[tuple[Envelope, Due, Limits]] | None = None,
    learn: TemplateKey | None = None,
    given: tuple[Any, Any] | None = None,
) -> Iterator[ParkingProducer]:
    """A producer for Celery's ``send_task`` that parks the message under ``task_id``.

    ``mode`` ``unique`` or ``debounce`` parks it under ``key`` (see :meth:`CallStore.park_keyed`);
    the producer's ``outcome`` then tells what the store did. With ``learn``, a template of the call
    is kept in ``templates`` under that key (see :mod:`celery_redisdelay.producer.templates`) for the calls like
    it; ``given``
    are the caller's args and kwargs it is checked with.
    """

    def park(envelope: Envelope) -> tuple[int, str]:
        if capture is not None:
            capture.append((envelope, due, meta))
            return 1, task_id
        encoded, fast = depot.encode(envelope)
        depot.check_size(envelope.task, len(encoded))
        # A broker message's metadata names the list the release script pushes it onto.
        stored_meta: Limits | CallMeta = routed(meta, fast.key) if fast else meta
        status, _, holder = depot.shards.home(task_id).park_keyed(
            task_id, encoded, stored_meta, countdown_ms=due.countdown_ms, due_ms=due.at_ms, mode=mode, key=key
        )
        if learn is not None:
            options = dict(learn.options)
            fixed = ("argsrepr" in options, "kwargsrepr" in options)
            template = CallTemplate.of(depot.app, envelope, encoded, fast, given=given, fixed_reprs=fixed)
            templates.keep(learn, template, stored_meta)
        return status, holder

    with depot.app.producer_or_acquire() as real:
        yield ParkingProducer(real, task_id, park, depot.accepted_content_types)


def park_from(
    depot: Depot, kept: Kept, task: DelayedTask, call_id: str, args: Any, kwargs: Any, due: Due, mode: str, key: str
) -> tuple[int, str]:
    """Park a call rendered from a kept template, without Celery: (status, id), as the parking
    producer's ``outcome``. The arguments are checked as Celery checks them first."""
    args, kwargs = args or (), kwargs or {}
    if not isinstance(args, list | tuple):
        raise TypeError("task args must be a list or tuple")
    if not isinstance(kwargs, Mapping):
        raise TypeError("task keyword arguments must be a mapping")
    if task.typing:
        task.__header__(*args, **kwargs)
    stored = kept.template.render(call_id, args, kwargs)
    depot.check_size(kept.template.task, len(stored))
    meta = meta_json(kept.meta, key) if mode else kept.stored_meta
    status, _, holder = depot.shards.home(call_id).park_keyed(
        call_id, stored, meta, countdown_ms=due.countdown_ms, due_ms=due.at_ms, mode=mode, key=key
    )
    return status, holder
