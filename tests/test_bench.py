"""The benchmark harness runs end to end (``python -m bench --quick``); its numbers are not judged here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from celery_redisdelay.testing import redis_server_binary
from celery_redisdelay.testing.topologies import binary_version

from .conftest import run_module

#: Seconds: the quick run took 230 s to its recovery figure with the rest of the suite on the machine, before the
#: figures of tracked calls due now were added; pause_fleet adds about 35 s (two workers started).
BENCH_TIMEOUT = 480
FIGURES = (
    "park_single",
    "park_bulk",
    "send_due_now",
    "release",
    "release_limited",
    "release_paused",
    "history_cost",
    "release_cluster",
    "worker_memory",
    "lateness",
    "redis_memory_per_call",
    "dashboard",
    "e2e_throughput",
    "e2e_due_now",
    "recovery",
    "long_run",
    "recovery_due_now",
    "long_run_due_now",
    "burst",
    "limits",
    "pause_fleet",
)
NOT_IMPLEMENTED = "not implemented"
SKIPPED = "skipped"  # the cluster figure, on a redis-server older than 7.0 (no --cluster-port)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@pytest.mark.e2e
@pytest.mark.timeout(BENCH_TIMEOUT + 30)
def test_quick_bench_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    status, output = run_module("bench", "--quick", "--json", str(out), timeout=BENCH_TIMEOUT)
    assert status == 0, output

    results = json.loads(out.read_text())
    assert set(results["figures"]) == set(FIGURES), output
    can_cluster = int(binary_version(redis_server_binary()).split(".")[0]) >= 7
    for name, figure in results["figures"].items():
        if name == "release_cluster":
            allowed: tuple[str, ...] = ("ok",) if can_cluster else ("ok", SKIPPED)
        else:
            allowed = ("ok", NOT_IMPLEMENTED)
        assert figure["status"] in allowed, (name, figure)
        assert figure["rows"], (name, figure)
        for row in figure["rows"]:
            assert is_number(row["ours"]) or row["ours"] in (NOT_IMPLEMENTED, SKIPPED), (name, row)
            assert row["baseline"] is None or is_number(row["baseline"]), (name, row)
            assert row["ratio"] is None or is_number(row["ratio"]), (name, row)
            assert row["met"] in (True, False, None), (name, row)
