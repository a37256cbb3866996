"""The chaos runner at CI size (``python -m chaos``): under worker, beat and releaser kills, a Redis
restart and dropped connections, no validation message goes missing. Timings are not judged here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import run_module

CHAOS_TIMEOUT = 240
CI_SIZE = (
    "--count",
    "2000",
    "--worker-kills",
    "5",
    "--redis-restarts",
    "1",
    "--beat-kills",
    "2",
    "--releaser-kills",
    "2",
    "--client-kills",
    "3",
    # Two shards: the sharded paths (per-shard releaser threads, acks found across shards) under faults;
    # the one-shard layout runs in every other end-to-end test.
    "--shards",
    "2",
    # The validation gives up before the test does, so a failing run still prints its report.
    "--deadline",
    "180",
)


@pytest.mark.e2e
@pytest.mark.timeout(CHAOS_TIMEOUT + 90)
def test_chaos_run_loses_no_message(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    status, output = run_module("chaos", *CI_SIZE, "--json", str(out), timeout=CHAOS_TIMEOUT)
    print(output)

    report = json.loads(out.read_text())
    assert report["result"]["expected"] == 2000, output
    assert report["result"]["missing"] == [], output
    assert status == 0, output
