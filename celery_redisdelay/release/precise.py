"""The precise releaser: releases each call the moment it is due, without polling.

It sleeps until the earliest parked call is due, blocked in ``BZPOPMIN`` on the store's ``wake``
markers, which the park script adds whenever a call is parked earlier than every other one (a
blocking wait instead of empty polling); so a new earlier call wakes it at once. The sleep is capped
(``longest_sleep``), a dropped connection is caught and retried (the server may close an idle blocked
connection), and any number of releasers may run beside each other and beside the beat tick, which
stays as the backstop: every release is one atomic script.

Run it as ``celery -A proj redisdelay releaser``, or inside each worker with ``redisdelay_precise_release =
True``. By default (the setting None) each worker runs one at a tick's pace instead (``chase`` False): it
wakes for a marker (a call parked earlier than every other, one releaser per marker) or every
``redisdelay_tick_interval``, releases what is due and sweeps, and does not sleep until the next due time,
which would wake every worker's releaser for every call that falls due. With ``redisdelay_shards``, one
releaser thread watches each shard (a blocking wait covers one key, and on a cluster one node).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import RedisDelayError
from ..store.base import RedisError
from ..store.connection import connect
from .releaser import Releasers, TickReport, broker_errors

if TYPE_CHECKING:
    from ..store.calls import CallStore

logger = logging.getLogger(__name__)

#: How long one release round may run before the releaser looks at the clock again.
ROUND_BUDGET_SECONDS = 1.0
#: How late Redis may end a blocking command's timeout (its default ``hz 10``).
SERVER_TIMER_SECONDS = 0.1
#: A release round starts at most this long after the one before: under a stream of calls parked due now, each
#: of which wakes the releaser, the calls parked meanwhile go out in one script instead of one script (and one
#: ``BZPOPMIN``) each, and none waits longer than this for it. In a worker, the releaser's thread shares the
#: process that consumes the messages.
ROUND_SPACING_SECONDS = 0.003


class PreciseReleaser:
    """Release due calls as they fall due; :meth:`run` loops until :meth:`stop`."""

    def __init__(
        self,
        releasers: Releasers,
        longest_sleep: float = 1.0,
        retry_after: float = 0.5,
        store: CallStore | None = None,
        stopping: threading.Event | None = None,
        round_spacing: float = ROUND_SPACING_SECONDS,
        chase: bool = True,
    ) -> None:
        depot = releasers.depot
        #: Whether it sleeps until the next call is due (a precise releaser), or only until a marker or
        #: ``longest_sleep`` (a tick's pace: what each worker runs by default, so that several do not all wake
        #: for every call that falls due).
        self.chase = chase
        self.depot, self.releasers = depot, releasers
        self.store = store or depot.store
        self.longest_sleep = longest_sleep
        self.retry_after = retry_after
        self.round_spacing = round_spacing
        self.stopping = stopping or threading.Event()
        # Its own connection: a blocked BZPOPMIN must not hold one the rest of the app needs.
        self.client = connect(depot.settings)
        #: The shard's structures through that connection.
        self.own = self.store.registries.on(self.client)
        self.released = 0
        self.rounds = 0  # release rounds that released a call
        with depot.app.producer_or_acquire() as producer:
            self.errors: tuple[type[BaseException], ...] = (
                RedisError,
                RedisDelayError,
                OSError,
                *broker_errors(producer),
            )

    def release_due(self) -> TickReport:
        """Flush due batch groups and release every due call (bounded by the round budget). On the fast path the
        release script says whether a batch group is due, so the groups are looked at only then."""
        report = TickReport()
        deadline = time.monotonic() + ROUND_BUDGET_SECONDS
        releaser = self.releasers.of(self.store)
        last = releaser.last_release
        if last is None or last.batch_due:
            releaser.flush_batches(report, deadline)
        releaser.release(report, deadline)
        self.released += report.released
        self.rounds += report.released > 0
        return report

    def seconds_to_next(self) -> float:
        """Seconds until the earliest parked call (or batch group) is due (0: due now), at most ``longest_sleep``:
        as the last release script said on the fast path, else asked of Redis."""
        last = self.releasers.of(self.store).last_release
        if last is not None:
            if last.batch_due:
                return 0.0
            if last.next_due_ms is None or not self.chase:
                return self.longest_sleep
            return min(max((last.next_due_ms - last.now_ms) / 1000, 0.0), self.longest_sleep)
        first, now_ms = self.own.delayed.first_and_clock()
        if first is None or not self.chase:
            return self.longest_sleep
        return min(max((first[1] - now_ms) / 1000, 0.0), self.longest_sleep)

    def sleep(self) -> None:
        """Block until the next call is due or an earlier one is parked.

        Redis checks the timeouts of blocked clients ``hz`` times a second (10 by default), so a
        ``BZPOPMIN`` timeout can end up to 100 ms late: the releaser blocks until shortly before the
        due time and sleeps the last stretch on its own clock.
        """
        wait = self.seconds_to_next()
        if wait <= 0:
            return
        if wait <= SERVER_TIMER_SECONDS:
            self.stopping.wait(wait)
        else:
            self.own.wake.wait(wait - SERVER_TIMER_SECONDS)

    def run(self) -> None:
        """Release and sleep until stopped; errors are logged and retried, never fatal."""
        sweep_every = self.depot.settings.tick_interval
        last_sweep = last_round = 0.0
        while not self.stopping.is_set():
            try:
                if time.monotonic() - last_sweep >= sweep_every:
                    report = TickReport()
                    self.releasers.of(self.store).sweep(report, time.monotonic() + ROUND_BUDGET_SECONDS)
                    last_sweep = time.monotonic()
                spacing = last_round + self.round_spacing - time.monotonic()
                if spacing > 0 and self.stopping.wait(spacing):
                    break
                last_round = time.monotonic()
                self.release_due()
                self.sleep()
            except self.errors as exc:
                logger.warning("redisdelay releaser: %s; retrying in %.1f s", exc, self.retry_after)
                self.stopping.wait(self.retry_after)

    def stop(self) -> None:
        """Ask :meth:`run` to end; a marker wakes a releaser blocked in BZPOPMIN (this one or another,
        which then looks again and sleeps on)."""
        self.stopping.set()
        with contextlib.suppress(RedisError):  # else it wakes by itself within longest_sleep
            self.store.registries.wake.mark(f"stop:{id(self)}")


class PreciseReleasers:
    """One :class:`PreciseReleaser` per configured shard (or per shard of ``shards``, their indexes), each in
    its own thread; :meth:`run` blocks. Releasers that own a shard each do not compete for any."""

    def __init__(
        self,
        releasers: Releasers,
        longest_sleep: float = 1.0,
        shards: Sequence[int] | None = None,
        chase: bool = True,
    ) -> None:
        self.stopping = threading.Event()
        self.releasers = [
            PreciseReleaser(releasers, longest_sleep, store=store, stopping=self.stopping, chase=chase)
            for store in releasers.depot.shards.pick(shards)
        ]
        self.longest_sleep = longest_sleep

    @property
    def released(self) -> int:
        return sum(releaser.released for releaser in self.releasers)

    def run(self) -> None:
        *others, last = self.releasers
        threads = [threading.Thread(target=r.run, name="redisdelay-releaser", daemon=True) for r in others]
        for thread in threads:
            thread.start()
        last.run()
        for thread in threads:
            thread.join(self.longest_sleep + 5)

    def stop(self) -> None:
        for releaser in self.releasers:
            releaser.stop()
