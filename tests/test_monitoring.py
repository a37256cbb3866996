"""The Grafana dashboard and the Prometheus alert rules shipped in ``celery_redisdelay/monitoring``.

The rules are tested by ``promtool test rules`` on series built from a real exporter's scrape: the healthy
state as scraped, then each fault the rules are for, one series changed at a time. The dashboard goes
through Grafana's own schema types (grafana-foundation-sdk). Every metric either names is one the exporter
serves. Without promtool (Debian's ``prometheus`` package) the rule tests skip, except in CI where
apt-get works: .ci/run installs it there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import yaml
from celery import Celery
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from celery_redisdelay import RedisDelay, monitoring
from celery_redisdelay.cli import redisdelay
from celery_redisdelay.operations.metrics import serve
from celery_redisdelay.testing import free_port

MakeApp = Callable[..., tuple[Celery, RedisDelay]]
ALERTS = {
    "RedisDelayDueBacklogGrowing",
    "RedisDelayReleaseLatenessHigh",
    "RedisDelayDeadLettering",
    "RedisDelayNoReleaser",
    "RedisDelayInflightPastDeadline",
    "RedisDelayPausedLong",
    "RedisDelayWorkerLost",
}
#: The test series: one sample a minute for this many minutes.
MINUTES = 40
#: Two exporters of one deployment: each reports the whole store, and the rules must not add them up.
INSTANCES = ("worker-1:9808", "worker-2:9808")
Sample = tuple[str, dict[str, str], float]


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") and os.geteuid() == 0 and shutil.which("apt-get"):
            pytest.fail("CI installs Debian's prometheus package for promtool (.ci/run); it is missing")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


@pytest.fixture(scope="module")
def scrape(redis_server: Any) -> list[Sample]:
    """What a real exporter serves for a store that parked, released, acknowledged and holds calls, one of them
    under a limit."""
    app = Celery("monitoring", broker=f"{redis_server.url}/0", set_as_current=False)
    app.conf.update(redisdelay_key_prefix=f"test-{uuid.uuid4().hex[:8]}", task_default_queue=uuid.uuid4().hex)
    rd = RedisDelay(app)

    @rd.delayed(name="tests.monitoring.echo")
    def echo(n: int) -> int:
        return n

    @rd.delayed(name="tests.monitoring.limited", limit_concurrency=2)
    def limited() -> None: ...

    released = [echo.apply_async((n,), countdown=0.001).id for n in range(4)] + [limited.delay().id]
    for n in range(3):
        echo.apply_async((n,), countdown=3600)
    client = redis.Redis.from_url(f"{redis_server.url}/0")
    client.zadd(rd.store.keys.delayed, dict.fromkeys(released, 0))
    rd.tick()
    for call_id in released:
        rd.store.ack(call_id)
    port = free_port()
    server = serve(rd.depot, port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        client.close()
        app.close()
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def values(scrape: list[Sample], name: str) -> list[float]:
    return [value for sample, _, value in scrape if sample == name]


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"\bredisdelay_[a-z_]+\b", text))


def series(scrape: list[Sample], **faults: str | None) -> list[dict[str, str]]:
    """promtool input series: every sample of the scrape, labelled as two exporters of one job, held at
    its value for MINUTES minutes (the last release keeps up with the clock), except the names in
    ``faults``: their promtool notation, or None to drop the series."""
    out = []
    for name, labels, value in scrape:
        key = name + (f"_le_{labels['le']}" if "le" in labels else "")
        fault = faults.get(key, faults.get(name, ""))
        if fault is None:
            continue
        if not fault:
            fault = f"0+60x{MINUTES}" if name == "redisdelay_last_release_timestamp_seconds" else f"{value:g}x{MINUTES}"
        for instance in INSTANCES:
            tags = {**labels, "job": "celery", "instance": instance}
            text = ", ".join(f'{k}="{v}"' for k, v in sorted(tags.items()))
            out.append({"series": f"{name}{{{text}}}", "values": fault})
    return out


def lateness(scrape: list[Sample], slow_from_s: float | None) -> dict[str, str]:
    """Lateness buckets growing by 100 calls a minute: every call within 5 ms, or (``slow_from_s``) every
    call later than that many seconds."""
    faults = {}
    for name, labels, value in scrape:
        if name == "redisdelay_release_lateness_seconds_bucket":
            grows = slow_from_s is None or float(labels["le"]) > slow_from_s
            faults[f"{name}_le_{labels['le']}"] = f"{value:g}+{100 if grows else 0}x{MINUTES}"
    return faults


def run_promtool(tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(monitoring.read("alerts"))
    spec = tmp_path / "test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}))
    done = subprocess.run([promtool(), "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def alert(name: str, severity: str, summary: str, description_starts: str) -> dict[str, Any]:
    rules = yaml.safe_load(monitoring.read("alerts"))["groups"][0]["rules"]
    (rule,) = [rule for rule in rules if rule["alert"] == name]
    assert rule["annotations"]["description"].startswith(description_starts)
    return {
        "exp_labels": {"severity": severity, "job": "celery"},
        "exp_annotations": {"summary": summary, "description": rule["annotations"]["description"]},
    }


def at(minute: int, name: str, *firing: dict[str, Any]) -> dict[str, Any]:
    """A promtool check: at ``minute``, alert ``name`` fires as ``firing`` says (nothing: it does not fire)."""
    return {"eval_time": f"{minute}m", "alertname": name, "exp_alerts": list(firing)}


def quiet_at(*minutes: int) -> list[dict[str, Any]]:
    return [at(minute, name) for minute in minutes for name in sorted(ALERTS)]


def test_the_files_ship_and_the_cli_prints_them() -> None:
    runner, app = CliRunner(), Celery("monitoring-cli", set_as_current=False)
    for name, file_name in monitoring.FILES.items():
        shipped = (Path(monitoring.__file__).parent / file_name).read_text()
        out = runner.invoke(redisdelay, ["monitoring", name], obj=SimpleNamespace(app=app))
        assert out.exit_code == 0 and out.output == shipped, out.output
    assert {rule["alert"] for rule in yaml.safe_load(monitoring.read("alerts"))["groups"][0]["rules"]} == ALERTS
    with pytest.raises(ValueError, match="choose one of grafana, alerts"):
        monitoring.read("kibana")


def test_every_metric_named_is_one_the_exporter_serves(scrape: list[Sample]) -> None:
    served = {name for name, _, _ in scrape}
    rules = yaml.safe_load(monitoring.read("alerts"))["groups"][0]["rules"]
    panels = json.loads(monitoring.read("grafana"))["panels"]
    queries = {
        "alerts": [rule["expr"] for rule in rules],
        "grafana": [target["expr"] for panel in panels for target in panel["targets"]],
    }
    for name, exprs in queries.items():
        unknown = metric_names(" ".join(exprs)) - served
        assert not unknown, f"{name} queries metrics the exporter does not serve: {unknown}"
    assert values(scrape, "redisdelay_due") == [0] and values(scrape, "redisdelay_dead_lettered_total") == [0]
    assert values(scrape, "redisdelay_calls") and values(scrape, "redisdelay_acknowledged_total") == [5]


def test_the_rules_are_valid(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(monitoring.read("alerts"))
    done = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and f"SUCCESS: {len(ALERTS)} rules found" in done.stdout, done.stdout + done.stderr


def test_a_healthy_deployment_raises_no_alert(scrape: list[Sample], tmp_path: Path) -> None:
    flicker = " ".join(["3 0"] * (MINUTES // 2))  # due calls between two ticks, gone at the next
    run_promtool(
        tmp_path,
        [
            case(series(scrape), *quiet_at(5, 20, 39)),
            case(
                series(scrape, redisdelay_due=flicker, redisdelay_inflight_expired=flicker, **lateness(scrape, None)),
                *quiet_at(20, 39),
            ),
        ],
    )


def case(input_series: list[dict[str, str]], *checks: dict[str, Any]) -> dict[str, Any]:
    return {"interval": "1m", "input_series": input_series, "alert_rule_test": list(checks)}


def test_each_fault_raises_its_alert(scrape: list[Sample], tmp_path: Path) -> None:
    assert values(scrape, "redisdelay_tick_interval_seconds") == [1.0], "the rule counts ticks of the default 1 s"
    growing, late, dead, stopped, past, paused, lost = (
        "RedisDelayDueBacklogGrowing",
        "RedisDelayReleaseLatenessHigh",
        "RedisDelayDeadLettering",
        "RedisDelayNoReleaser",
        "RedisDelayInflightPastDeadline",
        "RedisDelayPausedLong",
        "RedisDelayWorkerLost",
    )
    no_releaser = alert(stopped, "critical", "No releaser has run for 10 ticks", "No beat tick")
    run_promtool(
        tmp_path,
        [
            # due calls never cleared and growing: pending at 3 min, firing at 20
            case(
                series(scrape, redisdelay_due=f"5+5x{MINUTES}"),
                at(3, growing),
                at(
                    20, growing, alert(growing, "warning", "Due calls are piling up: 55 due and growing", "The backlog")
                ),
            ),
            # every call released later than 5 s: p99 interpolated in the 5 s to 10 s bucket
            case(
                series(scrape, **lateness(scrape, 5.0)),
                at(9, late),
                at(20, late, alert(late, "warning", "Release lateness p99 is 9.95s", "1 call in 100")),
            ),
            # two calls dead-lettered at minute 15: raised at once, gone 10 minutes later
            case(
                series(scrape, redisdelay_dead_lettered_total="0x15 2x25"),
                at(14, dead),
                at(20, dead, alert(dead, "critical", "2 calls dead-lettered in 10 minutes", "Calls ran out")),
                at(30, dead),
            ),
            # a worker dies mid-run at minute 15: its early-ack call is dead-lettered, raised at once
            case(
                series(scrape, redisdelay_worker_lost_total="0x15 1x25"),
                at(14, lost),
                at(
                    20,
                    lost,
                    alert(lost, "warning", "Runs cut short with their worker: 1 in 10 minutes", "Workers died"),
                ),
                at(30, lost),
            ),
            # the releasers stop at minute 10
            case(
                series(scrape, redisdelay_last_release_timestamp_seconds=f"0+60x10 600x{MINUTES - 10}"),
                at(10, stopped),
                at(13, stopped, no_releaser),
            ),
            # no releaser ever ran: no release time at all, and calls are due
            case(
                series(scrape, redisdelay_last_release_timestamp_seconds=None, redisdelay_due=f"4x{MINUTES}"),
                at(5, stopped, no_releaser),
            ),
            # three calls stay past their deadline from minute 10: no sweep runs
            case(
                series(scrape, redisdelay_inflight_expired=f"0x10 3x{MINUTES - 10}"),
                at(12, past),
                at(16, past, alert(past, "warning", "3 in-flight calls stay past their deadline", "Calls in flight")),
            ),
            # a task paused from minute 5 on: pending for 30 minutes, then raised
            case(
                series(scrape, redisdelay_paused_targets=f"0x5 1x{MINUTES - 5}"),
                at(34, paused),
                at(36, paused, alert(paused, "warning", "1 tasks or queues paused for over 30 minutes", "A task")),
            ),
        ],
    )


def test_the_dashboard_loads_as_grafanas_schema_expects(scrape: list[Sample], tmp_path: Path) -> None:
    """Grafana's schema types (the foundation SDK) read every field of the dashboard: a field they do not
    know is dropped by the round trip, and the test names it. Every query is valid PromQL (promtool)."""
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.models import dashboard, prometheus, stat, timeseries

    plugins.register_default_plugins()
    shipped = json.loads(monitoring.read("grafana"))
    loaded = dashboard.Dashboard.from_json(shipped)
    back = json.loads(json.dumps(loaded.to_json(), default=lambda value: value.to_json()))
    assert not list(_dropped(shipped, back)), "fields Grafana's schema does not know"
    panels = [panel for panel in loaded.panels or [] if isinstance(panel, dashboard.Panel)]
    assert {type(panel.options) for panel in panels} == {stat.Options, timeseries.Options}
    targets = [target for panel in panels for target in panel.targets or []]
    assert targets and all(isinstance(target, prometheus.Dataquery) for target in targets)
    exprs = [target.expr for target in targets]
    assert all('job=~"$job"' in expr for expr in exprs), "every query follows the job variable"
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"panel:query{n}", "expr": expr.replace("$__rate_interval", "5m").replace("$job", ".*")}
                    for n, expr in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _dropped(shipped: Any, back: Any, path: str = "") -> Iterator[str]:
    if isinstance(shipped, dict):
        for key, value in shipped.items():
            if not isinstance(back, dict) or key not in back:
                yield f"{path}/{key}"
            else:
                yield from _dropped(value, back[key], f"{path}/{key}")
    elif isinstance(shipped, list):
        for index, value in enumerate(shipped):
            yield from _dropped(
                value, back[index] if isinstance(back, list) and index < len(back) else None, f"{path}[{index}]"
            )
    elif shipped != back:
        yield f"{path}: {shipped!r} became {back!r}"
