"""The run's report as data: the result, why each duplicate and missing message, what each SIGKILL of Redis
cost, how long each fault kept its calls from running, and the verdict.

A message is missing for one of two reasons, told apart with the ledger: it was acknowledged to the
producer and gone after a SIGKILL of the store (within Redis's bound: acknowledged at most
:data:`chaos.harness.attribution.FSYNC_BOUND_SECONDS` before the kill; none at all with ``redisdelay_wait_replicas``
and a failover), or for any other reason, which must never happen.
"""

from __future__ import annotations

import os
from typing import Any

import redis

from bench.provenance import software
from celery_redisdelay import RedisDelay, ValidationReport

from .analysis import Explainer, WorkerLogs, read_runs, run_counts
from .cluster import ROOT
from .config import BROKER_VISIBILITY_TIMEOUT, CLAIM_TIMEOUT, RESTORE_INTERVAL, TICK_INTERVAL
from .faults import REDIS_KILL
from .harness.attribution import FSYNC_BOUND_SECONDS
from .history import check_history
from .ledger import CALL, DEBOUNCE, UNIQUE
from .recovery import per_fault, recoveries
from .run import WORKERS, LoggedRetry, Run
from .topology import PROMOTION_TIMEOUT, Sentinels

#: A Python process whose RSS grew more than this (and RSS_NOISE_SHARE) after warm-up is flagged.
RSS_NOISE_KIB = 8 * 1024
RSS_NOISE_SHARE = 0.10
#: Processes that lived shorter than this cannot tell growth from warm-up: their RSS is reported, not judged.
RSS_JUDGED_FROM_MINUTES = 5.0


def settings(run: Run) -> dict[str, Any]:
    args = run.args
    return {
        "mode": "soak" if args.soak is not None else "validation",
        "count": args.count if args.soak is None else None,
        "soak_minutes": args.soak,
        "rate": args.rate if args.soak is not None else None,
        "fail_every": args.fail_every if args.soak is not None else 2,
        "max_countdown": args.max_countdown if args.soak is not None else None,
        "seed": run.seed,
        "topology": run.topology.name,
        "wait_replicas": run.wait_replicas,
        "shards": args.shards,
        "timeout": args.timeout,
        "queue_timeout": args.queue_timeout,
        "deadline": args.deadline,
        "workers": WORKERS,
        "worker_options": "-O fair, prefetch multiplier 1, concurrency 2",
        "precise_in_worker": args.precise_in_worker,
        "max_tasks_per_child": args.max_tasks_per_child,
        "tick_interval": TICK_INTERVAL,
        "claim_timeout": CLAIM_TIMEOUT,
        "broker_visibility_timeout": BROKER_VISIBILITY_TIMEOUT,
        "broker_restore_interval": RESTORE_INTERVAL,
        "redis": f"appendonly yes, appendfsync {args.appendfsync}",
        "loss_bound_s": run.loss_bound(),
    }


def environment(run: Run) -> dict[str, Any]:
    try:
        redis_version = run.topology.version()
    except redis.RedisError:
        redis_version = "?"
    return {"redis_server": redis_version, **software(ROOT), "load_average": os.getloadavg()}


def losses(run: Run, missing: list[int]) -> dict[str, Any]:
    """What each SIGKILL of the store cost, and the missing messages split by cause."""
    bound = run.loss_bound()
    kills = []
    for fault in run.faults:
        if fault.kind != REDIS_KILL or not fault.injected:
            continue
        lost = fault.lost or []
        before = [row["before_kill"] for row in lost]
        kills.append(
            {
                "at": fault.elapsed,
                "exposed": fault.exposed,
                "lost": len(lost),
                "window_s": [min(before), max(before)] if before else None,
                "lost_calls": lost[:50],
                "detail": fault.detail,
            }
        )
    lost_rows = [row for fault in run.faults for row in fault.lost or []]
    beyond = [row for row in lost_rows if not 0 <= row["before_kill"] <= bound]
    switches = master_switches(run)
    for row in lost_rows:  # a failover loses what the master that lost its place had acknowledged around then
        if switches:
            acked = next(entry.t for entry in run.ledger.entries if entry.id == row["id"])
            nearest = min(switches, key=lambda switch: abs(switch["wall"] - acked))
            row["after_switch"] = round(acked - nearest["wall"], 3)
    numbers = run.ledger.by_number()
    lost_missing = [n for n in missing if n in numbers and numbers[n].id and numbers[n].id in run.lost_ids]
    return {
        "bound_s": bound,
        "master_switches": switches,
        "kills": kills,
        "lost": len(lost_rows),
        "lost_beyond_bound": len(beyond),
        "missing_lost_in_kills": len(lost_missing),
        "missing_other": len(missing) - len(lost_missing),
    }


def master_switches(run: Run) -> list[dict[str, Any]]:
    """The changes of master a Sentinel run saw, each marked planned (within the promotion time after one of the
    runner's SIGKILLs) or not."""
    if not isinstance(run.topology, Sentinels):
        return []
    kills = [fault.wall for fault in run.faults if fault.kind == REDIS_KILL and fault.wall is not None]
    switches = run.topology.switches
    planned = set()  # the first switch after each kill
    for kill in kills:
        after = [index for index, switch in enumerate(switches) if 0 <= switch["wall"] - kill <= PROMOTION_TIMEOUT]
        if after:
            planned.add(after[0])
    rows = []
    for index, switch in enumerate(switches):
        since = switch["wall"] - run.started_wall if run.started_wall else None
        rows.append({**switch, "at": round(since, 2) if since is not None else None, "planned": index in planned})
    return rows


def explain(run: Run, rd: RedisDelay, run_id: str, result: dict[str, Any]) -> tuple[dict[str, Any], Explainer]:
    """Read the event logs (the processes are stopped by now) and the store (Redis still runs)."""
    assert run.cluster is not None
    runs = read_runs(run.cluster.events_dir, run_id)
    explainer = Explainer(
        runs,
        run.cluster.members,
        run.faults,
        started_wall=run.started_wall,
        visibility_timeout=run.args.timeout,
        broker_visibility_timeout=BROKER_VISIBILITY_TIMEOUT,
        park_retried=run.park_retried,
        loss_window=FSYNC_BOUND_SECONDS,  # acknowledgements are never confirmed by a replica
        numbers_retried=run.numbers_retried,
        queue_timeout=run.args.queue_timeout,
    )
    for number, entry in run.ledger.by_number().items():
        if entry.id:
            explainer.by_number.setdefault(number, entry.id)
    missing = []
    for number in result["missing"][:200]:
        call_id = explainer.by_number.get(number)
        try:
            found = rd.find(call_id) if call_id else None
        except Exception:  # noqa: BLE001 - the explanation goes on without the store's view
            found = None
        store = {"state": found.state, "meta": found.meta} if found is not None else None
        missing.append(explainer.missing(number, store, lost=call_id in run.lost_ids))
    data = {
        "runs": run_counts(runs),
        "long_waits": recoveries(runs, run.ledger.ready(), run.args.queue_timeout),
        "duplicates_explained": [explainer.duplicate(number) for number in result["duplicates"]],
        "missing_explained": missing,
        "ack_failures_logged": len(explainer.ack_failed),
    }
    return data, explainer


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def first_start_lateness(run: Run, runs: dict[str, list[Any]]) -> dict[str, Any] | None:
    """From each call's due time (chosen by the producer) to its first start on a worker: plain and keyed
    calls (a locked call waits for its lock, a batch item for its batch, by design)."""
    late = []
    for entry in run.ledger.calls_before(float("inf")):
        calls = runs.get(entry.id)
        if entry.kind in (CALL, UNIQUE, DEBOUNCE) and entry.due is not None and calls:
            late.append(min(call.started for call in calls) - entry.due)
    if not late:
        return None
    return {
        "calls": len(late),
        "p50_s": round(quantile(late, 0.5), 3),
        "p99_s": round(quantile(late, 0.99), 3),
        "max_s": round(max(late), 3),
        "early": sum(value < -0.005 for value in late),  # started before the due time (clock rounding aside)
    }


def rss_flags(rows: list[dict[str, Any]]) -> list[str]:
    """The package's processes (workers and their pools, beat, the releaser) that lived through most of a soak
    and whose RSS in the last third of their life stayed above anything it reached before, beyond noise (see
    :meth:`chaos.measure.Series.summary`). Not judged: redis-server (its used_memory and keys are), and the
    runner, whose ledger holds every call it parked by design."""
    flagged = []
    for row in rows:
        if row["name"].startswith(("redis", "runner")) or row["to_s"] - row["from_s"] < RSS_JUDGED_FROM_MINUTES * 60:
            continue
        if row["growth_kib"] > max(RSS_NOISE_KIB, RSS_NOISE_SHARE * row["high_before_kib"]):
            flagged.append(f"{row['name']} (pid {row['pid']}): +{row['growth_kib']:,} KiB in its last third")
    return flagged


def assemble(run: Run, rd: RedisDelay, outcome: dict[str, Any], error: str | None) -> dict[str, Any]:
    report: ValidationReport | None = outcome.get("report")
    soak: dict[str, Any] | None = outcome.get("soak")
    result: dict[str, Any] = {}
    if report is not None:
        result = report.as_dict()
        result["extra_recordings"] = report.deliveries - report.failures - report.processed
    elif soak is not None:
        result = soak.pop("result")
    data: dict[str, Any] = {"settings": settings(run), "environment": environment(run), "result": result}
    try:
        data["store_after"] = rd.stats()
    except Exception as exc:  # noqa: BLE001 - reported
        data["store_after"] = f"unavailable: {exc!r}"
    recovery: list[dict[str, Any]] = []
    if result:
        analysis, explainer = explain(run, rd, result["run_id"], result)
        data.update(analysis)
        logs = WorkerLogs(explainer.ack_failed, explainer.broker_ack_lost, explainer.restores, explainer.receipts)
        recovery = per_fault(
            run.faults,
            explainer.runs,
            logs,
            run.ledger.ready(),
            run.ledger.dues(),
            visibility_timeout=run.args.timeout,
            queue_timeout=run.args.queue_timeout,
        )
    data["losses"] = losses(run, result.get("missing", []))
    data["history"] = None
    if report is not None:
        try:
            data["history"] = check_history(run, rd, result)
        except Exception as exc:  # noqa: BLE001 - reported
            data["history"] = {"ok": False, "error": repr(exc)}
    data["recovery"] = recovery
    if soak is not None:
        data["soak"] = soak
        soak["first_start_lateness"] = first_start_lateness(run, explainer.runs) if result else None
        soak["rss_grew"] = rss_flags(soak["rss"])
        soak["leaked_keys"] = [row for part in soak["redis"].values() for row in part["compare"]["leaked_keys"]]
    unexplained = [row for row in data.get("duplicates_explained", []) if not row["allowed"]]
    data.update(verdict(run, result, data["losses"], soak, error))
    if data["history"] is not None and not data["history"]["ok"]:
        data["problems"].append("the store's history does not match the ledger")
        data.update(ok=False, exit_status=1)
    data["unexplained_duplicates"] = len(unexplained)
    data["faults"] = {"list": [fault.as_dict() for fault in run.faults]}
    data["fault_errors"] = run.injector.failure if run.injector is not None else None
    data["processes"] = processes(run)
    data["hung_processes"] = run.hung
    data["unplanned_exits"] = [
        {**record, "at": round(record["wall"] - run.started_wall, 2) if run.started_wall else None}
        for record in (run.cluster.exits if run.cluster is not None else [])
    ]
    data["runner_retries"] = LoggedRetry.log
    data["parks_refused"] = run.parks_refused[:200]
    data["park_retried"] = sorted(run.park_retried)
    data["settled_early"] = outcome.get("settled_early", soak.get("settled_early") if soak else False)
    data["error"] = error
    return data


def verdict(
    run: Run, result: dict[str, Any], lost: dict[str, Any], soak: dict[str, Any] | None, error: str | None
) -> dict[str, Any]:
    problems = []
    if not result or error:
        problems.append("the run did not finish")
    if lost["missing_other"]:
        problems.append(f"{lost['missing_other']} messages missing for another reason than a SIGKILL of Redis")
    if lost["lost_beyond_bound"] and isinstance(run.topology, Sentinels):
        why = "confirmed by a replica" if run.wait_replicas else "not confirmed by a replica (asynchronous replication)"
        problems.append(f"a failover lost {lost['lost_beyond_bound']} acknowledged calls, {why}")
    elif lost["lost_beyond_bound"]:
        problems.append(f"{lost['lost_beyond_bound']} acknowledged calls lost beyond Redis's bound")
    if result.get("dead"):
        problems.append(f"{result['dead']} calls dead-lettered")
    if run.hung:
        problems.append(f"{len(run.hung)} pool processes hung (blocked on a lock for good)")
    if soak is not None:
        if soak["leaked_keys"]:
            problems.append(f"{len(soak['leaked_keys'])} keys left over after the drain")
        if soak["anomalies"] or soak["producer_errors"]:
            problems.append("unique/debounce anomalies or producer errors")
        if soak["rss_grew"]:
            problems.append(f"RSS grew beyond noise: {'; '.join(soak['rss_grew'])}")
    return {"ok": not problems, "exit_status": 0 if not problems else 1, "problems": problems}


def processes(run: Run) -> list[dict[str, Any]]:
    if run.cluster is None:
        return []
    started = run.started_wall
    return [
        {
            "name": member.name,
            "pid": member.pid,
            "started": round(member.started - started, 2) if started else None,
            "ready_seconds": member.ready_seconds,
            "ended": round(member.ended - started, 2) if member.ended and started else None,
            "how": member.how,
            "status": member.status,
        }
        for member in run.cluster.members
    ]
