"""The issue's pause at full size, on two real workers (``--pool prefork --concurrency 2`` each, Celery's default
prefetch multiplier 4, a precise releaser in each): a paused task's calls are held, then each runs once, at once,
after the resume, while another task's calls run on time.

Two runs on the same workers, with the same load:

* the paused task's calls (``bench.stamp``): 50 [10] wait in the broker's queue when the pause is set, behind both
  workers' full prefetch (``bench.sleeper`` calls that run until woken); 200 [40] more are parked right after, due
  over the next 30 [4] s; the workers are woken 1 s after the pause, when they must have seen it (so that the calls
  in the queue take the workers' hold-back path, not the bound's);
* another task's calls (``bench.sleeper`` returning at once), 20 a second, each parked 1 s before it is due, from
  then until 5 [2] s after the resume.

Run A, the baseline, sets no pause. Run B pauses the task before the 200 are parked and resumes it 3 [1] s after the
last of them is due. Every call records its start by the Redis clock. Reported for run B: the paused task's starts
from 1 s after the pause to the resume (target 0: a worker sees a pause within 1 s), the time from the resume to the
last start of its calls (target <= 2 s), its duplicate and missing runs (target 0); for both runs, the other task's
lateness (due time to start) p99 of the calls due while the task is paused (target: B within noise of A, no figure),
and p50 and p99 over the whole run (the resume's burst of the paused calls goes into the same queue ahead of them).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from celery_redisdelay.testing import wait_for

from ..app import BenchApp, build
from ..common import DEFAULT_QUEUE as QUEUE
from ..common import server_ms
from ..context import Context
from ..marks import Mark, read_marks
from ..report import Row, percentile, ratio

PAUSED_TASK = "bench.stamp"
WORKERS, CONCURRENCY, PREFETCH = 2, 2, 4
#: The calls that fill both workers: one running in each process, and a full prefetch held by each consumer.
BUSY = WORKERS * CONCURRENCY * (1 + PREFETCH)
BUSY_SECONDS = 300.0  # they run until woken
OTHER_LEAD_MS = 1000  # the other task's calls are parked this long before they are due
BOUND_MS = 1000  # a worker sees a pause within this long (docs/pausing.rst)
RESUME_TARGET_MS = 2000
AFTER_RESUME = 60.0  # seconds to wait for the calls after the resume before counting the missing


@dataclass(frozen=True)
class Scenario:
    queued: int  # the paused task's calls in the broker's queue when the pause is set
    falling: int  # its calls parked to fall due after the pause
    spread: float  # seconds over which they fall due
    hold: float  # seconds the pause lasts after the last of them is due
    tail: float  # seconds the other task's calls go on after the resume
    other_rate: float  # the other task's calls per second


NORMAL = Scenario(queued=50, falling=200, spread=30.0, hold=3.0, tail=5.0, other_rate=20.0)
QUICK = Scenario(queued=10, falling=40, spread=4.0, hold=1.0, tail=2.0, other_rate=20.0)


class Stream(threading.Thread):
    """The other task's calls: ``rate`` a second due from ``first_ms`` to ``last_ms`` (Redis clock), each parked
    OTHER_LEAD_MS before it is due, through an app of its own (another service's producer)."""

    def __init__(self, parker: BenchApp, key: str, first_ms: int, last_ms: int, rate: float, offset_ms: float) -> None:
        super().__init__(daemon=True)
        self.parker, self.key = parker, key
        self.dues = [first_ms + round(i * 1000 / rate) for i in range(int((last_ms - first_ms) * rate / 1000) + 1)]
        self.offset_ms = offset_ms  # Redis clock minus this process's clock
        self.due_of: dict[str, int] = {}
        self.most_lag_ms = 0.0  # how far behind its schedule the stream sent a call
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            with self.parker.app.producer_or_acquire() as producer:
                for due in self.dues:
                    send_at = due - OTHER_LEAD_MS
                    if self.stopping.wait(max(0.0, (send_at - self.offset_ms) / 1000 - time.time())):
                        return
                    self.most_lag_ms = max(self.most_lag_ms, time.time() * 1000 + self.offset_ms - send_at)
                    eta = datetime.fromtimestamp(due / 1000, tz=UTC)
                    sent = self.parker.sleeper.apply_async((self.key, 0), eta=eta, queue=QUEUE, producer=producer)
                    self.due_of[sent.id] = due
        except BaseException as exc:  # noqa: BLE001 - the run reports it
            self.error = exc


def sleep_until(ctx: Context, at_ms: int) -> None:
    time.sleep(max(0.0, (at_ms - server_ms(ctx.client)) / 1000))


def one_run(ctx: Context, scenario: Scenario, pause: bool, offset_ms: float) -> dict[str, Any]:
    """One run of the scenario, with or without the pause; what started when."""
    client, bench = ctx.client, ctx.bench
    label = "B, paused" if pause else "A, no pause"
    tag = uuid.uuid4().hex[:8]
    busy, marks, other = (f"bench:pause_fleet:{name}:{tag}" for name in ("busy", "paused", "other"))
    ctx.clear(QUEUE)
    for _ in range(BUSY):
        bench.sleeper.apply_async((busy, BUSY_SECONDS), countdown=0, queue=QUEUE)
    running = WORKERS * CONCURRENCY
    wait_for(lambda: client.llen(busy) >= running and client.llen(QUEUE) == 0, 60, "both workers busy", 0.1)
    expected = [bench.stamp.apply_async((marks, i), countdown=0, queue=QUEUE).id for i in range(scenario.queued)]
    wait_for(
        lambda: client.llen(QUEUE) >= scenario.queued,
        30,
        f"the {scenario.queued} calls to wait in the broker's queue (the workers took some: more room than {BUSY})",
        0.05,
    )
    stream: Stream | None = None
    parker = build(ctx.url)
    try:
        pause_ms = server_ms(client)
        if pause:
            since = bench.rd.pause(task=PAUSED_TASK, reason="bench: pause_fleet")["since"]
            pause_ms = round(since.timestamp() * 1000)
        step = scenario.spread * 1000 / scenario.falling
        for i in range(scenario.falling):
            due = datetime.fromtimestamp((pause_ms + round((i + 1) * step)) / 1000, tz=UTC)
            expected.append(bench.stamp.apply_async((marks, scenario.queued + i), eta=due, queue=QUEUE).id)
        # The workers come free when they must have seen the pause: every call in the queue is then held back.
        sleep_until(ctx, pause_ms + BOUND_MS)
        client.set(f"{busy}:awake", 1)
        woken_ms = server_ms(client)
        resume_at = pause_ms + round((scenario.spread + scenario.hold) * 1000)
        last_other = resume_at + round(scenario.tail * 1000)
        stream = Stream(parker, other, woken_ms + OTHER_LEAD_MS, last_other, scenario.other_rate, offset_ms)
        stream.start()
        sent = stream.due_of
        sleep_until(ctx, resume_at)
        waiting = sum(one["waiting"] for one in bench.rd.paused())
        resume_ms = server_ms(client)
        if pause:
            bench.rd.resume(task=PAUSED_TASK)
        stream.join(scenario.tail + 60)
        if stream.error is not None:
            raise RuntimeError(f"{label}: the other task's stream failed: {stream.error!r}") from stream.error
        total = len(expected)
        try:
            wait_for(lambda: client.llen(marks) >= total, AFTER_RESUME, f"the {total} paused calls to start", 0.05)
            wait_for(lambda: client.llen(other) >= len(sent), 60, "the other task's calls to start", 0.1)
            wait_for(
                lambda: not any(bench.rd.stats()[state] for state in ("delayed", "inflight")), 30, "a settled store"
            )
        except TimeoutError as exc:
            ctx.say(f"  {label}: {exc}; counting what started")
        started, others = read_marks(client, marks), read_marks(client, other)
        return measure(label, expected, started, stream, others, pause_ms, resume_ms, waiting)
    finally:
        if stream is not None:
            stream.stopping.set()
        client.set(f"{busy}:awake", 1)
        if pause:
            bench.rd.resume(task=PAUSED_TASK)
        parker.app.close()
        client.unlink(busy, f"{busy}:awake", marks, other)


def measure(
    label: str,
    expected: list[str],
    paused: list[Mark],
    stream: Stream,
    other: list[Mark],
    pause_ms: int,
    resume_ms: int,
    waiting: int,
) -> dict[str, Any]:
    """What one run's starts say: the paused task's starts by phase, runs each once, the other task's lateness."""
    if not paused or not other:
        raise RuntimeError(f"{label}: {len(paused)} calls of the paused task and {len(other)} others started")
    first: dict[str, int] = {}
    for mark in paused:
        first[mark.call_id] = min(mark.ms, first.get(mark.call_id, mark.ms))
    times = [mark.ms for mark in paused]
    held_from = pause_ms + BOUND_MS
    late: dict[str, int] = {}  # the other task's calls by id: its first start after its due time
    for mark in other:
        if mark.call_id in stream.due_of:
            after = mark.ms - stream.due_of[mark.call_id]
            late[mark.call_id] = min(after, late.get(mark.call_id, after))
    whole = spread_of([float(after) for after in late.values()])
    meanwhile = [float(after) for call_id, after in late.items() if stream.due_of[call_id] < resume_ms]
    # Where the worst of them were due, from the resume (ms): in the resume's burst, or elsewhere.
    worst = sorted(stream.due_of[call_id] - resume_ms for call_id, after in late.items() if after >= whole["p99_ms"])
    return {
        "calls": len(expected),
        "runs": len(paused),
        "duplicates": len(paused) - len(first),
        "missing": len(set(expected) - first.keys()),
        "started_before_pause": sum(at < pause_ms for at in times),
        "started_within_bound": sum(pause_ms <= at < held_from for at in times),
        "started_while_held": sum(held_from <= at < resume_ms for at in times),
        "resume_to_last_ms": float(max(times) - resume_ms),
        # How the starts after the resume spread out: a late first start is the release, a long tail the workers.
        "resume_to_first_ms": min(times) - resume_ms,
        "resume_to_median_ms": percentile([float(at - resume_ms) for at in times], 50),
        "waiting_at_resume": waiting,
        "other": {
            "calls": len(stream.due_of),
            "started": len(late),
            "duplicates": len(other) - len({mark.call_id for mark in other}),
            "whole_run": whole,
            "due_before_resume": spread_of(meanwhile),
            "stream_most_lag_ms": round(stream.most_lag_ms),
            "p99_and_over_due_from_resume_ms": worst,
        },
    }


def spread_of(lateness: list[float]) -> dict[str, float]:
    return {
        "calls": len(lateness),
        "p50_ms": percentile(lateness, 50),
        "p99_ms": percentile(lateness, 99),
        "max_ms": max(lateness),
    }


def say_run(ctx: Context, label: str, found: dict[str, Any]) -> None:
    other = found["other"]
    whole, meanwhile = other["whole_run"], other["due_before_resume"]
    ctx.say(
        f"  {label}: paused task {found['runs']} runs of {found['calls']} calls ({found['duplicates']} duplicate, "
        f"{found['missing']} missing); started before the pause {found['started_before_pause']}, within 1 s of it "
        f"{found['started_within_bound']}, from then to the resume {found['started_while_held']}; waiting at the "
        f"resume {found['waiting_at_resume']}; starts from the resume: first {found['resume_to_first_ms']:+,} ms, "
        f"median {found['resume_to_median_ms']:+,.0f} ms, last {found['resume_to_last_ms']:+,.0f} ms"
    )
    ctx.say(
        f"  {label}: other task {other['started']} of {other['calls']} started, lateness p50 {whole['p50_ms']:,.0f} "
        f"ms, p99 {whole['p99_ms']:,.0f} ms, max {whole['max_ms']:,.0f} ms; of the {meanwhile['calls']} due before "
        f"the resume p99 {meanwhile['p99_ms']:,.0f} ms, max {meanwhile['max_ms']:,.0f} ms (stream at most "
        f"{other['stream_most_lag_ms']} ms behind); the calls at p99 and over were due at "
        f"{', '.join(f'{ms:+,}' for ms in other['p99_and_over_due_from_resume_ms'])} ms from the resume"
    )


def pause_fleet(ctx: Context) -> dict[str, Any]:
    """The issue's scenario on two workers, without (A) and with (B) the pause; see the module's text."""
    scenario = QUICK if ctx.quick else NORMAL
    processes = ctx.processes
    ctx.clear(QUEUE)
    workers = [
        processes.worker(f"bench-pause-{n}", queues=QUEUE, concurrency=CONCURRENCY, precise=True, prefetch=PREFETCH)
        for n in range(1, WORKERS + 1)
    ]
    try:
        offset_ms = server_ms(ctx.client) - time.time() * 1000
        runs: dict[str, dict[str, Any]] = {}
        for key, pause, label in (("A", False, "A, no pause"), ("B", True, "B, paused")):
            runs[key] = one_run(ctx, scenario, pause, offset_ms)
            say_run(ctx, label, runs[key])
    finally:
        for worker in workers:
            processes.stop(worker)
    ctx.clear(QUEUE)
    return {
        "rows": [row.as_dict() for row in rows(scenario, runs["A"], runs["B"])],
        "details": {**asdict(scenario), **runs},
    }


def rows(scenario: Scenario, a: dict[str, Any], b: dict[str, Any]) -> list[Row]:
    name = f"pause_fleet ({scenario.queued} queued + {scenario.falling} falling due, 2 workers)"
    during, base_during = b["other"]["due_before_resume"], a["other"]["due_before_resume"]
    whole, base_whole = b["other"]["whole_run"], a["other"]["whole_run"]
    return [
        Row(
            f"{name}: paused task's starts, pause + 1 s to resume",
            b["started_while_held"],
            "calls",
            a["started_while_held"],
            "run A, no pause, same window",
            None,
            "0",
            b["started_while_held"] == 0,
        ),
        Row(
            f"{name}: resume to the last start",
            b["resume_to_last_ms"],
            "ms",
            target=f"<= {RESUME_TARGET_MS:,} ms",
            met=b["resume_to_last_ms"] <= RESUME_TARGET_MS,
        ),
        Row(
            f"{name}: paused task's duplicate runs",
            b["duplicates"],
            "calls",
            a["duplicates"],
            "run A, no pause",
            None,
            "0",
            b["duplicates"] == 0,
        ),
        Row(
            f"{name}: paused task's missing runs",
            b["missing"],
            "calls",
            a["missing"],
            "run A, no pause",
            None,
            "0",
            b["missing"] == 0,
        ),
        Row(
            f"{name}: other task's lateness p99, due while paused",
            during["p99_ms"],
            "ms",
            base_during["p99_ms"],
            "run A, no pause, same window",
            ratio(during["p99_ms"], base_during["p99_ms"]),
            "within noise of run A",
        ),
        Row(
            f"{name}: other task's lateness p99, whole run (resume burst in)",
            whole["p99_ms"],
            "ms",
            base_whole["p99_ms"],
            "run A, no pause",
            ratio(whole["p99_ms"], base_whole["p99_ms"]),
        ),
        Row(
            f"{name}: other task's lateness p50, whole run",
            whole["p50_ms"],
            "ms",
            base_whole["p50_ms"],
            "run A, no pause",
            ratio(whole["p50_ms"], base_whole["p50_ms"]),
        ),
    ]
