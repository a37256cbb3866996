"""The example project's demo, run as a user runs it: embedded Redis, real worker and beat."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO_TIMEOUT = 150


@pytest.mark.e2e
@pytest.mark.timeout(DEMO_TIMEOUT + 30)
def test_demo_processes_every_message() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDISDELAY_DEMO_URL", None)  # the demo starts (and stops) its own redis-server
    demo = subprocess.Popen(
        [sys.executable, "-m", "example_project.demo", "--count", "50", "--timeout", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = demo.communicate(timeout=DEMO_TIMEOUT)
    except subprocess.TimeoutExpired:
        demo.send_signal(signal.SIGTERM)  # the demo stops its worker, beat and redis-server on SIGTERM
        output, _ = demo.communicate(timeout=60)
        pytest.fail(f"the demo did not finish in {DEMO_TIMEOUT} s:\n{output}")
    assert demo.returncode == 0, output
    assert re.search(r"^\s*missing\s+0\s*$", output, re.MULTILINE), output
    assert re.search(r"^\s*processed\s+50\s*$", output, re.MULTILINE), output
