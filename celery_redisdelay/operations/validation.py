"""The validation: N messages, a consumer that fails every other one, all N processed in the end; run
through the real path: park, release, fail, sweep, redeliver, ack.

``count`` messages are parked for a consumer task that fails every ``fail_every``-th delivery without
acknowledging it (it raises :class:`Abandon`); the sweep brings those back after ``timeout`` seconds.
The run ends when every message has been processed and none of its calls is left in the store, or at
the deadline. The report also counts duplicates (processed more than once), not only missing messages.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import Abandon, RedisDelayError
from ..store.base import RedisError
from ..store.census import pending
from ..store.depot import Depot, HoldsDepot, depot_of

CONSUMER_TASK = "redisdelay.validate_consumer"
VALIDATE_TASK = "redisdelay.validate"
#: Deliveries allowed to one validation message before it is dead-lettered; with fail-every-other a
#: message fails k times in a row with probability 2**-k, so this is never reached by chance.
CONSUMER_MAX_DELIVERIES = 64
logger = logging.getLogger(__name__)
POLL_SECONDS = 0.05


@dataclass
class ValidationReport:
    """The outcome of a validation run; ``ok`` when nothing is missing."""

    run_id: str
    expected: int
    processed: int
    missing: list[int] = field(default_factory=list)
    duplicates: list[int] = field(default_factory=list)
    deliveries: int = 0
    failures: int = 0
    dead: int = 0
    elapsed: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.missing

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def register_validation_tasks(depot: Depot, delayed: Callable[..., Callable[[Callable[..., Any]], Any]]) -> None:
    """Register ``redisdelay.validate`` and its consumer on ``depot``'s app; ``delayed`` is the decorator
    of the app's delayed tasks (``rd.delayed``)."""

    @delayed(name=CONSUMER_TASK, bind=True, ignore_result=True, max_deliveries=CONSUMER_MAX_DELIVERIES)
    def consume(self: Any, run_id: str, number: int, fail_every: int) -> None:
        consume_message(depot, run_id, number, fail_every)

    @depot.app.task(name=VALIDATE_TASK, shared=False)  # type: ignore[untyped-decorator]
    def validate(
        count: int = 1000, fail_every: int = 2, timeout: float = 5.0, deadline: float = 600.0
    ) -> dict[str, Any]:
        """Run a validation and return its report (needs a worker with a free slot for the consumer)."""
        return run_validation(depot, count, fail_every=fail_every, timeout=timeout, deadline=deadline).as_dict()


def consume_message(depot: Depot, run_id: str, number: int, fail_every: int) -> None:
    """One delivery of message ``number`` of validation ``run_id``: record it as processed, or fail every
    ``fail_every``-th delivery of the run on purpose (raising :class:`Abandon`, so it is delivered again).
    The consumer's body; other tasks of a chaos run record their messages with it too."""
    try:
        consumed = depot.store.validation_run(run_id).consume(number, fail_every)
    except RedisError as exc:
        # The record may not have been written: a failure here would be acknowledged (Celery does not
        # retry it) and the message lost to the check. Leave it in flight; the sweep delivers it again.
        raise Abandon(f"validation run {run_id}: could not record message {number}: {exc}") from exc
    if not consumed:
        raise Abandon(f"validation run {run_id}: failing delivery of message {number} on purpose")


def park_call(task: Any, args: tuple[Any, ...], options: dict[str, Any]) -> str:
    """How :func:`run_validation` parks a message unless told otherwise: ``task.apply_async``."""
    return str(task.apply_async(args, **options).id)


def run_validation(
    rd: Depot | HoldsDepot,
    count: int,
    *,
    fail_every: int = 2,
    timeout: float = 5.0,
    deadline: float = 600.0,
    queue_timeout: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    park: Callable[[Any, tuple[Any, ...], dict[str, Any]], str] = park_call,
) -> ValidationReport:
    """Park ``count`` messages for the consumer and wait (polling Redis) until all are done.

    ``rd`` is the app's extension, or its depot. Workers and a tick (beat, or another releaser)
    must be running against the same app. ``park(task,
    args, options)`` parks one message and returns its id (the chaos runner's records each park and
    retries the ones a failover did not confirm).
    """
    if count < 1:
        raise RedisDelayError(f"count must be at least 1, not {count}")
    if fail_every == 1 or fail_every < 0:
        raise RedisDelayError(f"fail_every must be 0 (never fail) or at least 2, not {fail_every}")
    depot = depot_of(rd)
    run_id = uuid.uuid4().hex[:12]
    record = depot.store.validation_run(run_id)
    consumer = depot.app.tasks[CONSUMER_TASK]
    # Calls released in bulk wait in the broker queue; give them longer than a run before sweeping.
    queue_timeout = queue_timeout if queue_timeout is not None else max(30.0, 6 * timeout)
    started = time.monotonic()
    options = {"visibility_timeout": timeout, "queue_timeout": queue_timeout}
    ids = [park(consumer, (run_id, number, fail_every), dict(options)) for number in range(count)]
    give_up = started + deadline
    timed_out = True
    while time.monotonic() < give_up:
        try:
            done = record.processed_count()
            finished = done >= count and not _pending(depot, ids)
        except RedisError as exc:
            # Redis restarting or failing over: the run goes on without us; look again.
            logger.warning("validation run %s: cannot read its progress (%s); retrying", run_id, exc)
            time.sleep(POLL_SECONDS)
            continue
        if progress is not None:
            progress(done, count)
        if finished:
            timed_out = False
            break
        time.sleep(POLL_SECONDS)
    elapsed = time.monotonic() - started
    dead = sum(
        score is not None
        for store in depot.shards.all()
        for start in range(0, len(ids), 1000)
        for score in store.registries.dead.scores(ids[start : start + 1000])
    )
    return collect_report(depot, run_id, range(count), dead=dead, elapsed=elapsed, timed_out=timed_out)


def collect_report(
    depot: Depot, run_id: str, numbers: Collection[int], *, dead: int, elapsed: float, timed_out: bool
) -> ValidationReport:
    """The report of run ``run_id``, whose messages are ``numbers``, from its record in Redis (then deleted)."""
    record = depot.store.validation_run(run_id)
    times, counters = record.results()
    record.forget()
    return ValidationReport(
        run_id=run_id,
        expected=len(numbers),
        processed=len(times),
        missing=[number for number in sorted(numbers) if number not in times],
        duplicates=sorted(number for number, n in times.items() if n > 1),
        deliveries=counters.get("deliveries", 0),
        failures=counters.get("failures", 0),
        dead=dead,
        elapsed=round(elapsed, 3),
        timed_out=timed_out,
    )


def _pending(depot: Depot, ids: list[str], chunk: int = 1000) -> bool:
    """Whether any of the run's calls is still delayed or in flight."""
    for store in depot.shards.all():
        for start in range(0, len(ids), chunk):
            if pending(store.registries, ids[start : start + chunk]):
                return True
    return False
