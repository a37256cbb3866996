"""The conformance suite once more with ``redisdelay_all_tasks``: each task's second variant is a plain ``@app.task``
or ``@shared_task`` that the setting adopts, compared with the same task left to Celery (``tests/conformance_app.py``).
The app is built when its module is imported, so this mode runs the suite in a pytest process of its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.e2e


def test_the_conformance_suite_with_every_task_of_the_app_adopted() -> None:
    env = {**os.environ, "REDISDELAY_CONFORMANCE_MODE": "all-tasks", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "tests/test_conformance.py"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, f"{done.stdout[-12000:]}\n{done.stderr[-3000:]}"
    assert " passed" in summary and "failed" not in summary, summary
