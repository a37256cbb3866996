"""The validation of seed 001 under faults, and the soak: nothing may go missing, nothing may leak.

Usage::

    python -m chaos                                    # 10,000 messages, every fault (a few minutes)
    python -m chaos --count 2000 --worker-kills 5 --beat-kills 2 --releaser-kills 2 \\
        --redis-restarts 1 --redis-kills 2 --client-kills 3 --shards 2     # the CI size
    python -m chaos --redis-kills 6 --worker-kills 0 ...                    # SIGKILLs of the store's Redis
    python -m chaos --broker-apart --broker-kills 3 ...                     # the broker on its own Redis
    python -m chaos --sentinel --redis-kills 3 ...                          # master SIGKILL, Sentinel failover
    python -m chaos --soak 10 --broker-apart                                # 10 minutes of steady load
    python -m chaos --seed 7 --json /tmp/chaos.json    # the same fault plan again, the report there
    python -m chaos --battle --minutes 3 --rate 100         # the battle: an adopting app beside plain Celery
                                                            # (chaos/battle/__init__.py has its options)

One command does everything. It starts its Redis (``chaos/topology.py``: one redis-server, the broker
on a second one with ``--broker-apart``, or a master, its replica and three sentinels with
``--sentinel``; all on 127.0.0.1, ``appendonly yes``, ``appendfsync everysec`` unless
``--appendfsync always``), two workers (``-O fair``, prefetch multiplier 1, concurrency 2), beat and a
precise releaser (``celery -A chaos.app redisdelay releaser``), all running ``chaos.app``. Then it runs
the validation (``chaos/validate.py``: ``count`` messages parked at once for a consumer that fails
every other delivery with ``Abandon``), or with ``--soak MINUTES`` the soak (``chaos/soak.py``: calls
parked at a steady rate, then a drain and the leak check). Meanwhile a thread injects faults at points
drawn from a seeded RNG, spread over the run (``chaos/faults.py``):

* ``--worker-kills``: SIGKILL a worker's process group (the worker and its pool), start a new one;
* ``--beat-kills``: SIGKILL beat, start it again;
* ``--releaser-kills``: SIGKILL the releaser, start it again;
* ``--redis-restarts``: SIGTERM the store's redis-server (it syncs its append-only file and exits) and
  start it again on the same port and directory; every client must reconnect;
* ``--redis-kills``: SIGKILL the store's redis-server and start it again from its append-only file;
  with ``--sentinel``, SIGKILL the master: the Sentinels promote the replica, the old master comes
  back as its replica. After each, the runner counts the calls acknowledged to it before the kill
  that are gone (``chaos/ledger.py``);
* ``--broker-kills`` / ``--broker-restarts`` (with ``--broker-apart``): the same for the broker's Redis;
* ``--client-kills``: ``CLIENT KILL TYPE normal`` on the store's Redis: every client connection is dropped.

``--precise-in-worker`` runs the precise releaser in a thread of each worker too, and
``--max-tasks-per-child N`` has each worker replace (fork anew) a pool process after every N tasks: the
workers fork while the releaser thread runs scripts, as production workers do. A watch samples every
worker's pool processes through the run (``chaos/hung.py``); one blocked on a lock for good is a hung
process, counted in the report beside lost and duplicated calls.

The runner's own parks retry what Redis refused (``chaos/run.py``); the workers, beat and releaser run
the package as it is. A process that exits on its own (Celery 5.7 workers can die with "Unrecoverable
error: AttributeError ... 'hostname'" when the broker connection breaks) is started again, as systemd
would, and reported as an unplanned exit.

At the end it prints the report (expected, processed, missing, duplicates with an explanation each,
the calls each SIGKILL of Redis cost, how long each fault kept its calls from running; for a soak the
memory of every process and what Redis holds before and after) and writes it as JSON. It stops
everything it started, by PID. Exit status 0 if and only if nothing is missing but what a SIGKILL of
Redis may lose within Redis's own bound, nothing was dead-lettered, no pool process hung, and (soak) no key
leaked. The logs
of every process are kept when the run fails or with ``--keep-logs``; otherwise they are deleted.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from .config import BROKER_VISIBILITY_TIMEOUT
from .faults import EARLIEST, KINDS, plan
from .harness.console import seconds_since_start
from .harness.lifecycle import begin, failed
from .harness.report import injected_counts, publish
from .outcome import assemble
from .report import table
from .run import WORKERS, Run, fault_counts

DEFAULT_JSON = Path(tempfile.gettempdir()) / "redisdelay-chaos.json"
#: Faults of a validation run, unless given.
VALIDATION_FAULTS = {
    "worker_kills": 20,
    "beat_kills": 10,
    "releaser_kills": 10,
    "redis_restarts": 2,
    "redis_kills": 2,
    "broker_restarts": 0,
    "broker_kills": 0,
    "client_kills": 10,
}
#: Faults of a soak per minute, unless given.
SOAK_FAULTS_PER_MINUTE = {
    "worker_kills": 0.6,
    "beat_kills": 0.3,
    "releaser_kills": 0.3,
    "redis_restarts": 0.0,
    "redis_kills": 0.3,
    "broker_restarts": 0.0,
    "broker_kills": 0.3,
    "client_kills": 0.3,
}
#: A soak's faults fall between this share of its time and LATEST (a warm-up first).
SOAK_EARLIEST = 0.1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--count", type=int, default=10_000, help="validation messages (10000)")
    faults = parser.add_argument_group("faults (a validation's defaults; a soak's are per minute, see the README)")
    for option, help_text in [
        ("--worker-kills", "SIGKILL a worker, start a new one"),
        ("--beat-kills", "SIGKILL beat, start it again"),
        ("--releaser-kills", "SIGKILL the releaser, start it again"),
        ("--redis-restarts", "SIGTERM the store's redis-server, start it again"),
        ("--redis-kills", "SIGKILL the store's redis-server, restart it from its AOF (Sentinel: fail over)"),
        ("--broker-restarts", "SIGTERM the broker's redis-server (with --broker-apart)"),
        ("--broker-kills", "SIGKILL the broker's redis-server, restart it from its AOF (with --broker-apart)"),
        ("--client-kills", "CLIENT KILL TYPE normal on the store's Redis"),
    ]:
        name = option[2:].replace("-", "_")
        faults.add_argument(option, type=int, default=None, help=f"{help_text} ({VALIDATION_FAULTS[name]})")
    redis_side = parser.add_argument_group("the Redis side")
    layout = redis_side.add_mutually_exclusive_group()
    layout.add_argument("--broker-apart", action="store_true", help="the broker on a redis-server of its own")
    layout.add_argument(
        "--sentinel", action="store_true", help="master + replica + 3 sentinels (quorum 2); broker and store on it"
    )
    redis_side.add_argument(
        "--wait-replicas", type=int, default=None, help="redisdelay_wait_replicas (1 with --sentinel, else 0)"
    )
    redis_side.add_argument("--appendfsync", choices=("everysec", "always"), default="everysec")
    redis_side.add_argument("--shards", type=int, default=1, help="redisdelay_shards of the app (1)")
    workers = parser.add_argument_group("the workers")
    workers.add_argument(
        "--precise-in-worker", action="store_true", help="the workers run the precise releaser in a thread too"
    )
    workers.add_argument(
        "--max-tasks-per-child",
        type=int,
        default=0,
        help="replace each pool process after this many tasks, forking a new one (0: never)",
    )
    soak = parser.add_argument_group("the soak")
    soak.add_argument("--soak", type=float, default=None, metavar="MINUTES", help="park for this long, then drain")
    soak.add_argument("--rate", type=float, default=20.0, help="calls parked a second in all (20)")
    soak.add_argument("--max-countdown", type=float, default=60.0, help="the longest countdown of a call (60 s)")
    soak.add_argument("--fail-every", type=int, default=2, help="fail every n-th delivery on purpose (2; 0: never)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault plan (default: a random one)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"where to write the report ({DEFAULT_JSON})")
    parser.add_argument("--timeout", type=float, default=1.0, help="the consumer's visibility timeout in s (1.0)")
    parser.add_argument(
        "--queue-timeout",
        type=float,
        default=None,
        help="how long a released call may wait in the broker queue before the sweep takes it for lost (default: "
        "max(90, 0.03 * count) s for a validation, twice kombu's visibility timeout for a soak; it must outlast "
        "the backlog and kombu's own restore)",
    )
    parser.add_argument(
        "--deadline", type=float, default=None, help="give up the validation (1800 s) or the drain (600 s) after this"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs even when the run passes")
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.count < 1:
        parser.error("--count must be at least 1")
    if args.max_tasks_per_child < 0:
        parser.error("--max-tasks-per-child must not be negative")
    if args.soak is not None and (args.soak <= 0 or args.rate <= 0 or args.max_countdown < 0):
        parser.error("--soak and --rate must be positive, --max-countdown not negative")
    if args.fail_every == 1 or args.fail_every < 0:
        parser.error("--fail-every must be 0 (never) or at least 2")
    for name, default in VALIDATION_FAULTS.items():
        given = getattr(args, name)
        if given is not None and given < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative")
        if given is None:
            unusable = (name.startswith("broker") and not args.broker_apart) or (
                name == "redis_restarts" and args.sentinel
            )
            per_minute = SOAK_FAULTS_PER_MINUTE[name] * args.soak if args.soak is not None else None
            given = 0 if unusable else (round(per_minute) if per_minute is not None else default)
        setattr(args, name, given)
    if (args.broker_kills or args.broker_restarts) and not args.broker_apart:
        parser.error("--broker-kills and --broker-restarts need --broker-apart (else they are --redis-kills)")
    if args.redis_restarts and args.sentinel:
        parser.error("with --sentinel a fault of the master is --redis-kills (a SIGKILL and a failover)")
    if args.wait_replicas is None:
        args.wait_replicas = 1 if args.sentinel else 0
    if args.wait_replicas and not args.sentinel:
        parser.error("--wait-replicas needs a replica: use it with --sentinel")
    if args.queue_timeout is None:
        soak = args.soak is not None
        args.queue_timeout = 2.0 * BROKER_VISIBILITY_TIMEOUT if soak else max(90.0, 0.03 * args.count)
    if args.deadline is None:
        args.deadline = 600.0 if args.soak is not None else 1800.0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--battle" in argv:  # the battle profile (issue 33): chaos/battle/__init__.py
        from .battle.main import main as battle

        return battle([arg for arg in argv if arg != "--battle"])
    args = parse_args(argv)
    seed, run_dir = begin(args.seed, "redisdelay-chaos-")  # a SIGTERM's exit runs the finally blocks below
    soak = args.soak is not None
    faults = plan(
        fault_counts(args),
        random.Random(seed),
        WORKERS,
        earliest=SOAK_EARLIEST if soak else EARLIEST,
        parking=None if soak else (EARLIEST, 0.1),
    )
    run = Run(args, seed, run_dir, faults)
    outcome: dict[str, Any] = {}
    error: str | None = None
    try:
        rd = run.start()
        try:
            if soak:
                from .soak import Soak

                outcome["soak"] = Soak(run, rd).soak()
            else:
                from .validate import validate

                outcome["report"], outcome["settled_early"] = validate(run, rd)
        except Exception:  # noqa: BLE001 - reported, and everything is still stopped
            error = failed("the run")
        assert run.cluster is not None
        run.check_hung()  # before the workers stop: a hung pool process is still there to be seen
        run.cluster.close()
        data = assemble(run, rd, outcome, error)
    finally:
        run.stop()

    keep = args.keep_logs or not data["ok"] or bool(data.get("unexplained_duplicates"))
    data["seconds"] = seconds_since_start()
    data["faults"]["counts"] = injected_counts(run.faults, KINDS)
    return publish(data, table, args.json, run_dir, keep=keep)


if __name__ == "__main__":
    sys.exit(main())
