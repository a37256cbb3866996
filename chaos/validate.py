"""The validation of seed 001 under faults: ``count`` messages parked at once, every one must be processed.

``run_validation`` parks the messages through the runner (:meth:`chaos.run.Run.park`, so every
acknowledged park is in the ledger) and polls until every message is processed. When messages are
missing and nothing is left that could deliver them (no call parked or in flight, no message queued
or held by a worker: ``chaos/harness/settle.py``) for :data:`SETTLE_SECONDS`, the validation is ended early
instead of waiting for its deadline.
"""

from __future__ import annotations

import time

from celery_redisdelay import RedisDelay, ValidationReport, run_validation
from celery_redisdelay.operations.validation import collect_report

from .faults import Progress
from .harness.console import say
from .harness.settle import Settling
from .run import Run

FAIL_EVERY = 2
PROGRESS_EVERY = 10.0
#: End the validation early when messages are missing and for this long nothing could deliver them.
SETTLE_SECONDS = 10.0


class Settled(Exception):
    """Raised from the progress callback to end ``run_validation`` when nothing can change any more."""


class Watch:
    """The validation's progress callback: reports progress, ends the run once it has settled."""

    def __init__(self, run: Run, progress: Progress) -> None:
        self.run = run
        self.progress = progress
        self._last_said = 0.0
        self._last_settle_check = 0.0
        self._settling = Settling(SETTLE_SECONDS)

    def __call__(self, done: int, total: int) -> None:
        self.progress.on_processed(done, total)
        now = time.monotonic()
        if done < total and now - self._last_settle_check >= 1.0:
            self._last_settle_check = now
            if self._settling.see(self.run.settled(), now):
                raise Settled(f"{total - done} messages missing and nothing left that could deliver them")
        if now - self._last_said >= PROGRESS_EVERY:
            self._last_said = now
            say(f"processed {done:,}/{total:,}{self.run.broker_backlog()}")


def validate(run: Run, rd: RedisDelay) -> tuple[ValidationReport, bool]:
    """Run the validation with the faults: (report, whether it was ended early)."""
    args = run.args
    progress = Progress(args.count)
    run.start_faults(progress)
    planned = ", ".join(f"{fault.kind}@{fault.at:.3f}" for fault in run.faults) or "none"
    say(f"validating {args.count:,} messages; faults planned (seed {run.seed}, at points of progress): {planned}")
    try:
        report = run_validation(
            rd,
            args.count,
            fail_every=FAIL_EVERY,
            timeout=args.timeout,
            queue_timeout=args.queue_timeout,
            deadline=args.deadline,
            progress=Watch(run, progress),
            park=run.park_validation,
        )
        return report, False
    except Settled as settled:
        say(f"ending the validation early: {settled}")
        return report_from_store(run, rd, progress), True
    finally:
        run.stop_faults()


def report_from_store(run: Run, rd: RedisDelay, progress: Progress) -> ValidationReport:
    """The report ``run_validation`` would have made, after :class:`Settled` ended it early."""
    if run.run_id is None:
        raise RuntimeError("the validation settled before its run id was seen")
    dead = sum(int(rd.client.zcard(store.keys.dead)) for store in rd.shards.all())  # only the run's calls
    numbers = range(run.args.count)
    return collect_report(rd.depot, run.run_id, numbers, dead=dead, elapsed=progress.elapsed(), timed_out=False)
