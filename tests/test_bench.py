"""The benchmark harness runs end to end (``python -m bench --quick``), and its pure helpers compute what they say;
its numbers are not judged here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.common import process_client
from bench.server_load import exactness, window
from celery_redisdelay.testing import redis_server_binary
from celery_redisdelay.testing.topologies import binary_version

from .conftest import run_module

#: Seconds: the quick run took 230 s to its recovery figure with the rest of the suite on the machine, before the
#: figures of tracked calls due now were added; pause_fleet adds about 35 s (two workers started), e2e_due_now_io
#: about 30 s and workers_releasing about 45 s (four workers started, two 5 s windows, 3 s of calls) on a busy machine;
#: e2e_rabbitmq about 50 s (a RabbitMQ node and two workers started, six rounds of calls due 2 s ahead).
BENCH_TIMEOUT = 720  # the quick bench, with probe_cost (about 45 s) and exporter_scrape
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
    "exporter_scrape",
    "e2e_throughput",
    "e2e_due_now",
    "e2e_due_now_io",
    "probe_cost",
    "recovery",
    "long_run",
    "recovery_due_now",
    "long_run_due_now",
    "burst",
    "limits",
    "pause_fleet",
    "workers_releasing",
    "release_rabbitmq",  # skipped, in a row saying so, without rabbitmq-server
    "worker_memory_rabbitmq",
    "e2e_rabbitmq",
)
NOT_IMPLEMENTED = "not implemented"
SKIPPED = "skipped"  # the cluster figure, on a redis-server older than 7.0 (no --cluster-port)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@pytest.mark.e2e
@pytest.mark.slow  # python3 dev.py bench runs the benchmarks themselves
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


def snap(at: float, commands: int, cpu: float, **cmdstats: tuple[int, int]) -> dict[str, object]:
    return {
        "at": at,
        "commands": commands,
        "cpu": cpu,
        "cmdstats": {name: {"calls": calls, "usec": usec} for name, (calls, usec) in cmdstats.items()},
    }


def test_window_is_the_load_between_two_snapshots() -> None:
    before = snap(10.0, 1000, 1.5, evalsha=(100, 2000), info=(3, 30))
    after = snap(20.0, 1500, 1.75, evalsha=(300, 6000), info=(3, 30), bzpopmin=(40, 800))

    load = window(before, after)

    assert load["seconds"] == 10.0
    assert load["commands_per_s"] == 50.0
    assert load["cpu_ms_per_s"] == 25.0
    assert load["by_command"] == {
        "evalsha": {"calls_per_s": 20.0, "usec_per_s": 400.0, "usec_per_call": 20.0},
        "bzpopmin": {"calls_per_s": 4.0, "usec_per_s": 80.0, "usec_per_call": 20.0},
    }  # a command not called in the window is left out; the most called first
    assert list(load["by_command"]) == ["evalsha", "bzpopmin"]
    with pytest.raises(ValueError, match="later"):
        window(after, before)


def test_exactness_counts_each_calls_runs_against_its_due_time() -> None:
    due = {"a": 1000, "b": 2000, "c": 3000, "d": 4000}
    lines = ["a 1003", "b 1999", "c 3010", "c 3500", "x 5000"]  # b early, c twice, d never, x not ours

    check = exactness(due, lines)

    assert check["calls"] == 4
    assert check["ran_once"] == 2  # a and b
    assert check["duplicates"] == 1
    assert check["missing"] == 1
    assert check["unknown"] == 1
    assert check["early"] == 1
    assert (check["min_ms"], check["max_ms"]) == (-1.0, 10.0)  # each call's first start: 3, -1, 10
    assert check["p50_ms"] == 3.0
    assert check["p99_ms"] == 10.0


def test_exactness_of_no_run_has_no_lateness() -> None:
    check = exactness({"a": 1000}, [])

    assert (check["ran_once"], check["missing"], check["p50_ms"], check["max_ms"]) == (0, 1, None, None)


def test_the_io_task_client_is_made_once_per_process() -> None:
    url = "redis://127.0.0.1:1/0"  # never connected to: a client connects at its first command

    assert process_client(url) is process_client(url)
    assert process_client(url) is not process_client("redis://127.0.0.1:1/1")
