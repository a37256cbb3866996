"""The start of a run that must not run again is recorded when the pool accepts it, before Celery acknowledges.

A task whose runs are dead-lettered when cut short with their worker (:mod:`celery_redisdelay.worker.contract`)
needs the store to know that a run started, or a worker that dies right after would have its call run again on
another worker. Celery acknowledges such a task's message when its pool accepts the run (``Request.on_accepted``,
in the worker's main process under prefork, in the pool's thread under threads, solo, eventlet and gevent): from
then on plain Celery would not run it again. So the start is written there, before Celery's own acknowledgement,
in one round trip (the acknowledgement a store delivery no longer makes to kombu's bookkeeping,
``redisdelay_skip_unacked``, is one too). Should the store not answer, the start goes to the process's outbox,
which writes it when the store is back.

The hook is Celery's own for it: each such task's ``Request`` class (``Task.Request``) is replaced by a subclass
whose ``on_accepted`` records the start first. Runs of calls that never went through the store make no Redis call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery.utils.imports import symbol_by_name

from ..errors import RedisDelayError
from ..message.marks import received_from_store
from .contract import DEAD_LETTER, worker_lost

if TYPE_CHECKING:
    from ..store.depot import Depot

logger = logging.getLogger(__name__)

#: Set on the request classes made here, with the class they extend.
MARKER = "_redisdelay_accepting"


class StartOnAccept:
    """Records, at the pool's accept, the start of each run whose task dead-letters runs cut short."""

    def __init__(self, depot: Depot, owns: Callable[[Any], bool], worker: str) -> None:
        self.depot, self.owns, self.worker = depot, owns, worker

    def install(self, tasks: Any) -> int:
        """Give every task of ours whose contract is :data:`DEAD_LETTER` a request class that records the start
        of its runs at the accept; how many tasks it gave one. A task's bad ``redisdelay_worker_lost`` raises
        :class:`~celery_redisdelay.errors.ConfigurationError` here, so the worker does not start with it."""
        setting = self.depot.settings.worker_lost
        installed = 0
        for task in list(tasks.values()):
            if not self.owns(task) or worker_lost(task, setting) != DEAD_LETTER:
                continue
            base = symbol_by_name(task.Request)
            if getattr(base, MARKER, None) is self:
                continue  # a consumer that starts again
            original = getattr(base, MARKER + "_base", base)
            task.Request = self.request_class(original)
            installed += 1
        return installed

    def request_class(self, base: Any) -> type:
        """``base`` with an ``on_accepted`` that records the start first."""
        accepted = self.accepted

        def on_accepted(request: Any, pid: Any, time_accepted: float) -> None:
            accepted(request)
            base.on_accepted(request, pid, time_accepted)

        namespace = {"on_accepted": on_accepted, "__slots__": (), MARKER: self, MARKER + "_base": base}
        return type(base.__name__, (base,), namespace)

    def accepted(self, request: Any) -> None:
        """The pool accepted a run of ``request``: record its start if its call went through the store."""
        if not received_from_store(request):
            return
        call_id = str(request.id)
        settings = self.depot.settings
        run_ms, lease_ms = round(settings.visibility_timeout * 1000), round(settings.lease * 1000)
        worker = self.worker or str(getattr(request, "hostname", "") or "")
        entry = [("start-once", call_id)]
        try:
            self.depot.shards.first(call_id, lambda store: not store.track(entry, run_ms, lease_ms, worker))
        except RedisDelayError as exc:
            logger.warning("redisdelay: could not record the start of call %s now, the outbox will: %s", call_id, exc)
            self.depot.outbox.start(call_id, worker, once=True)
