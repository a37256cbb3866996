"""The example project's demo, run as a user runs it: embedded Redis, real worker and beat."""

from __future__ import annotations

import re

import pytest

from .conftest import run_module

DEMO_TIMEOUT = 150


@pytest.mark.e2e
@pytest.mark.timeout(DEMO_TIMEOUT + 30)
def test_demo_processes_every_message() -> None:
    # An empty REDISDELAY_DEMO_URL: the demo starts (and stops) its own redis-server.
    status, output = run_module(
        "example_project.demo", "--count", "50", "--timeout", "1", timeout=DEMO_TIMEOUT, env={"REDISDELAY_DEMO_URL": ""}
    )
    assert status == 0, output
    assert re.search(r"^\s*missing\s+0\s*$", output, re.MULTILINE), output
    assert re.search(r"^\s*processed\s+50\s*$", output, re.MULTILINE), output
