"""The benchmark harness runs end to end (``python -m bench --quick``); its numbers are not judged here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import run_module

BENCH_TIMEOUT = 170
FIGURES = ("park_single", "park_bulk", "release", "worker_memory", "lateness", "redis_memory_per_call")
NOT_IMPLEMENTED = "not implemented"


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
    for name, figure in results["figures"].items():
        assert figure["status"] in ("ok", NOT_IMPLEMENTED), (name, figure)
        assert figure["rows"], (name, figure)
        for row in figure["rows"]:
            assert is_number(row["ours"]) or row["ours"] == NOT_IMPLEMENTED, (name, row)
            assert row["baseline"] is None or is_number(row["baseline"]), (name, row)
            assert row["ratio"] is None or is_number(row["ratio"]), (name, row)
            assert row["met"] in (True, False, None), (name, row)
