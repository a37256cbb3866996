"""The validation of seed 001 under faults: nothing may go missing.

Usage::

    python -m chaos                                    # 10,000 messages, every fault (a few minutes)
    python -m chaos --count 2000 --worker-kills 5 --beat-kills 2 --releaser-kills 2 \\
        --redis-restarts 1 --client-kills 3            # the CI size
    python -m chaos --seed 7 --json /tmp/chaos.json    # the same fault plan again, the report there

One command does everything. It starts a redis-server of its own on a free 127.0.0.1 port with
``appendonly yes`` and ``appendfsync always`` in a temporary directory, two workers (``-O fair``,
prefetch multiplier 1, concurrency 2), beat and a precise releaser (``celery -A chaos.app redisdelay
releaser``), all running ``chaos.app``. Then, in this process, it runs
``run_validation(rd, count, fail_every=2, timeout=..., queue_timeout=..., deadline=...)``: ``count``
messages parked for a consumer that fails every other delivery with ``Abandon``; the sweep brings
those back after ``timeout`` seconds. Meanwhile a thread injects faults at points drawn from a seeded
RNG, spread over the run (``chaos/faults.py``):

* ``--worker-kills``: SIGKILL a worker's process group (the worker and its pool), start a new one;
* ``--beat-kills``: SIGKILL beat, start it again;
* ``--releaser-kills``: SIGKILL the releaser, start it again;
* ``--redis-restarts``: SIGTERM redis-server (it syncs the append-only file and exits) and start it
  again on the same port and directory; every client must reconnect;
* ``--client-kills``: ``CLIENT KILL TYPE normal``: every normal client connection is dropped.

``run_validation`` itself does not retry when Redis is unreachable (its client is the extension's,
``redis.Redis.from_url`` without retries), so the runner gives the extension of *its own process* a
client that retries connection errors with backoff; the workers, beat and releaser run the package
as it is.

A process that exits on its own (Celery 5.7 workers can die with "Unrecoverable error:
AttributeError ... 'hostname'" when the broker connection breaks during a Redis restart) is started
again, as systemd would, and reported as an unplanned exit. When messages are missing and nothing is
left that could deliver them (no call parked or in flight, no message queued or held by a worker) for
10 s, the validation is ended early instead of waiting for its deadline.

At the end it prints the report (expected, processed, missing, duplicates with an explanation each,
dead-lettered, deliveries, failures, elapsed, the faults with their times) and writes it as JSON. A
duplicate is allowed only when an acknowledgement was lost (see ``chaos/analysis.py``). It stops
everything it started, by PID. Exit status 0 if and only if nothing is missing and nothing was
dead-lettered. The logs of every process (and the workers' event logs) are kept when the run fails or
with ``--keep-logs``; otherwise they are deleted.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import redis
from celery import signals
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from celery_redisdelay import RedisDelay, ValidationReport, run_validation
from celery_redisdelay.store import text
from celery_redisdelay.testing import exit_on_sigterm, git_revision
from celery_redisdelay.validation import CONSUMER_TASK

from .analysis import Explainer, read_runs, recoveries, run_counts
from .cluster import ROOT, Cluster
from .config import (
    BROKER_VISIBILITY_TIMEOUT,
    CLAIM_TIMEOUT,
    ENV_SHARDS,
    ENV_URL,
    QUEUE,
    RESTORE_INTERVAL,
    TICK_INTERVAL,
)
from .faults import BEAT_KILL, CLIENT_KILL, KINDS, REDIS_RESTART, RELEASER_KILL, WORKER_KILL, Injector, Progress, plan
from .report import table, write_json
from .server import DurableRedis

DEFAULT_JSON = Path(tempfile.gettempdir()) / "redisdelay-chaos.json"
WORKERS = 2
FAIL_EVERY = 2
PROGRESS_EVERY = 10.0
#: End the validation early when messages are missing and for this long nothing could deliver them.
SETTLE_SECONDS = 10.0
KOMBU_UNACKED = "unacked"  # kombu's Redis transport: the messages workers hold, not yet acknowledged

T = TypeVar("T")

_started = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - _started:6.1f}s] {text}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--count", type=int, default=10_000, help="validation messages (10000)")
    parser.add_argument("--worker-kills", type=int, default=20, help="SIGKILL a worker, start a new one (20)")
    parser.add_argument("--beat-kills", type=int, default=10, help="SIGKILL beat, start it again (10)")
    parser.add_argument("--releaser-kills", type=int, default=10, help="SIGKILL the releaser, start it again (10)")
    parser.add_argument("--redis-restarts", type=int, default=2, help="SIGTERM redis-server, start it again (2)")
    parser.add_argument("--client-kills", type=int, default=10, help="CLIENT KILL TYPE normal (10)")
    parser.add_argument("--shards", type=int, default=1, help="redisdelay_shards of the app (1)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault plan (default: a random one)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"where to write the report ({DEFAULT_JSON})")
    parser.add_argument("--timeout", type=float, default=1.0, help="the consumer's visibility timeout in s (1.0)")
    parser.add_argument(
        "--queue-timeout",
        type=float,
        default=None,
        help="how long a released call may wait in the broker queue before the sweep takes it for lost "
        "(default: max(90, 0.03 * count) s; it must outlast the backlog and kombu's own restore)",
    )
    parser.add_argument("--deadline", type=float, default=1800.0, help="give up the validation after this (1800 s)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs even when the run passes")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    for name in ("worker_kills", "beat_kills", "releaser_kills", "redis_restarts", "client_kills"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative")
    if args.queue_timeout is None:
        args.queue_timeout = max(90.0, 0.03 * args.count)
    return args


class Settled(Exception):
    """Raised from the progress callback to end ``run_validation`` when nothing can change any more."""


class LoggedRetry(Retry):
    """Retries connection errors (with backoff) and notes each one, for the report."""

    log: ClassVar[list[dict[str, Any]]] = []

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        def noted(error: Exception, *count: int) -> Any:
            LoggedRetry.log.append({"t": round(time.time(), 4), "error": repr(error)[:200]})
            return fail(error, *count)

        return super().call_with_retry(do, noted, is_retryable, with_failure_count)


def retrying_client(url: str) -> redis.Redis:
    """A client that rides out a Redis restart: up to about a minute of retries with backoff."""
    return redis.Redis.from_url(
        url,
        health_check_interval=30,
        socket_connect_timeout=2,
        retry=LoggedRetry(ExponentialBackoff(cap=1.0, base=0.05), 70),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


class Run:
    """One chaos run: the server, the processes, the faults, the validation, the analysis."""

    def __init__(self, args: argparse.Namespace, seed: int, run_dir: Path) -> None:
        self.args = args
        self.seed = seed
        self.run_dir = run_dir
        self.server = DurableRedis(run_dir / "redis")
        self.cluster: Cluster | None = None
        self.injector: Injector | None = None
        self.counts = {
            WORKER_KILL: args.worker_kills,
            BEAT_KILL: args.beat_kills,
            RELEASER_KILL: args.releaser_kills,
            REDIS_RESTART: args.redis_restarts,
            CLIENT_KILL: args.client_kills,
        }
        self.faults = plan(self.counts, random.Random(seed), WORKERS)
        self.progress = Progress(args.count)
        self.started_wall = 0.0
        self.park_retried: set[str] = set()
        self._retries_seen = 0
        self._last_said = 0.0
        self._last_settle_check = 0.0
        self._settled_since: float | None = None
        self.settled_early = False
        self.run_id: str | None = None
        self.rd: RedisDelay | None = None

    # -- progress ---------------------------------------------------------------------------------

    def on_published(self, sender: Any = None, headers: Any = None, body: Any = None, **_: Any) -> None:
        if sender != CONSUMER_TASK:
            return
        self.progress.on_parked()
        if self.run_id is None and isinstance(body, (list, tuple)) and body and body[0]:
            self.run_id = str(body[0][0])  # the consumer's arguments: (run_id, number, fail_every)
        if len(LoggedRetry.log) > self._retries_seen:  # this park was retried after a connection error
            self._retries_seen = len(LoggedRetry.log)
            if isinstance(headers, dict) and headers.get("id"):
                self.park_retried.add(str(headers["id"]))

    def on_processed(self, done: int, total: int) -> None:
        self.progress.on_processed(done, total)
        now = time.monotonic()
        if done < total and now - self._last_settle_check >= 1.0:
            self._last_settle_check = now
            if not self.settled():
                self._settled_since = None
            elif self._settled_since is None:
                self._settled_since = now
            elif now - self._settled_since >= SETTLE_SECONDS:
                raise Settled(f"{total - done} messages missing and nothing left that could deliver them")
        if now - self._last_said >= PROGRESS_EVERY:
            self._last_said = now
            try:
                assert self.rd is not None
                backlog = f", {self.rd.client.llen(QUEUE)} messages waiting in the broker queue"
            except redis.RedisError:
                backlog = ""
            say(f"processed {done:,}/{total:,}{backlog}")

    def settled(self) -> bool:
        """Whether nothing can deliver a message any more: no call parked or in flight in the store, no
        message in the broker queue, none prefetched (kombu's unacked hash)."""
        assert self.rd is not None
        rd = self.rd
        try:
            pipe = rd.client.pipeline(transaction=False)
            for store in rd.shards.all():
                pipe.zcard(store.keys.delayed)
                pipe.zcard(store.keys.inflight)
            pipe.llen(QUEUE)
            pipe.hlen(KOMBU_UNACKED)
            return not any(pipe.execute())
        except redis.RedisError:
            return False

    def report_from_store(self, rd: RedisDelay) -> ValidationReport:
        """The report ``run_validation`` would have made, after :class:`Settled` ended it early."""
        if self.run_id is None:
            raise RuntimeError("the validation settled before its run id was seen")
        processed_key, counters_key = rd.keys.validation_keys(self.run_id)
        times = {int(number): int(n) for number, n in rd.client.hgetall(processed_key).items()}
        counters = {text(key): int(value) for key, value in rd.client.hgetall(counters_key).items()}
        dead = sum(int(rd.client.zcard(store.keys.dead)) for store in rd.shards.all())  # only the run's calls
        rd.client.delete(processed_key, counters_key)
        return ValidationReport(
            run_id=self.run_id,
            expected=self.args.count,
            processed=len(times),
            missing=[number for number in range(self.args.count) if number not in times],
            duplicates=sorted(number for number, n in times.items() if n > 1),
            deliveries=counters.get("deliveries", 0),
            failures=counters.get("failures", 0),
            dead=dead,
            elapsed=round(self.progress.elapsed(), 3),
            timed_out=False,
        )

    # -- the run ----------------------------------------------------------------------------------

    def start(self) -> RedisDelay:
        self.server.start()
        say(f"redis-server {self.server.version()} ({self.server.binary}) on {self.server.url}, pid {self.server.pid}")
        os.environ[ENV_URL] = self.server.url
        os.environ[ENV_SHARDS] = str(self.args.shards)
        from . import app as chaos_app  # builds the app from the environment

        if self.server.url != chaos_app.URL:
            raise RuntimeError(f"chaos.app was imported before the runner set {ENV_URL}")
        rd = chaos_app.rd
        if {"store", "client", "shards"} & set(vars(rd)):
            raise RuntimeError("the extension's client was made before the runner could replace it")
        vars(rd)["client"] = retrying_client(rd.settings.url)  # see the module's docstring
        self.rd = rd
        self.cluster = Cluster(self.server.url, self.run_dir, say)
        for role, slot in [*(("worker", slot) for slot in range(WORKERS)), ("beat", 0), ("releaser", 0)]:
            member = self.cluster.start(role, slot)
            say(f"{member.name} ready (pid {member.pid}) in {member.ready_seconds:.1f}s")
        self.cluster.supervise()
        return rd

    def validate(self, rd: RedisDelay) -> ValidationReport:
        assert self.cluster is not None
        signals.after_task_publish.connect(self.on_published, weak=False)
        self.progress = Progress(self.args.count)
        self.started_wall = time.time()
        self.injector = Injector(self.faults, self.progress, self.cluster, self.server, say)
        self.injector.start()
        planned = ", ".join(f"{kind} {count}" for kind, count in self.counts.items())
        say(f"validating {self.args.count:,} messages; faults planned (seed {self.seed}): {planned}")
        try:
            return run_validation(
                rd,
                self.args.count,
                fail_every=FAIL_EVERY,
                timeout=self.args.timeout,
                queue_timeout=self.args.queue_timeout,
                deadline=self.args.deadline,
                progress=self.on_processed,
            )
        except Settled as settled:
            say(f"ending the validation early: {settled}")
            self.settled_early = True
            return self.report_from_store(rd)
        finally:
            self.injector.finish()
            left = sum(not fault.injected for fault in self.faults)
            if left:
                say(f"{left} planned faults were not injected: the validation finished first")

    def analyse(self, rd: RedisDelay, report: ValidationReport | None) -> dict[str, Any]:
        """Read the event logs (the processes are stopped by now) and the store (Redis still runs)."""
        assert self.cluster is not None
        data: dict[str, Any] = {"store_after": None, "duplicates_explained": [], "missing_explained": []}
        try:
            data["store_after"] = rd.stats()
        except Exception as exc:  # noqa: BLE001 - reported
            data["store_after"] = f"unavailable: {exc!r}"
        if report is None:
            return data
        runs = read_runs(self.cluster.events_dir, report.run_id)
        data["runs"] = run_counts(runs)
        data["long_waits"] = recoveries(runs, self.started_wall, self.args.queue_timeout)
        explainer = Explainer(
            runs,
            self.cluster.members,
            self.faults,
            started_wall=self.started_wall,
            visibility_timeout=self.args.timeout,
            broker_visibility_timeout=BROKER_VISIBILITY_TIMEOUT,
            park_retried=self.park_retried,
        )
        data["duplicates_explained"] = [explainer.duplicate(number) for number in report.duplicates]
        missing = []
        for number in report.missing[:200]:
            call_id = explainer.by_number.get(number)
            entry = rd.find(call_id) if call_id else None
            store = {"state": entry.state, "meta": entry.meta} if entry is not None else None
            missing.append(explainer.missing(number, store))
        data["missing_explained"] = missing
        data["ack_failures_logged"] = len(explainer.ack_failed)
        return data

    def stop(self) -> None:
        if self.injector is not None:
            self.injector.finish()
        if self.cluster is not None:
            self.cluster.close()
        self.server.terminate()


def settings(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    return {
        "count": args.count,
        "fail_every": FAIL_EVERY,
        "seed": seed,
        "timeout": args.timeout,
        "queue_timeout": args.queue_timeout,
        "deadline": args.deadline,
        "workers": WORKERS,
        "worker_options": "-O fair, prefetch multiplier 1, concurrency 2",
        "tick_interval": TICK_INTERVAL,
        "claim_timeout": CLAIM_TIMEOUT,
        "broker_visibility_timeout": BROKER_VISIBILITY_TIMEOUT,
        "broker_restore_interval": RESTORE_INTERVAL,
        "redis": "appendonly yes, appendfsync always",
    }


def environment(server: DurableRedis) -> dict[str, Any]:
    try:
        redis_version = server.version()
    except redis.RedisError:
        redis_version = "?"
    return {
        "redis_server": redis_version,
        "python": platform.python_version(),
        "celery": version("celery"),
        "kombu": version("kombu"),
        "redis_py": version("redis"),
        "revision": git_revision(ROOT),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    run_dir = Path(tempfile.mkdtemp(prefix="redisdelay-chaos-"))
    run = Run(args, seed, run_dir)
    report: ValidationReport | None = None
    error: str | None = None
    analysis: dict[str, Any] = {}
    env: dict[str, Any] = {}
    try:
        rd = run.start()
        env = environment(run.server)
        try:
            report = run.validate(rd)
        except Exception:  # noqa: BLE001 - reported, and everything is still stopped
            error = traceback.format_exc()
            say(f"the validation failed:\n{error}")
        assert run.cluster is not None
        run.cluster.close()
        analysis = run.analyse(rd, report)
    finally:
        run.stop()

    assert run.cluster is not None
    ok = report is not None and not report.missing and report.dead == 0
    unexplained = [row for row in analysis.get("duplicates_explained", []) if not row["allowed"]]
    keep = args.keep_logs or not ok or bool(unexplained)
    fault_counts = {
        kind: {
            "planned": run.counts[kind],
            "injected": sum(fault.injected for fault in run.faults if fault.kind == kind),
        }
        for kind in KINDS
    }
    result = report.as_dict() if report is not None else {}
    if report is not None:
        result["extra_recordings"] = report.deliveries - report.failures - report.processed
    data = {
        "ok": ok,
        "exit_status": 0 if ok else 1,
        "settings": settings(args, seed),
        "environment": env,
        "result": result,
        **analysis,
        "unexplained_duplicates": len(unexplained),
        "faults": {"counts": fault_counts, "list": [fault.as_dict() for fault in run.faults]},
        "fault_errors": run.injector.failure if run.injector is not None else None,
        "processes": [
            {
                "name": member.name,
                "pid": member.pid,
                "started": round(member.started - run.started_wall, 2) if run.started_wall else None,
                "ready_seconds": member.ready_seconds,
                "ended": round(member.ended - run.started_wall, 2) if member.ended and run.started_wall else None,
                "how": member.how,
                "status": member.status,
            }
            for member in run.cluster.members
        ],
        "settled_early": run.settled_early,
        "unplanned_exits": [
            {**record, "at": round(record["wall"] - run.started_wall, 2) if run.started_wall else None}
            for record in run.cluster.exits
        ],
        "runner_retries": LoggedRetry.log,
        "park_retried": sorted(run.park_retried),
        "seconds": round(time.monotonic() - _started, 1),
        "logs": str(run_dir) if keep else None,
        "error": error,
    }
    print()
    print(table(data))
    write_json(args.json, data)
    say(f"report written to {args.json}")
    if keep:
        say(f"logs kept in {run_dir}")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
