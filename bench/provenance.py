"""What a report of the benchmarks or of the chaos runner names its run by: the software and the machine."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib.metadata import version
from pathlib import Path
from typing import Any


def git_revision(root: Path) -> str:
    """``git describe --always --dirty`` of ``root``, or ``"?"`` outside a checkout."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return done.stdout.strip() or "?"


def software(root: Path) -> dict[str, Any]:
    """Python, Celery, kombu, redis-py, the revision of ``root`` and the number of cores."""
    return {
        "python": platform.python_version(),
        "celery": version("celery"),
        "kombu": version("kombu"),
        "redis_py": version("redis"),
        "revision": git_revision(root),
        "cpus": os.cpu_count(),
    }
