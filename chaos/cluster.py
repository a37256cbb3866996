"""The worker, beat and releaser processes of the run: started, killed and restarted by PID.

Every process runs ``celery -A chaos.app ...`` in its own session (``CeleryProcess``), so a SIGKILL to
its process group takes its pool children with it, as a crash of the machine's container would. The
log of every incarnation is kept under ``<run dir>/logs`` for the analysis.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery_redisdelay.testing import CeleryProcess, beat, wait_for, worker

from .config import ENV_EVENTS, QUEUE, TICK_QUEUE

ROOT = Path(__file__).resolve().parent.parent
APP = "chaos.app"
READY_TIMEOUT = 90.0
WORKER_CONCURRENCY = 2

READY_MARKERS = {
    "worker": "ready.",
    "beat": "beat: Starting",
    "releaser": "redisdelay releaser: releasing",
}


class ClusterClosed(RuntimeError):
    """The run is ending: no process is started any more."""


@dataclass
class Member:
    """One incarnation of a process: a worker slot, beat or the releaser."""

    role: str
    slot: int
    name: str
    process: CeleryProcess
    started: float = field(default_factory=time.time)  # wall clock, as in the worker's event log
    ready_seconds: float = 0.0
    ended: float | None = None
    how: str = ""  # killing, killed, exited (on its own) or stopped (at the end)
    status: int | None = None  # exit status
    log: Path | None = None  # the kept copy, once it ended

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        if self.log is not None:
            return self.log.read_text(errors="replace")
        return self.process.output()

    def exited(self) -> bool:
        return self.process.process is not None and self.process.process.poll() is not None


def exit_reason(output: str) -> str:
    """The line of a log that says why the process ended: Celery's "Unrecoverable error", else the last."""
    lines = [line for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Unrecoverable error" in line or "CRITICAL" in line:
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else ""


class Cluster:
    """Starts the run's processes, replaces them (for a fault, or as a supervisor would when one exits
    on its own), and stops every one it started.

    ``_lock`` guards the list of processes (so the final shutdown sees every one); ``_restart_lock``
    makes a replacement (end the old process, start and wait for the new one) one step, so the fault
    thread and the supervisor never replace the same process twice.
    """

    def __init__(self, env: dict[str, str], run_dir: Path, say: Callable[[str], None]) -> None:
        self.say = say
        self.logs_dir = run_dir / "logs"
        self.events_dir = run_dir / "events"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.events_dir.mkdir(parents=True, exist_ok=True)
        self.env = {
            **env,  # the app's configuration (chaos/app.py)
            ENV_EVENTS: str(self.events_dir),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",  # their output reaches the log file as it is written
        }
        self._lock = threading.RLock()
        self._restart_lock = threading.RLock()
        self._closing = threading.Event()
        self.current: dict[tuple[str, int], Member] = {}
        self.members: list[Member] = []  # every incarnation, in start order
        self.exits: list[dict[str, Any]] = []  # processes that ended on their own, and their replacement
        self._generation = 0
        self._supervisor: threading.Thread | None = None

    # -- starting ---------------------------------------------------------------------------------

    def _process(self, role: str, name: str) -> CeleryProcess:
        if role == "worker":
            return worker(
                APP,
                concurrency=WORKER_CONCURRENCY,
                queues=f"{QUEUE},{TICK_QUEUE}",
                env=self.env,
                cwd=str(ROOT),
                extra=["-O", "fair", f"--hostname={name}@%h"],
            )
        if role == "beat":
            return beat(APP, env=self.env, cwd=str(ROOT))
        if role == "releaser":
            return CeleryProcess(APP, ["redisdelay", "releaser"], self.env, str(ROOT))
        raise ValueError(f"unknown role {role}")

    def start(self, role: str, slot: int = 0) -> Member:
        """Start a process for ``role`` (and worker ``slot``) and wait until it is ready."""
        with self._lock:
            if self._closing.is_set():
                raise ClusterClosed(f"not starting a {role}: the run is ending")
            self._generation += 1
            name = f"{role}{slot if role == 'worker' else ''}-{self._generation}"
            process = self._process(role, name)
            member = Member(role, slot, name, process)
            self.members.append(member)
            self.current[(role, slot)] = member
            process.start()
        began = time.monotonic()
        marker = READY_MARKERS[role]

        def ready() -> bool:
            if member.exited():
                status = process.process.returncode if process.process is not None else None
                raise RuntimeError(f"{name} exited with status {status}:\n{process.output()[-3000:]}")
            return marker in process.output()

        wait_for(ready, READY_TIMEOUT, f"{name} to be ready", interval=0.1)
        member.ready_seconds = round(time.monotonic() - began, 2)
        return member

    def replace(self, role: str, slot: int = 0) -> tuple[Member, Member]:
        """SIGKILL the current process of ``role`` / ``slot`` and start a new one: (old, new)."""
        with self._restart_lock:
            old = self.current[(role, slot)]
            self._end(old, how="killed")
            return old, self.start(role, slot)

    # -- supervising ------------------------------------------------------------------------------

    def supervise(self) -> None:
        """Watch for processes that exit on their own and start a new one, as systemd would."""
        self._supervisor = threading.Thread(target=self._watch, name="chaos-supervisor", daemon=True)
        self._supervisor.start()

    def _watch(self) -> None:
        while not self._closing.wait(0.25):
            for member in list(self.current.values()):
                if member.how or not member.exited():
                    continue
                with self._restart_lock:
                    if (
                        self._closing.is_set()
                        or member.how
                        or self.current.get((member.role, member.slot)) is not member
                    ):
                        continue
                    self._end(member, how="exited")
                    record = {
                        "name": member.name,
                        "pid": member.pid,
                        "wall": member.ended,
                        "status": member.status,
                        "reason": exit_reason(member.output()),
                        "replacement": None,
                    }
                    self.exits.append(record)
                    self.say(
                        f"{member.name} (pid {member.pid}) exited on its own ({member.status}): {record['reason']}"
                    )
                    try:
                        new = self.start(member.role, member.slot)
                    except ClusterClosed:
                        return
                    except Exception as exc:  # noqa: BLE001 - tried again on the next look
                        self.say(f"could not start a {member.role} in place of {member.name}: {exc!r}")
                        continue
                    record["replacement"] = f"{new.name} pid {new.pid}"
                    self.say(f"  started {new.name} (pid {new.pid}) in its place")

    # -- ending -----------------------------------------------------------------------------------

    def _end(self, member: Member, *, how: str) -> None:
        with self._lock:
            if member.how and member.how != "killing":
                return
            member.how = "killing" if how == "killed" else how
        if how == "killed":
            member.process.kill()  # SIGKILL to the whole process group, as a crash would
        member.ended = time.time()
        member.process.stop()
        member.how = how
        member.status = member.process.process.returncode if member.process.process is not None else None
        kept = self.logs_dir / f"{member.name}-{member.pid}.log"
        try:
            shutil.copyfile(member.process.log_path, kept)
            member.log = kept
        except OSError:
            member.log = None
        member.process.remove_files()

    def workers(self) -> list[tuple[str, int]]:
        """The running workers: (name, main pid)."""
        with self._lock:
            return [(member.name, member.pid) for (role, _), member in self.current.items() if role == "worker"]

    def close(self) -> None:
        """Start nothing more, and stop every process still running (SIGTERM, then SIGKILL)."""
        self._closing.set()
        if self._supervisor is not None:
            self._supervisor.join(READY_TIMEOUT + 30)
        with self._lock:
            running = [member for member in self.members if not member.how]
        for member in reversed(running):
            try:
                self._end(member, how="stopped")
            except Exception as exc:  # noqa: BLE001 - stop the others anyway
                self.say(f"could not stop {member.name} (pid {member.pid}): {exc!r}")
