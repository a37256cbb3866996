"""Hung processes: a worker's pool process blocked on a lock for good.

A pool process forked while another thread of its worker held a lock (the precise releaser thread running
a script, say) inherits that lock held, and nobody is left to release it: the process blocks at its first
use for good, with the task it received. A pool process is single-threaded, and with ``-O fair`` an idle one
waits reading its pipe; one whose every thread sleeps in a futex wait, sample after sample for
:data:`HUNG_SECONDS`, is blocked on a lock nobody will release. :class:`HungWatch` samples every worker's
pool processes through the run (a hung process of a worker killed later is counted too) and once more at
the end; the report counts them beside lost and duplicated calls, and any is a failure.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: How often the pool processes are sampled, and for how long one must stay blocked on a lock.
SAMPLE_SECONDS = 2.0
HUNG_SECONDS = 10.0


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def blocked_on_a_lock(pid: int) -> bool:
    """Whether every thread of ``pid`` sleeps in a futex wait (False when it is gone)."""
    try:
        waits = [(task / "wchan").read_text() for task in (Path("/proc") / str(pid) / "task").iterdir()]
    except OSError:
        return False
    return bool(waits) and all(wait.startswith("futex") for wait in waits)


def stack_of(pid: int) -> str | None:
    """Where a hung process is blocked: ``py-spy dump`` of its Python threads, where py-spy is installed (it is
    not a dependency: ``pip install py-spy`` to see it); None otherwise."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return None
    try:
        done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy failed: {exc!r}"
    return (done.stdout + done.stderr)[-6000:]


class HungWatch(threading.Thread):
    """Samples the pool processes of the workers ``workers()`` names (their main pids) until :meth:`finish`."""

    def __init__(self, workers: Callable[[], Iterable[tuple[str, int]]]) -> None:
        super().__init__(name="chaos-hung-watch", daemon=True)
        self.workers = workers
        self.stopping = threading.Event()
        self._blocked_since: dict[int, float] = {}
        self.hung: dict[int, dict[str, Any]] = {}  # pool process pid -> what was seen

    def sample(self) -> None:
        now = time.monotonic()
        seen = set()
        for name, worker_pid in list(self.workers()):
            for pid in children_of(worker_pid):
                if not blocked_on_a_lock(pid):
                    continue
                seen.add(pid)
                since = self._blocked_since.setdefault(pid, now)
                if now - since >= HUNG_SECONDS and pid not in self.hung:
                    self.hung[pid] = {
                        "worker": name,
                        "worker_pid": worker_pid,
                        "pid": pid,
                        "blocked_s": now - since,
                        "stack": stack_of(pid),
                    }
        self._blocked_since = {pid: since for pid, since in self._blocked_since.items() if pid in seen}

    def run(self) -> None:
        while not self.stopping.wait(SAMPLE_SECONDS):
            self.sample()

    def finish(self) -> list[dict[str, Any]]:
        """Stop sampling, and look once more for as long as it takes to tell: every hung pool process seen."""
        self.stopping.set()
        if self.ident is not None:  # started
            self.join(SAMPLE_SECONDS + 5)
        self.sample()
        ends = time.monotonic() + HUNG_SECONDS + SAMPLE_SECONDS
        while time.monotonic() < ends and self._blocked_since:
            self.sample()
            time.sleep(SAMPLE_SECONDS)
        return sorted(self.hung.values(), key=lambda row: row["pid"])
