"""The worker, beat and releaser subprocesses a figure needs, stopped by PID; worker memory from /proc."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from celery_redisdelay.testing import CeleryProcess, wait_for
from celery_redisdelay.testing import beat as beat_process

from .common import (
    ENV_ALL_TASKS,
    ENV_KOMBU_UNACKED,
    ENV_LEASE,
    ENV_PARK_RECEIVED,
    ENV_PRECISE,
    ENV_PREFETCH,
    ENV_RESULTS,
    ENV_TICK,
    ENV_TRACK,
    ENV_URL,
    PRECISE_OFF,
    PRECISE_ON,
)

ROOT = Path(__file__).resolve().parent.parent
APP = "bench.app"
READY_TIMEOUT = 60.0


def rss_mb(pid: int) -> float:
    """VmRSS of one process (not its children), in MB (2**20 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time one process (not its children) has used so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def mem_available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


class ModuleProcess(CeleryProcess):
    """``python -m <module> <args>`` in its own session, with its output in a file; stopped like a Celery process."""

    def argv(self) -> list[str]:
        return [sys.executable, "-m", self.app, *self.command]


class Processes:
    """Starts ``celery -A bench.app ...`` subprocesses for one Redis, and stops every one it started."""

    def __init__(self, url: str, say: Callable[[str], None]) -> None:
        self.url = url
        self.say = say
        self.running: list[CeleryProcess] = []

    def env(
        self,
        *,
        tick_interval: float = 1.0,
        precise: bool = False,
        releasing: bool = True,
        park_received: bool = False,
        results: bool = False,
        prefetch: int = 1,
        lease: float | None = None,
        all_tasks: bool = False,
        kombu_unacked: bool = False,
        track: bool = False,
    ) -> dict[str, str]:
        return {
            ENV_TRACK: "1" if track else "0",
            ENV_ALL_TASKS: "1" if all_tasks else "0",
            ENV_KOMBU_UNACKED: "1" if kombu_unacked else "0",
            ENV_PREFETCH: str(prefetch),
            ENV_LEASE: "" if lease is None else str(lease),
            ENV_RESULTS: "1" if results else "0",
            ENV_URL: self.url,
            ENV_TICK: str(tick_interval),
            ENV_PRECISE: PRECISE_ON if precise else ("0" if releasing else PRECISE_OFF),
            ENV_PARK_RECEIVED: "1" if park_received else "0",
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",  # their output reaches the log file as it is written
        }

    def _start(self, command: list[str], env: dict[str, str], app: str = APP) -> CeleryProcess:
        return self._track(CeleryProcess(app, command, env, str(ROOT)))

    def _track(self, process: CeleryProcess) -> CeleryProcess:
        self.running.append(process)
        process.start()
        return process

    def worker(
        self,
        name: str,
        *,
        queues: str,
        pool: str = "prefork",
        concurrency: int = 1,
        tick_interval: float = 1.0,
        precise: bool = False,
        releasing: bool = True,
        park_received: bool = False,
        results: bool = False,
        prefetch: int = 1,
        lease: float | None = None,
        app: str = APP,
        all_tasks: bool = False,
        kombu_unacked: bool = False,
        track: bool = False,
        wait: bool = True,
    ) -> CeleryProcess:
        """A worker of ``app`` (the bench's own by default), waited for until it is ready (``wait=False``: started
        only; the caller waits with :meth:`wait_ready`, so that several workers start side by side).

        ``releasing=False`` sets ``redisdelay_precise_release=False`` (the worker runs no releaser); by default a
        worker of the bench's app has the package's default (it runs one), ``precise=True`` says so explicitly."""
        command = [
            "worker",
            "--loglevel=INFO",
            f"--pool={pool}",
            f"--concurrency={concurrency}",
            f"--hostname={name}@%h",
            f"--queues={queues}",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        process = self._start(
            command,
            self.env(
                tick_interval=tick_interval,
                precise=precise,
                releasing=releasing,
                park_received=park_received,
                results=results,
                prefetch=prefetch,
                lease=lease,
                all_tasks=all_tasks,
                kombu_unacked=kombu_unacked,
                track=track,
            ),
            app,
        )
        if wait:
            self.wait_ready(process)
            self.say(f"  worker {name} ready (pid {process.pid}, pool {pool}, queues {queues})")
        return process

    def module(self, module: str, args: list[str], env: dict[str, str] | None = None) -> CeleryProcess:
        """``python -m module args`` with the bench environment (plus ``env``); not waited for."""
        return self._track(ModuleProcess(module, args, {**self.env(), **(env or {})}, str(ROOT)))

    def wait_ready(self, process: CeleryProcess, marker: str = "ready.") -> None:
        def ready() -> bool:
            self.check_alive(process)
            return marker in process.output()

        wait_for(ready, READY_TIMEOUT, f"celery {process.command[0]} to be ready", interval=0.1)

    def beat(self, *, tick_interval: float) -> CeleryProcess:
        process = self._track(beat_process(APP, env=self.env(tick_interval=tick_interval), cwd=str(ROOT)))
        self.wait_ready(process, "beat: Starting")
        self.say(f"  beat started (pid {process.pid}, tick every {tick_interval} s)")
        return process

    def releaser(self, *, settle: float = 1.0) -> CeleryProcess:
        """The package's precise releaser (``celery redisdelay releaser``), with precise release on.

        Ready once it has printed something (its start line), or after 20 s of silence; then ``settle``.
        """
        process = self._start(["redisdelay", "releaser"], self.env(precise=True))

        def started() -> bool:
            self.check_alive(process)
            return bool(process.output().strip())

        with contextlib.suppress(TimeoutError):
            wait_for(started, 20, "the releaser", 0.1)
        time.sleep(settle)
        self.check_alive(process)
        self.say(f"  releaser started (pid {process.pid}): {process.output().strip()[:100]}")
        return process

    def has_releaser(self) -> bool:
        """Whether the package has a precise releaser: ``celery -A bench.app redisdelay releaser --help``
        succeeds. False when the command does not exist; an error when it exists but fails."""
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "redisdelay", "releaser", "--help"],
            env={**os.environ, **self.env(precise=True)},
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode == 0:
            return True
        output = done.stdout + done.stderr
        if "No such command" in output:
            return False
        raise RuntimeError(f"celery redisdelay releaser --help failed ({done.returncode}):\n{output[-2000:]}")

    def check_alive(self, process: CeleryProcess) -> None:
        if process.process is not None and process.process.poll() is not None:
            tail = process.output()[-2000:]
            raise RuntimeError(f"celery {process.command[0]} exited with status {process.process.returncode}:\n{tail}")

    def stop(self, process: CeleryProcess, *, kill: bool = False) -> None:
        """Stop one process (SIGKILL at once with ``kill``: nothing it holds is wanted) and remove its files."""
        if kill:
            process.kill()
        process.stop()
        process.remove_files()
        if process in self.running:
            self.running.remove(process)

    def stop_all(self) -> None:
        for process in list(reversed(self.running)):
            try:
                self.stop(process)
            except Exception as exc:  # noqa: BLE001 - stop the others anyway
                self.say(f"  could not stop pid {process.pid}: {exc!r}")
