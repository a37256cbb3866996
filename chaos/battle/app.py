"""The battle's Celery app, in the runner and in every worker, beat and releaser it starts.

Plain ``@app.task`` tasks, as a project has them; with the extension (unless ``REDISDELAY_BATTLE_PLAIN`` is
``1``) the app sets ``redisdelay_all_tasks``, so their delayed calls and ``self.retry(countdown=...)`` are
parked, and two tasks use what only the extension offers: a keyed batch (``@rd.batched``) and a task under
a lock (``@rd.delayed(lock=...)``). Each task writes to the ledger (``chaos/harness/ledger.py``), a
redis-server of its own that no fault touches: the start of every run, and its end (after the body, before
Celery acknowledges it); a run with no body to be killed in (no sleep) writes both in one round trip, a batch
those of all its items.

Configured from the environment (``chaos/battle/config.py``): the store's and broker's URL, the ledger's,
kombu's ``visibility_timeout`` (``redisdelay_queue_timeout`` is twice it), ``redisdelay_lease``,
``redisdelay_skip_unacked`` False, ``redisdelay_track_due_now``, ``task_acks_late``, the batch.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime
from typing import Any

from celery import Celery, signals
from celery.exceptions import Retry
from kombu import Exchange, Queue

from celery_redisdelay import RedisDelay

from ..harness.ledger import RedisLedger, send_record
from .config import (
    BATCH_TASK,
    ENV_ACKS_LATE,
    ENV_BATCH,
    ENV_BROKER_URL,
    ENV_KOMBU_UNACKED,
    ENV_LEASE,
    ENV_LEDGER_URL,
    ENV_PLAIN,
    ENV_TRACK,
    ENV_URL,
    ENV_VISIBILITY,
    KEY_PREFIX,
    LOCK_RETRY,
    LOCK_TIMEOUT,
    LOCKED_TASK,
    QUEUE,
    RETRY_TASK,
    TICK_QUEUE,
    WORK_TASK,
)

URL = os.environ.get(ENV_URL, "redis://127.0.0.1:6379/0")
BROKER_URL = os.environ.get(ENV_BROKER_URL) or URL  # a RabbitMQ node (``--broker rabbitmq``), else the store's Redis
AMQP = BROKER_URL.startswith("amqp")
LEDGER_URL = os.environ.get(ENV_LEDGER_URL, "redis://127.0.0.1:6380/0")
PLAIN = os.environ.get(ENV_PLAIN) == "1"
VISIBILITY_TIMEOUT = float(os.environ.get(ENV_VISIBILITY) or 3600)
BATCH_SIZE, BATCH_MAX_WAIT = (float(part) for part in (os.environ.get(ENV_BATCH) or "10,5").split(","))

app = Celery("battle", broker=BROKER_URL, set_as_current=True)
app.conf.update(
    broker_transport_options={} if AMQP else {"visibility_timeout": VISIBILITY_TIMEOUT},
    task_default_queue=QUEUE,
    task_queues=[Queue(name, Exchange(name), routing_key=name) for name in (QUEUE, TICK_QUEUE)],
    task_routes={"redisdelay.tick": {"queue": TICK_QUEUE}},  # the README's advice: the tick on its own queue
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,  # keep reconnecting across Redis restarts
)

if os.environ.get(ENV_ACKS_LATE) == "1":
    app.conf.update(task_acks_late=True)

ledger = RedisLedger.from_url(LEDGER_URL, socket_timeout=30)


@app.task(name=WORK_TASK, bind=True)  # type: ignore[untyped-decorator]
def work(self: Any, n: int, sleep: float = 0.0) -> None:
    """A call: due now or with a countdown, sleeping ``sleep`` seconds or not."""
    unit = f"{n}.0"
    if not sleep:
        ledger.ran(self.request, [unit])
        return
    began = ledger.started(self.request, unit)
    time.sleep(sleep)
    ledger.ended(self.request, unit, began)


@app.task(name=RETRY_TASK, bind=True, max_retries=None)  # type: ignore[untyped-decorator]
def retrying(self: Any, n: int, countdown: float, retries: int, due: float | None = None) -> None:
    """A call that retries itself ``retries`` times, each ``countdown`` seconds later (``self.retry``).

    Each retry carries its own due time (``due``), and its run records it: a run of this attempt again (a
    duplicate a fault explains) sends the next attempt again, later, and the ledger may have only one of
    the two sends (a kill between the retry and its record), so a run is judged by the due time of the
    message it came from, not by the send the ledger kept."""
    attempt = int(self.request.retries)
    unit = f"{n}.{attempt}"
    ledger.ran(self.request, [unit], due)
    if attempt < retries:
        due = round(time.time() + countdown, 4)
        try:
            self.retry(args=(n, countdown, retries, due), eta=datetime.fromtimestamp(due, tz=UTC))
        except Retry:
            # The retry is sent (parked, or published with its eta): the ledger has its send now. Only the
            # first send the ledger hears of is kept, for the unit's lateness (see above for its earliness).
            path = "celery-eta" if PLAIN else "parked"
            record = send_record("retry", due, round(time.time(), 4), str(self.request.id), path)
            ledger.sent_first(f"{n}.{attempt + 1}", record)
            raise


rd: RedisDelay | None = None
if not PLAIN:
    app.conf.update(
        redisdelay_all_tasks=True,
        redisdelay_url=URL,
        redisdelay_key_prefix=KEY_PREFIX,
        # A message a worker popped and died with before kombu noted it comes back after this (the default
        # is twice kombu's visibility timeout and at least 2 hours): outlast kombu's own restore.
        redisdelay_queue_timeout=2 * VISIBILITY_TIMEOUT,
    )
    if os.environ.get(ENV_LEASE):
        lease = float(os.environ[ENV_LEASE])
        app.conf.update(redisdelay_lease=lease, redisdelay_lease_renewal=lease / 3)
    if os.environ.get(ENV_KOMBU_UNACKED) == "1":
        app.conf.update(redisdelay_skip_unacked=False)
    if os.environ.get(ENV_TRACK) in ("0", "1"):
        app.conf.update(redisdelay_track_due_now=os.environ[ENV_TRACK] == "1")
    rd = extension = RedisDelay(app)

    @extension.delayed(
        name=LOCKED_TASK, bind=True, lock="battle:{slot}", lock_timeout=LOCK_TIMEOUT, lock_retry=LOCK_RETRY
    )
    def locked(self: Any, n: int, slot: int, sleep: float) -> None:
        """A call under one of a few locks: a call that finds its lock busy is deferred, not run."""
        unit = f"{n}.0"
        began = ledger.started(self.request, unit)
        time.sleep(sleep)
        ledger.ended(self.request, unit, began)

    @extension.batched(name=BATCH_TASK, bind=True, size=int(BATCH_SIZE), max_wait=BATCH_MAX_WAIT)
    def batch(self: Any, key: str, items: list[dict[str, Any]]) -> None:
        """A keyed batch: every item is a unit of the ledger."""
        ledger.ran(self.request, [f"{int(item['n'])}.0" for item in items])


def units_of(name: str | None, args: Any, retries: int) -> list[str]:
    """The ledger's units a message of the battle carries."""
    if not args:
        return []
    if name == BATCH_TASK:
        return [f"{int(item['n'])}.0" for item in (args[1] if len(args) > 1 else [])]
    if name == RETRY_TASK:
        return [f"{int(args[0])}.{retries}"]
    if name in (WORK_TASK, LOCKED_TASK):
        return [f"{int(args[0])}.0"]
    return []


def _received(request: Any = None, **_: Any) -> None:
    """A message the worker received (prefetched): where a call was when its worker was killed."""
    try:
        retries = int((getattr(request, "request_dict", None) or {}).get("retries") or 0)
        units = units_of(getattr(request, "name", None), getattr(request, "args", None), retries)
    except (TypeError, ValueError, KeyError, IndexError):
        return
    if units:
        moment, hostname = round(time.time(), 4), str(getattr(request, "hostname", ""))
        ledger.received(units, moment, hostname)


def _quiet(**_: Any) -> None:
    # A line per task received and succeeded is most of a busy worker's work on two cores: keep warnings.
    for name in ("celery.app.trace", "celery.worker.strategy", "celery.worker.request"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _ready(sender: Any = None, **_: Any) -> None:
    hostname = getattr(sender, "hostname", None)
    if hostname:
        ledger.ready(str(hostname), round(time.time(), 4))


signals.after_setup_logger.connect(_quiet, weak=False)
signals.worker_ready.connect(_ready, weak=False)
signals.task_received.connect(_received, weak=False)
