"""The soak: producers park at a steady rate for a fixed time under random faults, then everything drains.

Two producer threads in the runner park ``--rate`` calls a second in all for ``--soak`` minutes, each
due at a moment drawn uniformly up to ``--max-countdown`` seconds ahead (never past the end of the
parking), so due times are spread over the run. Every call records a numbered message of the run, as
the validation's consumer does (failing every ``--fail-every``-th delivery on purpose, every other one
by default, so the sweep redelivers them), and the mix covers every kind of key the store keeps, for the leak check:

* 6 in 10: plain calls;
* 1 in 10: with a ``unique_key`` (parked twice: the second must give the first's id);
* 1 in 10: with a ``debounce_key`` (parked twice: the second replaces the first, same id);
* 1 in 10: a task under one of a few locks (busy locks defer calls);
* 1 in 10: an item of a batched task (groups of 10, flushed after 3 s at the latest).

The faults are planned over the parking time from the seeded RNG. When parking ends the run drains:
it waits until every message is processed and nothing is left in the store or the broker, then lets
expiring keys expire and takes the end measurements (``chaos/measure.py``).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from datetime import UTC, datetime
from typing import Any

from celery_redisdelay import RedisDelay
from celery_redisdelay.operations.metrics import snapshot
from celery_redisdelay.operations.validation import CONSUMER_TASK, collect_report

from .config import BATCH_TASK, LOCK_SLOTS, LOCKED_TASK
from .faults import Clock
from .harness.console import say
from .harness.sending import paced, run_producers
from .harness.settle import COMPLETE, SETTLED, Level, drain
from .ledger import CALL, DEBOUNCE, ITEM, LOCKED, UNIQUE
from .measure import Sampler, children_of, compare, histogram_bytes, inventory, this_process
from .run import Run

PRODUCERS = 2
MIX = (CALL,) * 6 + (UNIQUE, DEBOUNCE, LOCKED, ITEM)
#: A keyed call is parked twice; it must still be parked for the second (released calls free their key).
KEYED_MIN_COUNTDOWN = 5.0
DEBOUNCE_FIRST_EXTRA = 5.0
BATCH_KEYS = 2
PROGRESS_EVERY = 15.0
SETTLE_SECONDS = 10.0
#: After the drain: lock wake-up lists expire 10 s after a release; then the end is measured.
QUIET_SECONDS = 12.0
#: RSS is compared from this long after a process started (imports and caches warm up first).
WARM_SECONDS = 60.0


class Soak:
    """One soak on a started :class:`Run`."""

    def __init__(self, run: Run, rd: RedisDelay) -> None:
        self.run = run
        self.rd = rd
        self.args = run.args
        self.seconds = self.args.soak * 60.0
        self.run_id = f"soak-{run.seed}"
        self.rng = random.Random(run.seed)
        self.rng_lock = threading.Lock()
        self.numbers = itertools.count()
        self.parked: set[int] = set()  # the messages parked (a producer's failed park leaves a gap)
        self.anomalies: list[str] = []
        self.errors: list[str] = []
        self.clock = Clock(self.seconds)
        self.sampler: Sampler | None = None
        self.tasks = {name: rd.app.tasks[name] for name in (CONSUMER_TASK, LOCKED_TASK, BATCH_TASK)}

    # -- parking ----------------------------------------------------------------------------------

    def countdown(self, least: float = 0.0) -> float | None:
        """Seconds to the call's due time; None when the parking ends too soon for ``least``."""
        remaining = self.seconds - self.clock.elapsed()
        if remaining < least:
            return None
        with self.rng_lock:
            return self.rng.uniform(least, max(least, min(self.args.max_countdown, remaining)))

    def options(self, countdown: float) -> dict[str, Any]:
        eta = datetime.fromtimestamp(time.time() + countdown, tz=UTC)
        return {"eta": eta, "visibility_timeout": self.args.timeout, "queue_timeout": self.args.queue_timeout}

    def park_one(self, number: int) -> None:
        kind = MIX[number % len(MIX)]
        args = (self.run_id, number, self.args.fail_every)
        consumer = self.tasks[CONSUMER_TASK]
        keyed = kind in (UNIQUE, DEBOUNCE) and self.countdown(KEYED_MIN_COUNTDOWN + DEBOUNCE_FIRST_EXTRA)
        if kind in (UNIQUE, DEBOUNCE) and not keyed:
            kind = CALL  # too close to the end to park it twice
        if kind == ITEM:
            self.run.add_item(self.tasks[BATCH_TASK], f"b{number % BATCH_KEYS}", self.run_id, number)
        elif kind == LOCKED:
            countdown = self.countdown() or 0.0
            self.run.park(self.tasks[LOCKED_TASK], (*args, number % LOCK_SLOTS), self.options(countdown), kind=LOCKED)
        elif kind == UNIQUE:
            countdown = self.countdown(KEYED_MIN_COUNTDOWN) or KEYED_MIN_COUNTDOWN
            options = {**self.options(countdown), "unique_key": f"u{number}"}
            first = self.run.park(consumer, args, options, kind=UNIQUE)
            second = self.run.park(consumer, args, options, kind=UNIQUE)
            if first != second:
                self.anomalies.append(f"message {number}: unique key parked {first} and then {second}")
        elif kind == DEBOUNCE:
            countdown = self.countdown(KEYED_MIN_COUNTDOWN) or KEYED_MIN_COUNTDOWN
            first_options = {**self.options(countdown + DEBOUNCE_FIRST_EXTRA), "debounce_key": f"d{number}"}
            first = self.run.park(consumer, args, first_options, kind=DEBOUNCE)
            second = self.run.park(
                consumer, args, {**self.options(countdown), "debounce_key": f"d{number}"}, kind=DEBOUNCE
            )
            if first != second:
                self.anomalies.append(f"message {number}: debounce key replaced {first} by {second}")
        else:
            self.run.park(consumer, args, self.options(self.countdown() or 0.0))
        self.parked.add(number)

    def produce(self, index: int, began: float) -> None:
        """One producer: parks at ``rate / PRODUCERS`` a second until the parking time is over."""
        for _ in paced(index, PRODUCERS, self.args.rate, self.seconds, began):
            try:
                self.park_one(next(self.numbers))
            except Exception as exc:  # noqa: BLE001 - reported; the producer goes on
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])

    # -- the soak ---------------------------------------------------------------------------------

    def processes(self) -> list[tuple[str, int]]:
        """Every live process of the run, named, for the RSS samples."""
        assert self.run.cluster is not None
        found = [this_process()]
        for member in list(self.run.cluster.members):
            if member.how or member.exited():
                continue
            found.append((member.name, member.pid))
            if member.role == "worker":
                found += [(f"{member.name} pool", child) for child in children_of(member.pid)]
        for role, server in self.run.topology.servers():
            if server.pid is not None:
                found.append((f"redis {role} :{server.port}", server.pid))
        return found

    def redis_inventories(self, *, calibrate: bool = False) -> dict[str, dict[str, Any]]:
        found = {}
        roles = {"store": self.run.topology.store_client}
        if self.run.topology.broker_apart:
            roles["broker"] = self.run.topology.broker_client
        for role, make in roles.items():
            with make() as client:
                per_histogram = histogram_bytes(client) if calibrate else 0
                found[role] = {**inventory(client), "histogram_bytes": per_histogram}
        return found

    def lateness_histogram(self) -> list[tuple[float, int]]:
        return snapshot(self.rd.depot).lateness_buckets

    def soak(self) -> dict[str, Any]:
        """Park for the soak's minutes under the faults, drain, measure: the soak's part of the report."""
        start_redis = self.redis_inventories(calibrate=True)
        start_histogram = self.lateness_histogram()
        began = time.monotonic()
        self.sampler = Sampler(self.processes, began)
        self.sampler.start()
        self.run.start_faults(self.clock)
        planned = ", ".join(f"{fault.kind}@{fault.at * self.seconds:.0f}s" for fault in self.run.faults) or "none"
        say(
            f"soaking {self.args.soak:g} min at {self.args.rate:g} calls/s; faults planned (seed {self.run.seed}): "
            + planned
        )
        producers = [
            threading.Thread(target=self.produce, args=(index, began), name=f"producer-{index}", daemon=True)
            for index in range(PRODUCERS)
        ]
        run_producers(
            producers,
            PROGRESS_EVERY,
            lambda: f"parked {len(self.parked):,}, processed {self.processed():,}{self.run.broker_backlog()}",
        )
        parked_seconds = time.monotonic() - began
        self.run.stop_faults()
        say(f"parking over after {parked_seconds:.0f}s ({len(self.parked):,} messages); draining")
        drained, settled_early = self.drain()
        drain_seconds = time.monotonic() - began - parked_seconds
        result = self.read_result(time.monotonic() - began)
        say(f"drained in {drain_seconds:.0f}s; letting expiring keys expire ({QUIET_SECONDS:g}s)")
        time.sleep(QUIET_SECONDS)
        end_redis = self.redis_inventories()
        end_histogram = self.lateness_histogram()
        self.sampler.finish()
        return {
            "result": result,
            "parked_seconds": round(parked_seconds, 1),
            "drain_seconds": round(drain_seconds, 1),
            "drained": drained,
            "settled_early": settled_early,
            "anomalies": self.anomalies,
            "producer_errors": self.errors,
            "rss": self.sampler.summaries(min(WARM_SECONDS, self.seconds / 5)),
            "redis": {
                role: {"start": start_redis[role], "end": end_redis[role], "compare": compare(start_redis[role], end)}
                for role, end in end_redis.items()
            },
            "release_lateness": histogram_quantiles(start_histogram, end_histogram),
        }

    def processed(self) -> int:
        try:
            return int(self.rd.client.hlen(self.rd.keys.validation_keys(self.run_id)[0]))
        except Exception:  # noqa: BLE001 - only for the progress line
            return -1

    def drain(self) -> tuple[bool, bool]:
        """Wait until every message parked is processed and nothing is left anywhere: (drained, ended early
        because messages are missing and nothing could deliver them any more)."""

        def look() -> Level:
            done, settled = self.processed(), self.run.settled()
            return Level(done, len(self.parked), settled)

        def progress(level: Level) -> None:
            say(f"draining: processed {level.done:,}/{level.expected:,}{self.run.broker_backlog()}")

        drained = drain(
            look, deadline=self.args.deadline, settle=SETTLE_SECONDS, pause=0.5, every=PROGRESS_EVERY, progress=progress
        )
        if drained.how == SETTLED:
            missing = drained.last.expected - drained.last.done
            say(f"ending the drain: {missing} messages missing and nothing left that could deliver them")
        return drained.how == COMPLETE, drained.how == SETTLED

    def read_result(self, elapsed: float) -> dict[str, Any]:
        """The validation-style result of the soak; deletes the run's own keys (before the end measurement)."""
        dead = sum(int(self.rd.client.zcard(store.keys.dead)) for store in self.rd.shards.all())
        report = collect_report(self.rd.depot, self.run_id, self.parked, dead=dead, elapsed=elapsed, timed_out=False)
        kinds: dict[str, int] = {}
        for entry in self.run.ledger.by_number().values():
            kinds[entry.kind] = kinds.get(entry.kind, 0) + 1
        return {**report.as_dict(), "parked_by_kind": kinds}


def histogram_quantiles(start: list[tuple[float, int]], end: list[tuple[float, int]]) -> dict[str, Any]:
    """Quantiles of the release lateness over the soak, from the difference of two cumulative histograms:
    the upper bound of the bucket each quantile falls in."""
    counts = [(bound, after - before) for (bound, after), (_, before) in zip(end, start, strict=True)]
    total = counts[-1][1] if counts else 0

    def quantile(q: float) -> float | None:
        for bound, cumulative in counts:
            if total and cumulative >= q * total:
                return bound
        return None

    return {"releases": total, "p50_le_s": quantile(0.5), "p99_le_s": quantile(0.99), "buckets": counts}
