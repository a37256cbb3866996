"""A run's beginning and its failure, alike for the validation's runner and the battle.

A SIGTERM ends the runner through ``sys.exit``, so that its ``finally`` blocks stop every process and server it
started (by PID); the seed is the one given or a fresh one, said in the report so that the run can be made
again; the run's directory holds its logs and ledger until :func:`chaos.harness.report.publish` keeps or
deletes it. A run that raises is reported with its traceback, and everything is still stopped.
"""

from __future__ import annotations

import random
import signal
import sys
import tempfile
import traceback
from pathlib import Path

from .console import say


def begin(seed: int | None, prefix: str) -> tuple[int, Path]:
    """SIGTERM made an exit, the run's seed (``seed``, else a random one) and its new directory."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    chosen = seed if seed is not None else random.SystemRandom().randrange(2**31)
    return chosen, Path(tempfile.mkdtemp(prefix=prefix))


def failed(what: str) -> str:
    """Say that ``what`` failed, with the traceback of the exception being handled; the traceback."""
    error = traceback.format_exc()
    say(f"{what} failed:\n{error}")
    return error
