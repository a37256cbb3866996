"""Benchmarks of celery-redisdelay, each against a baseline measured in the same run.

Usage::

    python -m bench                       # every figure, normal sizes (a few minutes)
    python -m bench --quick               # small sizes: a smoke test, well under a minute
    python -m bench --only park_single,release
    python -m bench --json /tmp/out.json  # default: bench/results.json

(``python3 dev.py bench`` runs the same with the project's virtualenv.)

One command does everything: it starts its own redis-server on a free 127.0.0.1 port
(``celery_redisdelay.testing.RedisServer``; ``$REDISDELAY_REDIS_SERVER`` picks the binary), the
workers, beat and releaser each figure needs (``celery -A bench.app ...``, configured through
``$REDISDELAY_BENCH_URL``), and stops everything it started, by PID, before it exits. It prints
progress as it goes, then a table (figure, ours, baseline, ratio = ours / baseline, target, met) and
writes the results as JSON. A figure that fails is reported as failed and the others still run; the
exit status is 1 when any figure failed (a target not met does not change it).

Figures (normal size, quick size in brackets):

park_single
    Calls/s of a delayed task's ``apply_async(countdown=60)``, one call at a time, against Celery's own
    ``apply_async(countdown=60)`` of a plain ``@app.task`` on the same broker (nobody consumes); then the
    same with a Redis result backend on both apps ("park_single (Redis results)"). 5,000 [500] calls
    each. Target: ratio >= 2.5. Also printed, where a park's time goes: the park script's time inside
    Redis (INFO commandstats) and an empty script's EVALSHA through redis-py and on its connection.
park_bulk
    Calls/s of ``task.park_many(list_of_args, countdown=60)`` when the delayed task has it ("not
    implemented" otherwise), against a raw redis-py pipeline writing the same stored payload with one
    ZADD + HSET per call, 1000 calls per round trip. 50,000 [2,000] calls. Target: >= 50,000 calls/s
    and >= 0.6x the raw pipeline.
release
    Calls/s of ``rd.tick()`` releasing a backlog of 100,000 [5,000] due calls to the broker (copies of
    one really parked call, written into the store with a pipeline), against a loop of Celery's
    ``send_task`` (5,000 [500] calls) and against a raw Lua mover (ZRANGEBYSCORE LIMIT 1000 + HGET +
    LPUSH + ZREM + HDEL) over the same number of copies; ours and the raw mover take turns, two rounds
    each after a warm-up round of each, and the rates are over the two rounds. Targets: >= 40x
    send_task and >= 100,000 calls/s; >= 0.85x the raw mover.
release_limited
    Calls/s of ``rd.tick()`` releasing 20,000 [2,000] due calls of a task limited per key (100,000/s and 1,000 in
    flight per key, wide enough to let every call go) over 1,000 keys, against the same calls of the same task
    without limits; the sides take turns over two rounds after a warm-up round. Target: >= 0.5x.
release_paused
    Calls/s of ``rd.tick()`` releasing release_limited's calls without limits while 100 other tasks are paused (the
    pauses match no call), against the same calls with no pause; the sides take turns over two rounds after a
    warm-up. Target: >= 0.9x.
worker_memory
    RSS growth of a fresh ``--pool solo`` worker's process (VmRSS of the process that holds prefetched
    messages) when 50,000 [2,000] calls are parked with countdown=3600 for its queue, against a second
    fresh worker prefetching 50,000 [2,000] plain tasks sent with countdown=3600 (measured once its
    queue is empty and its RSS stops growing). Target: ours < +5 MB. Then "worker_memory (N received eta
    messages)": the same N plain tasks sent with countdown=3600 as Celery sends them (no parking at the
    producer) to a third fresh solo worker with ``redisdelay_park_received=True``, which parks what it receives;
    against the same plain worker's growth. Target: < +5 MB.
lateness
    Due time to task start (Redis clock), p50 and p99 over 300 [100] calls due over 3 [2] s, with
    1,000 and 1,000,000 [20,000] calls parked in the background (scaled down, and reported, when the
    machine's MemAvailable cannot hold them twice over). For the beat tick (worker + beat,
    ``redisdelay_tick_interval=1.0``): target p99 <= 1050 ms. For the precise releaser when the
    package has one (the same worker, beat stopped, and ``celery -A bench.app redisdelay releaser``
    started with ``redisdelay_precise_release=True``; "not implemented" when ``redisdelay releaser
    --help`` says there is no such command): target p50 < 5 ms, p99 < 20 ms. Both: the large-backlog
    p99 at most 1.3x the small-backlog p99. Redis runs with its defaults (``hz 10``).
redis_memory_per_call
    Redis ``used_memory`` growth / N for N = 5,000 [500] calls parked with ``apply_async``, against N
    plain Celery messages waiting in a broker queue. Reported, no target.
release_cluster
    Calls/s released from a call store on a local Redis Cluster (``LocalCluster``) to the standalone
    broker (kombu's publish path): 3 shards on 3 masters with 3 releaser processes (``python -m
    bench.cluster_releaser``, each ticking over all shards) against 1 shard on a 1-master cluster with 1
    releaser; 60,000 [6,000] due calls each, parked with ``park_many(countdown=0)``; the releasers are
    warmed up, then started by a signal; timed until the broker queue holds every call. Reports the
    calls each master held and ``os.cpu_count()``. With as many releasers as shards, each owns one shard
    (``--shard N``). Target: ratio >= 2.5 where the machine's cores allow.
    Skipped, saying why, when the redis-server cannot run a cluster (Redis < 7).
dashboard
    Median ms per page of the dashboard (``celery_redisdelay.web``, through its WSGI app in the bench
    process) with 1,000,000 [20,000] parked calls, one in ten of another task: the delayed list oldest
    and newest first, filtered by that task both ways, 900,000 calls in, and the overview; against one
    raw ZRANGE + HMGET of the same 50 entries. Target: each page < 250 ms. A search in the arguments
    that finds nothing (it reads its whole scan bound, 10,000 entries with payloads) is reported.
exporter_scrape
    Milliseconds of one Prometheus scrape (``generate_latest`` of a registry holding ``RedisDelayCollector``, in the
    bench process) of a store with 100 queues in ``task_queues``, 1,000,000 [20,000] calls parked a day ahead and 50
    released per queue (10 at priority 9), ready in the broker's lists and in flight: median, min and max over 30
    [20] rounds, against the same scrape with the queue gauges left out (``queue_figures`` patched to find none),
    and ``rd.queues()`` alone (reported). Target: < 100 ms.
e2e_throughput
    Calls/s end to end, calls due now through one ``-P prefork -c 2`` worker with the precise releaser in
    it, 5,000 [300] calls a round, the sides taking turns over two rounds: delayed calls against the same
    tasks as plain Celery tasks, without and with a Redis result backend (target >= 0.95x); and a plain
    task never parked in an app with ``redisdelay_all_tasks`` against an app without the extension
    (``bench/plain_app.py``; target >= 0.98x).
send_due_now
    Calls/s of a plain task's ``apply_async()`` due now in an app with ``redisdelay_all_tasks`` and
    ``redisdelay_track_due_now`` (stored in flight and queued in one script), against Celery's own publish of the
    same call; one at a time, 5,000 [500] calls each, nobody consuming. Target: >= 1.0x.
e2e_due_now
    Calls/s end to end of calls due now, every one tracked (``redisdelay_track_due_now``), through one ``-P prefork
    -c 2`` worker, against the same tasks in an app without the extension and, when installed on Redis 7+,
    celery-redis-plus, at Celery's default prefetch (4) and at 1; 5,000 [300] calls a round, the sides taking
    turns over two rounds (``--quick``: prefetch 4 alone, no peer). Targets: >= 1.5x plain Celery, >= 1.0x
    celery-redis-plus.
e2e_due_now_io
    The same with a task that does some I/O, as real tasks do: each call writes once to the bench's Redis (an INCR,
    through a client made once per worker process), on every side. Same sizes and targets.
probe_cost
    Calls/s of ``e2e_due_now``'s workload (tracked no-op calls due now, one ``-P prefork -c 2`` worker, prefetch 4)
    with no probe (the baseline), with the shell test of ``redisdelay_probe_file``'s age that docs/kubernetes.rst
    gives, and with ``celery -A bench.app redisdelay probe -n <the worker>``, each probe run every second beside the
    worker (one run at a time, as a Kubernetes exec probe); the same worker in every round (its heartbeat and its
    file's touch are in all of them), 6 [3] rounds of 6,000 [1,500] calls each side, in each of the six orders
    in turn, after a warm-up. Also reported: each probe's wall and CPU time a run. Target: a cost under 1%
    (>= 0.99x), printed, not asserted.
recovery, long_run
    A ``-P prefork -c 1`` worker running a 20 s call and holding 50 [10] prefetched ones is SIGKILLed:
    seconds from the kill to each call's start on a second worker, with the default 30 s lease [3 s],
    against the same calls as plain Celery tasks watched for 75 [5] s (target: all within 45 s, none
    lost). ``long_run``: a 3-minute [9 s] run under the lease starts once.
recovery_due_now, long_run_due_now
    The same with a plain task's calls due now, tracked (``redisdelay_track_due_now``): a worker running one and
    holding six prefetched is SIGKILLed (target: all seven again within 45 s), and a 75 s run starts once.
burst
    5,000 [200] calls due at one instant drained by one ``-P prefork -c 2`` worker: lateness p50/p99,
    drain rate, worker RSS growth and Redis bytes per waiting call, for ours and Celery's own eta path at Celery's
    default prefetch (4) and at 1, and, at 1 and when installed (not with ``--quick``), celery-redis-plus
    (``bench/peer_app.py``). Targets: p99 at most 1.2x Celery's; RSS growth at most 5 MB.
limits
    On two ``-P prefork -c 2`` workers with precise releasers: a task with ``limit_rate="20/s"`` kept busy for
    30 [5] s, against a plain task with Celery's ``rate_limit="20/s"`` on the same workers (each keeps its own);
    calls/s and the most started in one second. Target: >= 0.95x the limit, <= 21 in a second. Then 1,000 [100]
    keys at 1/s each, a call per key due at one instant: the latest start after the due time, against the
    same calls without limits. Target: <= 2 s.
pause_fleet
    A task paused on two ``-P prefork -c 2`` workers (prefetch 4, precise releasers): 50 [10] of its calls wait in
    the broker's queue behind both workers' full prefetch when the pause is set (the workers come free 1 s later),
    200 [40] more fall due over 30 [4] s, and it is resumed 3 [1] s after the last is due; another task's calls run
    meanwhile, 20/s, each parked 1 s ahead. Against the same run without the pause: the paused task's starts from
    1 s after the pause to the resume (target 0), the resume to its last start (target <= 2 s), its duplicate and
    missing runs (target 0), and the other task's lateness: p99 of its calls due while paused (target: within
    noise of the run without the pause), p50 and p99 over the whole run, the resume's burst included.
workers_releasing
    The store's load when every worker runs its precise releaser (the default): on a redis-server of its own, 10 [2]
    idle ``--pool threads -c 1`` workers for 60 [5] s, against the same workers with
    ``redisdelay_precise_release=False``: commands/s, Redis CPU ms per second, EVALSHA and BZPOPMIN calls/s, and the
    difference per worker (reported, no target). Then 2,000 [200] calls due over 10 [3] s run by the releasing
    workers: each ran once, none early (targets), lateness p50/p99/max (reported).
release_rabbitmq
    Calls/s of ``rd.tick()`` releasing 5,000 [500] due calls to a RabbitMQ node of its own (Debian's
    ``rabbitmq-server``; skipped without it), each confirmed by the broker, against Celery's ``send_task`` of as
    many calls to the same node, unconfirmed and with ``confirm_publish``; the sides take turns over two rounds
    after a warm-up. Reported, no target.
worker_memory_rabbitmq
    RSS growth of a solo worker on RabbitMQ with 5,000 [500] calls parked an hour ahead, against a plain solo
    worker sent as many countdown tasks, measured once the queue stops draining into it (Celery raises its prefetch
    one eta task at a time; at most 3 minutes). Reported, no target.
e2e_rabbitmq
    Delayed calls end to end on a RabbitMQ node of its own (skipped without ``rabbitmq-server``): 5,000 [300] calls of a
    task that records its start (a TIME and an RPUSH) and does nothing else, all due 10 [2] s after the first send; ours
    parked in the bench's Redis and released to RabbitMQ as they fall due by the releaser in our worker, at the
    package's default (a tick's pace), against plain Celery's eta tasks (an app without the extension) held by its
    worker until due; one ``-P prefork -c 2`` worker per side at Celery's default prefetch (4), each on its own queue of
    the same node. Per side: drain rate (calls over due time to last start), lateness p50/p99 (start minus due, Redis
    clock) and the worker's RSS growth; the sides take turns over two rounds after a warm-up. Rows: drain rate and p99
    lateness; reported, no target.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import traceback
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from celery_redisdelay.testing import RedisServer

from .context import Context
from .figures import FIGURES
from .processes import ROOT, mem_available_bytes
from .provenance import software
from .report import FAILED, NOT_IMPLEMENTED, Row, table, write_json

DEFAULT_JSON = ROOT / "bench" / "results.json"

_started = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - _started:6.1f}s] {text}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--only", metavar="NAME[,NAME]", help=f"run only these figures: {', '.join(FIGURES)}")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"where to write the results ({DEFAULT_JSON})")
    args = parser.parse_args(argv)
    if args.only:
        names = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in names if name not in FIGURES]
        if unknown or not names:
            parser.error(f"unknown figure(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(FIGURES)}")
        args.names = [name for name in FIGURES if name in names]
    else:
        args.names = list(FIGURES)
    return args


def run_figure(ctx: Context, name: str) -> dict[str, Any]:
    """Run one figure; a failure becomes a result saying so, and whatever it started is stopped."""
    say(f"{name}: start")
    started = time.monotonic()
    try:
        result = FIGURES[name](ctx)
        rows = result.get("rows") or []
        implemented = any(row["ours"] != NOT_IMPLEMENTED for row in rows)
        result = {"status": "ok" if implemented else NOT_IMPLEMENTED, **result}
    except Exception as exc:  # noqa: BLE001 - one figure's failure must not stop the others
        traceback.print_exc()
        error = f"{type(exc).__name__}: {exc}"
        result = {"status": FAILED, "error": error, "rows": [Row(name, FAILED, "", target=error[:60]).as_dict()]}
    finally:
        ctx.processes.stop_all()
    result["seconds"] = round(time.monotonic() - started, 1)
    say(f"{name}: {result['status']} in {result['seconds']} s")
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # finally blocks stop what it started
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    figures: dict[str, dict[str, Any]] = {}
    server = RedisServer()
    ctx: Context | None = None
    try:
        server.start()
        redis_version = server.version()
        say(f"redis-server {redis_version} ({server.binary}) on {server.url}, pid {server.process.pid}")  # type: ignore[union-attr]
        ctx = Context(server.url, quick=args.quick, say=say, redis_pid=server.pid)
        for name in args.names:
            figures[name] = run_figure(ctx, name)
    finally:
        if ctx is not None:
            ctx.close()
        server.stop()
    data = {
        "meta": {
            "started_at": started_at,
            "seconds": round(time.monotonic() - _started, 1),
            "quick": args.quick,
            "sizes": asdict(ctx.sizes) if ctx is not None else {},
            "redis_server": redis_version,
            **software(ROOT),
            "mem_available_bytes": mem_available_bytes(),
        },
        "figures": figures,
    }
    print()
    print(table(figures))
    write_json(args.json, data)
    say(f"results written to {args.json}")
    return 1 if any(result["status"] == FAILED for result in figures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
