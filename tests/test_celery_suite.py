"""The pieces of ``python3 dev.py celery-suite`` that run without Celery's suite or the network: reading pytest's
JUnit report, the comparison with its known differences, the cached sdist, and the plugin's modes on real apps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from celery_redisdelay import DelayedTask, RedisDelay
from celery_suite import outcomes, plugin, sdist
from celery_suite.modes import ENV_MODE

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="t.integration.test_tasks.test_tasks" name="test_eta" time="6.0"/>
<testcase classname="t.integration.test_tasks.test_tasks" name="test_fail" time="1.0"><failure message="x"/></testcase>
<testcase classname="t.integration.test_tasks.test_tasks" name="test_odd" time="1.0"><error message="x"/></testcase>
<testcase classname="t.integration.test_tasks.test_tasks" name="test_skip" time="0.0"><skipped message="x"/></testcase>
</testsuite></testsuites>
"""


def test_outcomes_are_read_from_the_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(JUNIT)
    prefix = "t.integration.test_tasks.test_tasks::"
    assert outcomes.read(report) == {
        f"{prefix}test_eta": "passed",
        f"{prefix}test_fail": "failed",
        f"{prefix}test_odd": "error",
        f"{prefix}test_skip": "skipped",
    }


def test_a_test_passing_only_with_celery_alone_fails_the_comparison_unless_explained() -> None:
    results = {
        "plain": {"a": "passed", "b": "passed", "c": "failed", "d": "passed"},
        "delayed": {"a": "passed", "b": "failed", "c": "failed", "d": "error"},
        "all-tasks": {"a": "passed", "b": "passed", "c": "passed", "d": "passed"},
    }
    found = outcomes.compare(results, {"delayed": {"b": "a known difference"}})
    assert found.explained == {"delayed": {"b": "a known difference"}}
    assert found.unexplained == {"delayed": ["d"]}, "c fails with Celery alone too: not ours"
    assert not found.ok
    assert outcomes.compare(results, {"delayed": {"b": "known", "d": "known"}}).ok
    assert [row for row, _ in found.rows] == ["a", "b", "c", "d"]


def test_a_cached_sdist_is_used_as_it_is(tmp_path: Path) -> None:
    folder = tmp_path / "celery-9.9.9"
    (folder / "t" / "integration").mkdir(parents=True)
    assert sdist.unpacked("9.9.9", cache=tmp_path) == folder
    assert sdist.installed_celery()


@pytest.mark.parametrize("mode", ["plain", "delayed", "all-tasks"])
def test_the_plugin_gives_each_app_of_the_tests_its_mode(
    mode: str, monkeypatch: pytest.MonkeyPatch, redis_server: Any
) -> None:
    from celery.contrib.testing import app as testing_app

    monkeypatch.setattr(testing_app, "TestApp", testing_app.TestApp)  # restored after the test
    monkeypatch.setenv(ENV_MODE, mode)
    plugin.pytest_configure(None)
    app = testing_app.TestApp(set_as_current=False, config={"broker_url": f"{redis_server.url}/0"})
    try:

        @app.task(name="suite.add", shared=False)
        def add(x: int, y: int) -> int:
            return x + y

        rd = RedisDelay.registered(app)
        assert (rd is None) is (mode == "plain")
        assert isinstance(app.tasks["suite.add"], DelayedTask) is (mode == "delayed")
        if rd is not None:
            assert rd.settings.precise_release and rd.settings.all_tasks is (mode == "all-tasks")
    finally:
        app.close()


def test_the_plugin_refuses_a_mode_it_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_MODE, "sometimes")
    with pytest.raises(ValueError, match="REDISDELAY_SUITE_MODE"):
        plugin.pytest_configure(None)
