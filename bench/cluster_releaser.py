"""One releaser process of the ``release_cluster`` figure: ``rd.tick()`` in a loop until the store holds no
delayed call, started by a signal in the broker's Redis so that its start-up is not timed.

``python -m bench.cluster_releaser LABEL --store redis+cluster://127.0.0.1:PORT --shards N --keys PREFIX``
(the broker is ``$REDISDELAY_BENCH_URL``, database 0, as for every bench process):

1. warm up: connect to the cluster (slot map) and to the broker, run a tick on the (still empty) store,
   which loads the sweep and claim scripts on every shard, load the confirm script (a confirm of an id
   the store does not hold changes nothing), and declare the release queue through the producer;
2. ``RPUSH PREFIX:ready LABEL``, then ``BLPOP PREFIX:start``;
3. tick until the store (with ``--shard N``, its shard N alone) holds no delayed call;
4. ``RPUSH PREFIX:done`` a JSON report: calls this process released, ticks, seconds from its start signal
   and the CPU seconds it used meanwhile.

With ``--profile PATH`` step 3 runs under cProfile and the statistics are written to PATH.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import sys
import time
from typing import Any

import redis

from .app import build
from .common import ENV_URL, RELEASE_QUEUE

DEADLINE = 600.0  # seconds a release may take before the process gives up
WAIT_FOR_START = 600.0


def release_all(rd: Any, shard: int | None = None) -> tuple[int, int]:
    """Tick (over every shard, or over ``shard`` alone) until it holds no delayed call: (calls this
    process released, ticks)."""
    released = ticks = 0
    deadline = time.monotonic() + DEADLINE
    shards = None if shard is None else [shard]
    while True:
        report = rd.tick(shards=shards)
        ticks += 1
        released += report["released"]
        left = rd.stats() if shard is None else rd.shards.stores[shard].stats()
        if left["delayed"] == 0:
            return released, ticks
        if time.monotonic() > deadline:
            raise TimeoutError(f"released {released} calls in {DEADLINE:.0f} s and the store still holds some")


def wait_for_start(signals: redis.Redis, key: str) -> bool:
    """BLPOP ``key`` a second at a time (a longer BLPOP would outlast the client's 5 s socket timeout)."""
    deadline = time.monotonic() + WAIT_FOR_START
    while time.monotonic() < deadline:
        if signals.blpop([key], timeout=1) is not None:
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_releaser")
    parser.add_argument("label")
    parser.add_argument("--store", required=True, help="redisdelay_url of the store")
    parser.add_argument("--shards", type=int, required=True, help="redisdelay_shards")
    parser.add_argument("--keys", required=True, help="prefix of the ready/start/done keys in the broker's Redis")
    parser.add_argument("--shard", type=int, help="release this shard only (releasers that own a shard each)")
    parser.add_argument("--profile", help="write cProfile statistics of the release loop here")
    args = parser.parse_args(argv)
    broker_url = os.environ[ENV_URL]
    bench = build(broker_url, store_url=args.store, shards=args.shards)
    rd = bench.rd
    signals = redis.Redis.from_url(f"{broker_url}/0")

    rd.stats()
    rd.tick()
    for store in rd.shards.all():
        store.confirm([f"warm-up-{args.label}"], 1000)
    with bench.app.producer_or_acquire() as producer:
        producer.connection.ensure_connection()
        producer.maybe_declare(bench.app.amqp.queues[RELEASE_QUEUE])
    print(f"{args.label}: warm (pid {os.getpid()}, {args.shards} shards, fast release {rd.fast_release})", flush=True)

    signals.rpush(f"{args.keys}:ready", args.label)
    if not wait_for_start(signals, f"{args.keys}:start"):
        print(f"{args.label}: no start signal in {WAIT_FOR_START:.0f} s", flush=True)
        return 1
    started, cpu = time.monotonic(), time.process_time()
    if args.profile:
        profiler = cProfile.Profile()
        released, ticks = profiler.runcall(release_all, rd, args.shard)
        seconds = time.monotonic() - started
        profiler.dump_stats(args.profile)
    else:
        released, ticks = release_all(rd, args.shard)
        seconds = time.monotonic() - started
    cpu = time.process_time() - cpu
    report = {
        "label": args.label,
        "pid": os.getpid(),
        "released": released,
        "ticks": ticks,
        "seconds": seconds,
        "cpu_seconds": cpu,
    }
    signals.rpush(f"{args.keys}:done", json.dumps(report))
    print(f"{args.label}: released {released} calls in {ticks} ticks, {seconds:.2f} s", flush=True)
    bench.app.close()
    rd.client.close()
    signals.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
