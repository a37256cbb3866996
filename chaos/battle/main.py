"""``python -m chaos --battle`` / ``python3 dev.py battle``: see ``chaos/battle/__init__.py``."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from bench.provenance import software

from ..cluster import ROOT
from ..faults import BEAT_KILL, BROKER_RESTART, CLIENT_KILL, REDIS_KILL, REDIS_RESTART, RELEASER_KILL, WORKER_KILL
from ..harness.console import say, seconds_since_start
from ..harness.lifecycle import begin, failed
from ..harness.report import injected_counts, publish
from . import __doc__ as usage
from .analysis import LATE_SECONDS, Outcome
from .plan import FAULT_KINDS, LONGEST_COUNTDOWN, WORKER_TERM, Mix, fault_counts, parse_shares, schedule
from .processes import parse_pools
from .report import keys_left, memory_table, rss_judgement, table, verdict

DEFAULT_JSON = Path(tempfile.gettempdir()) / "redisdelay-battle.json"
#: Faults per minute, unless given.
RATES = {
    WORKER_KILL: 4.0,
    WORKER_TERM: 0.5,
    BEAT_KILL: 0.5,
    RELEASER_KILL: 0.5,
    REDIS_KILL: 0.1,
    REDIS_RESTART: 0.0,
    CLIENT_KILL: 0.5,
    BROKER_RESTART: 0.0,  # the store's redis-server is the broker: its faults are the Redis ones above
}
#: Broker restarts per minute with ``--broker rabbitmq``, unless given: one in a 3-minute run.
RABBITMQ_RESTARTS = 0.34
DEBIAN_REDIS = "/usr/bin/redis-server"
#: 20 runs at a time: at 250 calls/s the sleeping calls (5 %, 0.8 s on average) and the locked ones (4 %, 0.175 s)
#: keep about 12 of them busy sleeping, so the 8 of prefork:2,prefork:2,threads:4 held the rate near 150/s
#: with both cores half idle. Three workers still: the fault schedule draws a worker among three.
DEFAULT_WORKERS = "prefork:4,prefork:4,threads:12"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m chaos --battle", description=(usage or "").split("\n")[0])
    size = parser.add_argument_group("size")
    size.add_argument("--minutes", type=float, default=3.0, help="sending time (3)")
    size.add_argument("--rate", type=float, default=100.0, help="calls sent a second in all (100)")
    size.add_argument("--mix", default="", help="shares by kind, e.g. now=0.6,cancel=0 (see plan.py's defaults)")
    size.add_argument(
        "--countdown-scale", type=float, default=1.0, help="the longest countdown is 600 s times this (1)"
    )
    size.add_argument("--batch-size", type=int, default=10, help="items of a keyed batch (10)")
    size.add_argument("--batch-wait", type=float, default=5.0, help="a batch's max_wait in s (5)")
    parser.add_argument("--workers", default=DEFAULT_WORKERS, help=f"pool:concurrency per worker ({DEFAULT_WORKERS})")
    parser.add_argument("--plain", action="store_true", help="plain Celery, no extension (the twin run)")
    parser.add_argument("--server", default=None, help="redis, valkey, or a server binary (default: as the tests)")
    parser.add_argument(
        "--broker",
        choices=("redis", "rabbitmq"),
        default="redis",
        help="the store's redis-server (redis, the default), or a RabbitMQ node of its own (Debian's "
        f"rabbitmq-server), restarted --broker-restarts times a minute ({RABBITMQ_RESTARTS:g})",
    )
    faults = parser.add_argument_group("faults per minute")
    for kind in FAULT_KINDS:
        option = "--" + kind.replace("_", "-") + "s"
        if kind == BROKER_RESTART:
            help_text = f"({RATES[kind]:g}; {RABBITMQ_RESTARTS:g} with --broker rabbitmq)"
            faults.add_argument(option, dest=kind, type=float, default=None, help=help_text)
        else:
            faults.add_argument(option, dest=kind, type=float, default=RATES[kind], help=f"({RATES[kind]:g})")
    parser.add_argument(
        "--visibility-timeout",
        type=float,
        default=None,
        help="kombu's visibility_timeout (default: the longest countdown + 60 s, so plain Celery does not deliver "
        "its eta messages again); redisdelay_queue_timeout is twice it",
    )
    parser.add_argument("--lease", type=float, default=None, help="redisdelay_lease (the package's 30 s)")
    parser.add_argument(
        "--kombu-unacked",
        action="store_true",
        help="redisdelay_skip_unacked False: kombu keeps its copy of the store's calls too",
    )
    parser.add_argument(
        "--track-due-now",
        action="store_true",
        help="redisdelay_track_due_now True: the calls due now go through the store too, tracked (the default)",
    )
    parser.add_argument(
        "--untracked",
        action="store_true",
        help="redisdelay_track_due_now False: the calls due now take Celery's own path, untracked",
    )
    parser.add_argument(
        "--acks-late", action="store_true", help="task_acks_late: Celery's at-least-once setting (for a plain twin)"
    )
    parser.add_argument("--late-seconds", type=float, default=LATE_SECONDS, help="late, per SIGKILL: after this")
    parser.add_argument("--deadline", type=float, default=None, help="give up the drain after this (s)")
    parser.add_argument(
        "--settle", type=float, default=15.0, help="end the drain once nothing was left to deliver for this long (15 s)"
    )
    parser.add_argument(
        "--quiet", type=float, default=12.0, help="after the drain, before the keys are listed (12 s: lock wake-ups)"
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"the report as JSON ({DEFAULT_JSON})")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0 or args.countdown_scale <= 0:
        parser.error("--minutes, --rate and --countdown-scale must be positive")
    if args.plain and (args.track_due_now or args.untracked or args.kombu_unacked):
        parser.error("--track-due-now, --untracked and --kombu-unacked are settings of the extension: not with --plain")
    if args.track_due_now and args.untracked:
        parser.error("--track-due-now and --untracked contradict each other")
    if args.broker == "rabbitmq" and args.track_due_now:
        parser.error("--track-due-now needs a Redis broker: on RabbitMQ the calls due now take Celery's own path")
    if args.broker_restart is None:
        args.broker_restart = RABBITMQ_RESTARTS if args.broker == "rabbitmq" else RATES[BROKER_RESTART]
    args.track_due_now = not (args.plain or args.untracked or args.broker == "rabbitmq")
    try:
        args.shares = parse_shares(args.mix)
        args.pools = parse_pools(args.workers)
    except ValueError as exc:
        parser.error(str(exc))
    args.longest_countdown = max(1.0, LONGEST_COUNTDOWN * args.countdown_scale)
    if args.visibility_timeout is None:
        args.visibility_timeout = round(args.longest_countdown + 60.0)
    if args.deadline is None:
        args.deadline = args.longest_countdown + 2 * args.visibility_timeout + 300.0
    return args


def choose_server(server: str | None) -> None:
    if server is None:
        return
    os.environ["REDISDELAY_REDIS_SERVER"] = DEBIAN_REDIS if server == "redis" else server


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed, run_dir = begin(args.seed, "redisdelay-battle-")
    choose_server(args.server)
    from .run import Battle  # after the server is chosen

    provenance = {**software(ROOT), "machine": f"{os.cpu_count()} cores"}  # the revision that runs, read now
    rates = {kind: float(getattr(args, kind)) for kind in FAULT_KINDS}
    faults = schedule(fault_counts(rates, args.minutes), seed, len(args.pools))
    battle = Battle(args, seed, run_dir, faults, Mix(seed, args.shares, args.countdown_scale), args.pools)
    error: str | None = None
    run: dict[str, Any] = {}
    server = "?"
    try:
        try:
            battle.start()
            server = battle.topology.store.version()
            run = battle.fight()
        except Exception:  # noqa: BLE001 - reported, and everything is still stopped
            error = failed("the battle")
        sends, starts, ends, cancels, received = (
            battle.read_ledger() if battle.ledger is not None else ({}, [], [], {}, [])
        )
        unplanned = battle.cluster.exits if battle.cluster is not None else []
    finally:
        battle.stop()
    letters: list[dict[str, Any]] = run.pop("dead_letters", [])
    say(
        f"analysing {len(sends):,} sends, {len(received):,} receipts, {len(starts):,} starts, {len(ends):,} ends, "
        f"{len(letters):,} dead letters"
    )
    fault_rows = [fault.as_dict() for fault in faults]
    outcome = Outcome(sends, starts, ends, cancels, fault_rows, received, letters, acks_late=args.acks_late).as_dict(
        late_seconds=args.late_seconds
    )
    empty = {"keys": {}, "dbsize": 0, "used_memory": 0}
    data: dict[str, Any] = {
        "settings": {
            "seed": seed,
            "plain": args.plain,
            "broker": args.broker,
            "minutes": args.minutes,
            "rate": args.rate,
            "shares": args.shares,
            "workers": args.workers,
            "longest_countdown": args.longest_countdown,
            "visibility_timeout": args.visibility_timeout,
            "queue_timeout": None if args.plain else 2 * args.visibility_timeout,
            "lease": args.lease,
            "kombu_unacked": args.kombu_unacked,
            "track_due_now": args.track_due_now,
            "acks_late": args.acks_late,
            "batch": [args.batch_size, args.batch_wait],
            "fault_rates_per_minute": rates,
        },
        "server": server,
        "software": provenance,
        "run": {key: value for key, value in run.items() if not key.startswith("keys_")},
        "outcome": outcome,
        "keys": keys_left(run.get("keys_start") or empty, run.get("keys_end") or empty),
        "memory": memory_table(battle.samples),
        "rss_flat": rss_judgement(battle.samples),
        "samples": battle.samples,
        "faults": {"counts": injected_counts(faults, FAULT_KINDS), "list": fault_rows},
        "send_errors": battle.send_errors,
        "producer_errors": battle.producer_errors,
        "unplanned_exits": unplanned,
        "error": error,
        "seconds": seconds_since_start(),
    }
    data["ok"], data["problems"] = verdict(data)
    ledger = {
        "sends": sends,
        "received": received,
        "starts": starts,
        "ends": ends,
        "cancels": cancels,
        "dead_letters": letters,
    }
    keep = args.keep_logs or not data["ok"]
    kept = "logs and the ledger (ledger.json)"
    return publish(data, table, args.json, run_dir, keep=keep, kept=kept, files={"ledger.json": ledger})
