"""The pieces of ``python3 dev.py celery-suite`` that run without Celery's suite or the network: reading pytest's
JUnit report, the comparison with its known differences, the cached sdist, and the plugin's modes on real apps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from celery_redisdelay import DelayedTask, RedisDelay
from celery_suite import differences, outcomes, plugin, sdist, selection
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


@pytest.mark.parametrize("mode", ["delayed", "all-tasks"])
def test_an_app_of_the_tests_on_a_broker_not_redis_keeps_its_calls_in_the_suites_redis(
    mode: str, monkeypatch: pytest.MonkeyPatch, redis_server: Any
) -> None:
    """TestApp's own broker is memory:// (test_backend_leak_in_fixture_teardown.py keeps it): the extension,
    which needs a Redis for its calls, is told the suite's, as a user with such a broker would tell it."""
    from celery.contrib.testing import app as testing_app

    monkeypatch.setattr(testing_app, "TestApp", testing_app.TestApp)  # restored after the test
    monkeypatch.setenv(ENV_MODE, mode)
    monkeypatch.setenv("TEST_BROKER", f"{redis_server.url}/0")
    plugin.pytest_configure(None)
    on_memory = testing_app.TestApp(set_as_current=False, config={"result_backend": f"{redis_server.url}/0"})
    on_redis = testing_app.TestApp(set_as_current=False, config={"broker_url": f"{redis_server.url}/1"})
    try:
        assert on_memory.conf.broker_url == "memory://"
        assert on_memory.conf.redisdelay_url == f"{redis_server.url}/0"
        assert on_memory.conf.redisdelay_key_prefix != on_redis.conf.redisdelay_key_prefix, "apart from the others"
        assert "redisdelay_url" not in on_redis.conf or not on_redis.conf.redisdelay_url, "its store: its broker's"

        @on_memory.task(name="suite.later", shared=False)
        def later() -> None: ...

        result = later.apply_async(countdown=600)
        rd = RedisDelay.registered(on_memory)
        assert rd is not None and rd.find(result.id) is not None, "parked in the suite's redis-server"
        assert rd.cancel(result.id)
    finally:
        on_memory.close()
        on_redis.close()


def test_the_plugin_refuses_a_mode_it_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_MODE, "sometimes")
    with pytest.raises(ValueError, match="REDISDELAY_SUITE_MODE"):
        plugin.pytest_configure(None)


def integration_folder(tmp_path: Path, names: list[str]) -> Path:
    """An sdist's folder whose t/integration holds empty files of these names."""
    integration = tmp_path / "t" / "integration"
    integration.mkdir(parents=True)
    for name in [*names, "__init__.py", "conftest.py", "tasks.py"]:
        (integration / name).write_text("")
    return tmp_path


def test_full_runs_every_file_it_names_and_says_why_of_each_it_leaves_out() -> None:
    full, left_out = set(selection.FULL_FILES), set(selection.NOT_REDIS)
    assert not full & left_out
    assert set(selection.DEFAULT_FILES) <= full and set(selection.QUICK_FILES) <= full
    assert all(reason.strip() for reason in [*selection.NOT_REDIS.values(), *selection.NOT_REDIS_TESTS.values()])
    assert all(test.split("::")[0] in full for test in selection.NOT_REDIS_TESTS), "a test of a file it runs"
    assert len(selection.FULL_FILES) == len(full), "no file twice"
    assert list(selection.FULL_FILES) == sorted(full), "in the order of pytest t/integration, as Celery's CI"


def test_full_takes_the_files_of_an_sdist_that_has_exactly_those_it_decided(tmp_path: Path) -> None:
    names = [path.split("/")[-1] for path in [*selection.FULL_FILES, *selection.NOT_REDIS]]
    assert selection.full_files(integration_folder(tmp_path, names)) == selection.FULL_FILES


@pytest.mark.parametrize("change", ["a new file", "a file gone"])
def test_full_stops_at_a_file_of_a_celery_it_has_not_decided(tmp_path: Path, change: str) -> None:
    names = [path.split("/")[-1] for path in [*selection.FULL_FILES, *selection.NOT_REDIS]]
    names = [*names, "test_brand_new.py"] if change == "a new file" else names[1:]
    with pytest.raises(ValueError, match="test_brand_new.py" if change == "a new file" else "missing there"):
        selection.full_files(integration_folder(tmp_path, names))


@pytest.mark.skipif(
    not (sdist.CACHE / f"celery-{sdist.installed_celery()}" / "t" / "integration").is_dir(),
    reason="the installed Celery's sdist is not in .cache/ (python3 dev.py celery-suite fetches it)",
)
def test_full_has_decided_every_file_of_the_installed_celerys_sdist() -> None:
    folder = sdist.CACHE / f"celery-{sdist.installed_celery()}"
    assert selection.full_files(folder) == selection.FULL_FILES


def test_each_known_difference_names_a_test_of_a_file_full_runs() -> None:
    modules = {path.removesuffix(".py").replace("/", ".") for path in selection.FULL_FILES}
    for mode, known in differences.DIFFERENCES.items():
        for test, reason in known.items():
            assert test.split("::")[0].rsplit(".", 1)[0] in modules and reason, (mode, test)
    assert len(differences.PROTOCOL_1_TESTS) == len(set(differences.PROTOCOL_1_TESTS)) == 10
