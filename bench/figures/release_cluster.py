"""Releasing due calls from a store on a Redis Cluster: scaled out (3 shards on 3 masters, 3 releaser
processes) against one shard on a 1-master cluster with one releaser.

The broker is the harness's standalone redis-server (kombu has no Cluster transport), so every release
goes through kombu's publish path: the claim script on the shard, one kombu publish per call, then the
confirm script. Each side gets a fresh local cluster (``celery_redisdelay.testing.topologies.LocalCluster``)
and the same number of due calls, parked with ``park_many(countdown=0)``. The releaser processes
(``python -m bench.cluster_releaser``) are started and warmed up first, then all released at once by a
start signal; the time runs from that signal until the broker queue holds every call.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from redis.crc import key_slot

from celery_redisdelay.testing import CeleryProcess, wait_for
from celery_redisdelay.testing.topologies import LocalCluster, TopologyUnavailable

from ..app import build
from ..common import RELEASE_QUEUE
from ..context import Context
from ..processes import cpu_seconds
from ..report import SKIPPED, Row, ratio

SCALED = 3  # shards, masters and releaser processes of the scaled-out side
TARGET = 2.5
KEYS = "bench:release-cluster"  # ready/start/done keys of the releasers, in the broker's Redis
READY_TIMEOUT = 90.0
DEADLINE = 600.0
POLL = 0.005  # seconds between two counts of the broker queue


def cpus() -> dict[str, int | None]:
    return {"cpu_count": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0))}


def signal_keys() -> list[str]:
    return [f"{KEYS}:{name}" for name in ("ready", "start", "done")]


def exited_badly(process: CeleryProcess) -> bool:
    """A releaser that exited with an error (exiting with 0 once the store is empty is its normal end)."""
    return process.process is not None and process.process.poll() not in (None, 0)


def check(processes: list[CeleryProcess]) -> None:
    for process in processes:
        if exited_badly(process):
            assert process.process is not None
            code = process.process.returncode
            raise RuntimeError(f"releaser pid {process.pid} exited with status {code}:\n{process.output()[-2000:]}")


def measure(ctx: Context, masters: int, shards: int, releasers: int) -> dict[str, Any]:
    """Release N due calls from ``shards`` shards on a ``masters``-master cluster with ``releasers`` processes."""
    n = ctx.sizes.release_cluster
    label = f"{shards} shard{'s' * (shards > 1)}, {masters} master{'s' * (masters > 1)}, {releasers} releaser" + (
        "s" * (releasers > 1)
    )
    client = ctx.client
    cluster = LocalCluster(masters=masters)
    started = time.perf_counter()
    cluster.start()  # TopologyUnavailable goes to the caller: the figure is skipped
    processes: list[CeleryProcess] = []
    parker = None
    try:
        ctx.say(f"  {label}: cluster on ports {cluster.ports} up in {time.perf_counter() - started:.1f} s")
        client.unlink(RELEASE_QUEUE, *signal_keys())
        store_url = cluster.url.replace("redis://", "redis+cluster://")
        started = time.perf_counter()
        for index in range(releasers):
            args = [f"releaser-{index + 1}", "--store", store_url, "--shards", str(shards), "--keys", KEYS]
            if releasers == shards:
                args += ["--shard", str(index)]  # each releaser owns its shard: none competes for another's
            processes.append(ctx.processes.module("bench.cluster_releaser", args))

        def all_ready() -> bool:
            check(processes)
            return int(client.llen(f"{KEYS}:ready")) >= releasers

        wait_for(all_ready, READY_TIMEOUT, f"{releasers} releaser(s) to warm up", 0.05)
        pids = [process.pid for process in processes]
        ctx.say(f"  {label}: releasers warm in {time.perf_counter() - started:.1f} s (pids {pids})")

        parker = build(ctx.url, store_url=store_url, shards=shards)
        rd = parker.rd
        if rd.fast_release:
            raise RuntimeError("the store on the cluster uses the fast release path; expected kombu's")
        started = time.perf_counter()
        parker.delayed_noop.park_many([(i,) for i in range(n)], countdown=0, queue=RELEASE_QUEUE)
        park_seconds = time.perf_counter() - started
        due = rd.stats()["due"]
        if due != n:
            raise RuntimeError(f"expected {n} due calls, the store has {due}")
        per_node: dict[str, int] = {f"127.0.0.1:{port}": 0 for port in cluster.ports}
        per_shard: dict[str, int] = {}
        for store in rd.shards.stores:
            held = int(rd.client.zcard(store.keys.delayed))
            host, port = cluster.node_for_slot(key_slot(store.keys.delayed.encode()))
            per_node[f"{host}:{port}"] += held
            per_shard[store.keys.tag] = held
        share = ", ".join(f"{node} {count:,} ({count / n:.0%})" for node, count in per_node.items())
        ctx.say(f"  {label}: {n:,} due calls parked in {park_seconds:.1f} s; per master: {share}")

        servers = {"cluster": cluster.pids, "broker": [ctx.redis_pid] if ctx.redis_pid else []}
        cpu_before = {name: sum(cpu_seconds(pid) for pid in pids) for name, pids in servers.items()}
        bench_cpu = time.process_time()
        started = time.perf_counter()
        client.rpush(f"{KEYS}:start", *["go"] * releasers)
        deadline = started + DEADLINE
        checked = started
        while int(client.llen(RELEASE_QUEUE)) < n:
            now = time.perf_counter()
            if now > deadline:
                raise TimeoutError(f"{label}: {client.llen(RELEASE_QUEUE)} of {n} calls in the queue after {DEADLINE}")
            if now - checked > 0.5:
                check(processes)
                checked = now
            time.sleep(POLL)
        seconds = time.perf_counter() - started
        rate = n / seconds
        cpu = {name: sum(cpu_seconds(pid) for pid in pids) - cpu_before[name] for name, pids in servers.items()}
        cpu["bench"] = time.process_time() - bench_cpu

        def all_done() -> bool:
            check(processes)
            return int(client.llen(f"{KEYS}:done")) >= releasers

        wait_for(all_done, 60, f"{releasers} releaser(s) to report", 0.05)
        reports = [json.loads(raw) for raw in client.lrange(f"{KEYS}:done", 0, -1)]
        reports.sort(key=lambda report: str(report["label"]))
        stats = rd.stats()
        queued = int(client.llen(RELEASE_QUEUE))
        released = sum(int(report["released"]) for report in reports)
        if queued != n or released != n or stats["delayed"] or stats["dead"] or stats["inflight"] != n:
            raise RuntimeError(f"{label}: queue {queued}, releasers report {released}, store {stats}; expected {n}")
        by_releaser = ", ".join(
            f"{r['released']:,} in {r['seconds']:.2f} s ({r['ticks']} ticks, {r['cpu_seconds']:.1f} s cpu)"
            for r in reports
        )
        cpu["releasers"] = sum(float(report["cpu_seconds"]) for report in reports)
        cores = {name: used / seconds for name, used in cpu.items()}
        busy = ", ".join(f"{name} {used:.2f}" for name, used in cores.items())
        ctx.say(f"  {label}: {rate:,.0f} calls/s ({seconds:.2f} s); by releaser: {by_releaser}")
        ctx.say(f"  {label}: cores busy while releasing: {busy}; total {sum(cores.values()):.2f}")
        return {
            "masters": masters,
            "shards": shards,
            "releasers": releasers,
            "calls": n,
            "seconds": seconds,
            "calls_per_s": rate,
            "park_seconds": park_seconds,
            "per_master": per_node,
            "per_shard": per_shard,
            "by_releaser": reports,
            "cores_busy": cores,  # CPU seconds used while releasing / seconds, per kind of process
            "release_batch": rd.settings.release_batch,
            "fast_release": rd.fast_release,
        }
    finally:
        for process in processes:
            ctx.processes.stop(process)
        if parker is not None:
            parker.app.close()
            parker.rd.client.close()
        cluster.stop()
        client.unlink(RELEASE_QUEUE, *signal_keys())


def release_cluster(ctx: Context) -> dict[str, Any]:
    """Calls/s released from 3 shards on a 3-master cluster by 3 releasers, vs 1 shard, 1 master, 1 releaser."""
    machine = cpus()
    ctx.say(f"  cpus: {machine['cpu_count']} ({machine['usable_cpus']} usable by this process)")
    try:
        baseline = measure(ctx, masters=1, shards=1, releasers=1)
    except TopologyUnavailable as exc:
        reason = str(exc)
        ctx.say(f"  skipped: {reason}")
        row = Row("release_cluster", SKIPPED, "calls/s", target=f"skipped: {reason}"[:60])
        return {"status": SKIPPED, "reason": reason, "rows": [row.as_dict()], "details": machine}
    scaled = measure(ctx, masters=SCALED, shards=SCALED, releasers=SCALED)
    found = ratio(scaled["calls_per_s"], baseline["calls_per_s"])
    ctx.say(f"  scale-out: {found or 0:.2f}x on {machine['cpu_count']} cpus (goal >= {TARGET}x where cores allow)")
    row = Row(
        "release_cluster",
        scaled["calls_per_s"],
        "calls/s",
        baseline["calls_per_s"],
        "1 shard/master/releaser",
        found,
        f">= {TARGET}x where cores allow ({machine['cpu_count']} cpus)",
        found is not None and found >= TARGET,
    )
    details = {**machine, "baseline": baseline, "scaled": scaled}
    return {"rows": [row.as_dict()], "details": details}
