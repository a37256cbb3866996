"""Run Celery's integration tests with and without the extension and compare (``python3 dev.py celery-suite``).

Usage::

    python -m celery_suite                          # test_tasks.py and test_canvas.py, every mode
    python -m celery_suite --quick                  # test_tasks.py only
    python -m celery_suite --full                   # every file of t/integration on a Redis broker and backend
    python -m celery_suite --files t/integration/test_beat.py --modes plain,delayed
    python -m celery_suite --ci                     # the tests about delays, events, results (CI runs this)
    python -m celery_suite --modes plain,all-tasks -k chord
    python -m celery_suite --json /tmp/suite.json   # the outcomes, test by test

It takes the sdist of the installed Celery (:mod:`celery_suite.sdist`), starts a redis-server on 127.0.0.1 for
the broker and the result backend (and the store), runs pytest on Celery's files once per mode
(:mod:`celery_suite.modes`, applied by :mod:`celery_suite.plugin`), flushing Redis between modes, prints one
line per test that does not pass everywhere and a summary, and stops the redis-server by its PID. Exit status 1
when a test passing in ``plain`` does not pass in another mode and :mod:`celery_suite.differences` does not
name it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from celery_redisdelay.testing import RedisServer

from .differences import DIFFERENCES
from .modes import ENV_MODE, MODES
from .outcomes import PASSED, Comparison, compare, read
from .sdist import ROOT, installed_celery, unpacked
from .selection import DEFAULT_FILES, NOT_REDIS, NOT_REDIS_TESTS, QUICK_FILES, full_files

FILES = DEFAULT_FILES
#: What fits CI's budget (``--ci``): the tests of test_tasks.py about delays, retries, expiry, revokes and
#: results (each mode about a minute here, against four for all of test_tasks.py), the two of them that look for
#: the Redis result backend's subscription right after a call (``asyncresult``), and two that once failed only
#: with the extension: the task-sent event through the caller's producer, and the eta a chord's header sees.
CI_SELECTION = (
    "(test_tasks.py and (eta or expired or retried or retry_preserves or simple_call or basic_task or ignore_result "
    "or properties or reject or test_revoked or asyncresult) and not headers and not elsewhere) "
    "or test_task_sent_event_respects_publish_retry_limit or test_group_or_task_countdown_delays_header"
)


def run_mode(
    folder: Path,
    files: tuple[str, ...],
    server: RedisServer,
    mode: str,
    select: str | None,
    deselect: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run Celery's ``files`` in ``mode``: the outcome of each test, and how long it took."""
    with tempfile.TemporaryDirectory(prefix="celery-suite-") as scratch:
        junit = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", *files, "-q", "-p", "celery_suite.plugin", "-p", "no:cacheprovider"]
        command += ["-o", "addopts=--strict-markers", "--junitxml", str(junit), "-W", "ignore::DeprecationWarning"]
        if select:
            command += ["-k", select]
        for test in deselect:
            command += ["--deselect", test]
        env = {
            **os.environ,
            ENV_MODE: mode,
            "TEST_BROKER": f"{server.url}/0",
            "TEST_BACKEND": f"{server.url}/0",
            "REDIS_HOST": "127.0.0.1",
            "REDIS_PORT": str(server.port),
            # The plugin and the package from this checkout; Celery's tests (``t``) from the sdist.
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(folder)]),
            # Some tests start `celery` processes: this Python's (test_serialization.py).
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        }
        started = time.monotonic()
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - started
        tail = done.stdout.strip().splitlines()[-1:] or done.stderr.strip().splitlines()[-1:]
        print(f"celery-suite: {mode}: {tail[0] if tail else '?'} ({seconds:.0f} s)", flush=True)
        if not junit.exists():
            raise RuntimeError(f"pytest wrote no report in mode {mode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        return {"outcomes": read(junit), "seconds": seconds, "output": done.stdout[-20000:]}


def report(comparison: Comparison, results: dict[str, dict[str, Any]], modes: list[str]) -> str:
    """The tests that do not pass in every mode, one line each, and a summary per mode."""
    lines = [f"{'test':<100}  " + "  ".join(f"{mode:<9}" for mode in modes)]
    for test, outcome in comparison.rows:
        if any(value != PASSED for value in outcome.values()):
            lines.append(f"{test[-100:]:<100}  " + "  ".join(f"{outcome.get(mode, '-'):<9}" for mode in modes))
    lines.append("")
    for mode in modes:
        outcomes = results[mode]["outcomes"]
        counts = {kind: sum(value == kind for value in outcomes.values()) for kind in sorted(set(outcomes.values()))}
        summary = ", ".join(f"{count} {kind}" for kind, count in counts.items())
        lines.append(f"{mode}: {summary} in {results[mode]['seconds']:.0f} s")
        for test, reason in comparison.explained.get(mode, {}).items():
            lines.append(f"  explained: {test}: {reason}")
        for test in comparison.unexplained.get(mode, []):
            lines.append(f"  UNEXPLAINED: {test} passes with Celery alone, not here")
    lines.append("celery-suite: OK" if comparison.ok else "celery-suite: FAILED (unexplained differences)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m celery_suite", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="test_tasks.py only")
    which.add_argument(
        "--full", action="store_true", help="every file of t/integration that runs on a Redis broker and backend"
    )
    which.add_argument("--files", default=None, help="comma-separated paths of t/integration files, to run those")
    parser.add_argument("--ci", action="store_true", help="what fits CI: the tests about delays, events, results")
    parser.add_argument("-k", dest="select", default=None, help="pytest's -k, to run some tests")
    parser.add_argument("--json", type=Path, default=None, help="write the outcomes here")
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if "plain" not in modes or any(mode not in MODES for mode in modes):
        parser.error(f"--modes must include plain, and name only {', '.join(MODES)}")
    celery_version = installed_celery()
    folder = unpacked(celery_version)
    if args.ci:
        args.select = args.select or CI_SELECTION
    files: tuple[str, ...] = QUICK_FILES if args.quick else FILES
    deselect: tuple[str, ...] = ()
    if args.full:
        files, deselect = full_files(folder), tuple(NOT_REDIS_TESTS)
        for path, reason in {**NOT_REDIS, **NOT_REDIS_TESTS}.items():
            print(f"celery-suite: --full leaves out {path}: {reason}", flush=True)
    elif args.files:
        files = tuple(path.strip() for path in args.files.split(",") if path.strip())
        deselect = tuple(test for test in NOT_REDIS_TESTS if test.split("::")[0] in files)
    print(f"celery-suite: Celery {celery_version}'s {', '.join(files)} from {folder}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    with RedisServer() as server:
        for mode in modes:
            server.client().flushall()
            results[mode] = run_mode(folder, files, server, mode, args.select, deselect)
            if args.json is not None:  # after each mode: a long run stopped half way keeps what it measured
                data = {mode: {key: r[key] for key in ("seconds", "outcomes", "output")} for mode, r in results.items()}
                args.json.write_text(json.dumps({"celery": celery_version, "modes": data}, indent=1))
    comparison = compare({mode: result["outcomes"] for mode, result in results.items()}, DIFFERENCES)
    print(report(comparison, results, modes))
    return 0 if comparison.ok else 1


if __name__ == "__main__":
    sys.exit(main())
