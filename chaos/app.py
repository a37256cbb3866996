"""The Celery app of the chaos run, in the runner and in every worker, beat and releaser it starts.

Configured from the environment, which ``python -m chaos`` sets for every process it starts:

``REDISDELAY_CHAOS_URL``
    The store's URL (``redis://host:port/0``); empty when the store follows a ``sentinel://`` broker.
``REDISDELAY_CHAOS_BROKER_URL``
    The broker's URL: the store's Redis unless the broker runs apart, or kombu's
    ``sentinel://...;sentinel://...`` URL of a Sentinel group.
``REDISDELAY_CHAOS_MASTER_NAME``
    kombu's ``master_name`` with a ``sentinel://`` broker.
``REDISDELAY_CHAOS_WAIT_REPLICAS``
    ``redisdelay_wait_replicas`` (0 by default).
``REDISDELAY_CHAOS_SHARDS``
    ``redisdelay_shards`` (1 by default).
``REDISDELAY_CHAOS_PRECISE_IN_WORKER``
    ``1``: the workers run the precise releaser in a thread too (``redisdelay_precise_release``).
``REDISDELAY_CHAOS_MAX_TASKS_PER_CHILD``
    ``worker_max_tasks_per_child``: each pool process is replaced after this many tasks (0: never).
``REDISDELAY_CHAOS_QUEUE_TIMEOUT``
    ``redisdelay_queue_timeout`` (the app default when not set): the runner's ``--queue-timeout``.
``REDISDELAY_CHAOS_EVENTS``
    A directory: each worker process appends one JSON line per start and end of a run of the
    validation consumer (and of the soak's locked and batched tasks) to ``events-<pid>.jsonl`` there
    (local files, so a Redis fault cannot lose them: the ledger's :class:`chaos.harness.ledger.EventLog`).
    The runner reads them to explain duplicates and missing messages.

The beat tick goes to a queue of its own (``chaos-tick``, consumed by the same workers), as the
README advises, so ticks do not wait behind the validation's backlog in ``chaos``.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals
from kombu import Exchange, Queue

from celery_redisdelay import RedisDelay
from celery_redisdelay.errors import Deferred
from celery_redisdelay.operations.validation import CONSUMER_MAX_DELIVERIES, CONSUMER_TASK, consume_message

from .config import (
    BATCH_MAX_WAIT,
    BATCH_SIZE,
    BATCH_TASK,
    BROKER_VISIBILITY_TIMEOUT,
    CLAIM_TIMEOUT,
    ENV_BROKER_URL,
    ENV_EVENTS,
    ENV_MASTER_NAME,
    ENV_MAX_TASKS_PER_CHILD,
    ENV_PRECISE_IN_WORKER,
    ENV_QUEUE_TIMEOUT,
    ENV_SHARDS,
    ENV_URL,
    ENV_WAIT_REPLICAS,
    KEY_PREFIX,
    LOCK_RETRY,
    LOCK_TIMEOUT,
    LOCKED_TASK,
    QUEUE,
    RESTORE_INTERVAL,
    TICK_INTERVAL,
    TICK_QUEUE,
)
from .harness.ledger import EventLog

STORE_URL = os.environ.get(ENV_URL, "redis://127.0.0.1:6379/0")
BROKER_URL = os.environ.get(ENV_BROKER_URL) or STORE_URL
MASTER_NAME = os.environ.get(ENV_MASTER_NAME) or None

transport_options: dict[str, Any] = {
    "visibility_timeout": BROKER_VISIBILITY_TIMEOUT,
    # kombu scans for such messages every interval * throttle seconds (10 * 10 by default).
    "unacked_restore_interval": RESTORE_INTERVAL,
    "unacked_restore_throttle": 1,
}
if MASTER_NAME:
    transport_options["master_name"] = MASTER_NAME

app = Celery("chaos", broker=BROKER_URL, set_as_current=True)
app.conf.update(
    redisdelay_key_prefix=KEY_PREFIX,
    redisdelay_shards=int(os.environ.get(ENV_SHARDS) or 1),
    redisdelay_wait_replicas=int(os.environ.get(ENV_WAIT_REPLICAS) or 0),
    redisdelay_tick_interval=TICK_INTERVAL,
    redisdelay_claim_timeout=CLAIM_TIMEOUT,
    broker_transport_options=transport_options,
    task_default_queue=QUEUE,
    task_queues=[Queue(name, Exchange(name), routing_key=name) for name in (QUEUE, TICK_QUEUE)],
    task_routes={"redisdelay.tick": {"queue": TICK_QUEUE}},
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,  # keep reconnecting across Redis restarts
    redisdelay_precise_release=os.environ.get(ENV_PRECISE_IN_WORKER) == "1",
    worker_max_tasks_per_child=int(os.environ.get(ENV_MAX_TASKS_PER_CHILD) or 0) or None,
    redisdelay_queue_timeout=float(os.environ.get(ENV_QUEUE_TIMEOUT) or 0) or None,
)
if STORE_URL:  # else the store follows the sentinel:// broker
    app.conf.redisdelay_url = STORE_URL
rd = RedisDelay(app)


@rd.delayed(
    name=LOCKED_TASK,
    lock="chaos:{slot}",
    lock_timeout=LOCK_TIMEOUT,
    lock_retry=LOCK_RETRY,
    max_deliveries=CONSUMER_MAX_DELIVERIES,
    ignore_result=True,
)
def locked(run_id: str, number: int, fail_every: int, slot: int) -> None:
    """The validation consumer under one of a few locks: calls that find it busy are deferred."""
    consume_message(rd.depot, run_id, number, fail_every)


@rd.batched(
    name=BATCH_TASK,
    size=BATCH_SIZE,
    max_wait=BATCH_MAX_WAIT,
    max_deliveries=CONSUMER_MAX_DELIVERIES,
    ignore_result=True,
)
def batch(key: str, items: list[dict[str, Any]]) -> None:
    """Records every item of the batch as a message of its run (never failing on purpose)."""
    for item in items:
        consume_message(rd.depot, item["run"], int(item["n"]), 0)


def messages_of(name: str | None, args: Any) -> tuple[str, list[int]] | None:
    """(run id, message numbers) of a run of one of the chaos run's tasks, else None."""
    if not args:
        return None
    if name in (CONSUMER_TASK, LOCKED_TASK):
        return str(args[0]), [int(args[1])]
    if name == BATCH_TASK and len(args) > 1 and args[1]:
        return str(args[1][0]["run"]), [int(item["n"]) for item in args[1]]
    return None


def _connect_event_log(directory: str) -> None:
    log = EventLog(directory)
    runs: dict[str, bool] = {}  # task ids of runs logged in this process

    # Connected after RedisDelay(app): "start" is written after the package marked the call started,
    # "end" after its acknowledgement (attempted, or skipped for Abandon and a busy lock).
    def on_prerun(sender: Any = None, task_id: str | None = None, args: Any = None, **_: Any) -> None:
        found = messages_of(getattr(sender, "name", None), args)
        if found is not None and task_id is not None:
            runs[task_id] = True
            run_id, numbers = found
            log.write(e="start", id=task_id, run=run_id, n=numbers[0], items=numbers[1:] or None)

    def on_postrun(
        sender: Any = None, task_id: str | None = None, state: str | None = None, retval: Any = None, **_: Any
    ) -> None:
        if task_id is not None and runs.pop(task_id, False):
            detail = repr(retval)[:200] if isinstance(retval, BaseException) else None
            log.write(e="end", id=task_id, state="DEFERRED" if isinstance(retval, Deferred) else state, exc=detail)

    signals.task_prerun.connect(on_prerun, weak=False)
    signals.task_postrun.connect(on_postrun, weak=False)


if os.environ.get(ENV_EVENTS):
    _connect_event_log(os.environ[ENV_EVENTS])
