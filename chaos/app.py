"""The Celery app of the chaos run, in the runner and in every worker, beat and releaser it starts.

Configured from the environment, which ``python -m chaos`` sets for every process it starts:

``REDISDELAY_CHAOS_URL``
    ``redis://host:port`` without a database; the broker and the call store use database 0.
``REDISDELAY_CHAOS_SHARDS``
    ``redisdelay_shards`` (1 by default).
``REDISDELAY_CHAOS_EVENTS``
    A directory: each worker process appends one JSON line per start and end of a validation
    consumer run to ``events-<pid>.jsonl`` there (local files, so a Redis fault cannot lose them).
    The runner reads them to explain duplicates and missing messages.

The beat tick goes to a queue of its own (``chaos-tick``, consumed by the same workers), as the
README advises, so ticks do not wait behind the validation's backlog in ``chaos``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery, signals
from kombu import Exchange, Queue

from celery_redisdelay import RedisDelay
from celery_redisdelay.validation import CONSUMER_TASK

from .config import (
    BROKER_VISIBILITY_TIMEOUT,
    CLAIM_TIMEOUT,
    ENV_EVENTS,
    ENV_SHARDS,
    ENV_URL,
    KEY_PREFIX,
    QUEUE,
    RESTORE_INTERVAL,
    TICK_INTERVAL,
    TICK_QUEUE,
)

URL = os.environ.get(ENV_URL, "redis://127.0.0.1:6379")

app = Celery("chaos", broker=f"{URL}/0", set_as_current=True)
app.conf.update(
    redisdelay_url=f"{URL}/0",
    redisdelay_key_prefix=KEY_PREFIX,
    redisdelay_shards=int(os.environ.get(ENV_SHARDS) or 1),
    redisdelay_tick_interval=TICK_INTERVAL,
    redisdelay_claim_timeout=CLAIM_TIMEOUT,
    broker_transport_options={
        "visibility_timeout": BROKER_VISIBILITY_TIMEOUT,
        # kombu scans for such messages every interval * throttle seconds (10 * 10 by default).
        "unacked_restore_interval": RESTORE_INTERVAL,
        "unacked_restore_throttle": 1,
    },
    task_default_queue=QUEUE,
    task_queues=[Queue(name, Exchange(name), routing_key=name) for name in (QUEUE, TICK_QUEUE)],
    task_routes={"redisdelay.tick": {"queue": TICK_QUEUE}},
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,  # keep reconnecting across Redis restarts
)
rd = RedisDelay(app)


class EventLog:
    """Appends JSON lines to ``events-<pid>.jsonl`` in ``directory``; opened lazily in each process."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._pid = 0

    def write(self, **event: Any) -> None:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:  # a forked pool child gets a file of its own
            path = os.path.join(self.directory, f"events-{pid}.jsonl")
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._pid = pid
        event.update(t=round(time.time(), 4), pid=pid, pg=os.getpgid(0))
        os.write(self._fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())


def _connect_event_log(directory: str) -> None:
    log = EventLog(directory)

    # Connected after RedisDelay(app): "start" is written after the package marked the call started,
    # "end" after its acknowledgement (attempted, or skipped for Abandon).
    def on_prerun(sender: Any = None, task_id: str | None = None, args: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) == CONSUMER_TASK and args:
            log.write(e="start", id=task_id, run=args[0], n=args[1])

    def on_postrun(
        sender: Any = None, task_id: str | None = None, state: str | None = None, retval: Any = None, **_: Any
    ) -> None:
        if getattr(sender, "name", None) == CONSUMER_TASK:
            detail = repr(retval)[:200] if isinstance(retval, BaseException) else None
            log.write(e="end", id=task_id, state=state, exc=detail)

    signals.task_prerun.connect(on_prerun, weak=False)
    signals.task_postrun.connect(on_postrun, weak=False)


if os.environ.get(ENV_EVENTS):
    _connect_event_log(os.environ[ENV_EVENTS])
