"""Queue latency (``rd.queues()``, the exporter, ``status``, the dashboard and its JSON for KEDA) against the session's
real redis-server, and a real worker draining a queue.

A known workload gives known figures: N calls due and released, none consumed, are N ready and N in flight, their
oldest age counted from the release (not from the due time, long before) and growing; a worker drains them to 0.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import textwrap
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import yaml
from celery import Celery
from click.testing import CliRunner

from celery_redisdelay import RedisDelay
from celery_redisdelay.cli import redisdelay
from celery_redisdelay.operations import queues as queue_latency
from celery_redisdelay.operations.metrics import serve
from celery_redisdelay.operations.pausing import queue_lists
from celery_redisdelay.testing import RedisServer, free_port, wait_for
from celery_redisdelay.web import create_app
from tests.conftest import ROOT
from tests.pool_run import pool_worker

MakeApp = Callable[..., tuple[Celery, RedisDelay]]

#: How long before the release the test's calls were due (s): far more than any test waits.
LATE_S = 40


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def make_due(rd: RedisDelay, client: redis.Redis, ids: list[str], late_ms: int = LATE_S * 1000) -> None:
    """Make parked calls due about ``late_ms`` ago by the Redis clock, in the order given (1 ms apart)."""
    now = server_ms(client)
    for index, call_id in enumerate(ids):
        client.zadd(rd.shards.home(call_id).keys.delayed, {call_id: now - late_ms - len(ids) + index})


def echo_on(rd: RedisDelay, **options: Any) -> Any:
    @rd.delayed(name=f"tests.queues.echo.{uuid.uuid4().hex[:6]}", **options)
    def echo(n: int) -> int:
        return n

    return echo


def queue_of(rd: RedisDelay) -> str:
    return str(rd.app.conf.task_default_queue)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "kombu-path"])
def test_calls_released_and_not_consumed_are_ready_and_their_age_counts_from_the_release(
    make_app: MakeApp, client: redis.Redis, fast: bool
) -> None:
    _, rd = make_app(redisdelay_shards=2, redisdelay_fast_release=fast)
    echo = echo_on(rd)
    queue = queue_of(rd)
    empty = rd.queues()[queue]
    assert empty["ready"] == 0 and empty["oldest_ready_seconds"] == 0.0  # known before anything is sent
    assert empty["in_flight"] == empty["paused"] == empty["held"] == 0
    ids = [echo.apply_async((n,), countdown=3600).id for n in range(7)]
    make_due(rd, client, ids)
    before = time.monotonic()
    assert rd.tick()["released"] == 7
    after = time.monotonic()
    first = rd.queues()[queue]
    assert first["ready"] == 7 and first["in_flight"] == 7 and first["paused"] == first["held"] == 0
    # From the release, not from the due time LATE_S earlier: the store's wait is not time in the queue.
    assert first["oldest_ready_seconds"] is not None and 0 <= first["oldest_ready_seconds"] < LATE_S / 2
    # The release lag is that wait: every call released between 30 and 60 s late (the buckets' bounds).
    assert 30 <= first["release_lag_p50_seconds"] <= 60 and 30 <= first["release_lag_p99_seconds"] <= 60
    assert first["estimated"] is False

    def read() -> tuple[float, dict[str, Any], float]:
        start = time.monotonic()
        found = rd.queues()[queue]
        return start, found, time.monotonic()

    start, later, end = wait_for(
        lambda: (seen := read())[1]["oldest_ready_seconds"] >= first["oldest_ready_seconds"] + 0.3 and seen,
        10,
        "the oldest ready call's age to grow",
    )
    assert later["ready"] == 7
    # Released during the tick, read during read(): the age is within what the two clocks allow (the store's clock
    # counts whole ms).
    assert start - after - 0.002 <= later["oldest_ready_seconds"] <= end - before + 0.002


def test_priority_lists_are_counted_and_the_oldest_is_the_next_out(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app()
    echo = echo_on(rd)
    queue = queue_of(rd)
    low = [echo.apply_async((n,), countdown=3600).id for n in range(3)]
    high = [echo.apply_async((n,), countdown=3600, priority=9).id for n in range(4)]
    make_due(rd, client, low + high)
    assert rd.tick()["released"] == 7
    lists = {key: client.llen(key) for key in queue_lists(rd.depot, queue)}
    assert sorted(lists.values()) == [0, 0, 3, 4]  # two lists: the default and priority 9's step
    assert lists[f"{queue}\x06\x169"] == 4
    figures = rd.queues()[queue]
    assert figures["ready"] == 7
    assert figures["in_flight"] == 7  # priority 9's list name is JSON-escaped in the metadata (\u0006\u0016)
    # kombu LPUSHes and BRPOPs: the message at index -1 of a list is the one taken next, the first released.
    with rd.app.connection_for_write() as connection:
        taken = connection.default_channel.basic_get(queue, no_ack=True)
    assert taken.headers["id"] == low[0]
    assert rd.queues()[queue]["ready"] == 6


def test_a_message_that_says_nothing_of_its_time_gives_no_age(make_app: MakeApp, client: redis.Redis) -> None:
    app, rd = make_app()
    queue = queue_of(rd)

    @app.task(name=f"tests.queues.plain.{uuid.uuid4().hex[:6]}")
    def plain() -> None:
        """A task the extension does not park: Celery sends its calls itself, with no send time in them."""

    plain.delay()
    figures = rd.queues()[queue]
    assert figures["ready"] == 1 and figures["oldest_ready_seconds"] is None
    # A message with an eta became ready at its eta.
    eta_ms = server_ms(client) - 5000
    message = json.loads(client.lindex(queue, -1) or b"{}")
    message["headers"]["eta"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(eta_ms / 1000)) + "+00:00"
    client.lset(queue, -1, json.dumps(message))
    assert rd.queues()[queue]["oldest_ready_seconds"] >= 4


def test_queues_known_are_those_routed_to_and_those_seen_in_the_store(make_app: MakeApp, client: redis.Redis) -> None:
    suffix = uuid.uuid4().hex[:6]
    _, rd = make_app(task_routes={"tests.queues.routed.*": {"queue": f"routed-{suffix}"}})
    echo = echo_on(rd, queue=f"own-{suffix}")
    assert {queue_of(rd), f"routed-{suffix}", f"own-{suffix}"} <= set(rd.queues())
    rd.pause(queue=f"paused-{suffix}")
    assert f"paused-{suffix}" in rd.queues()
    call = echo.apply_async((1,), countdown=3600)
    make_due(rd, client, [call.id])
    rd.tick()
    assert rd.queues()[f"own-{suffix}"]["in_flight"] == 1


def test_paused_and_held_calls_are_counted_under_their_queue(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app()
    queue = queue_of(rd)
    limited = echo_on(rd, limit_concurrency=1)
    one = [limited.apply_async((n,), countdown=3600).id for n in range(3)]
    make_due(rd, client, one)
    rd.tick()  # one goes, two wait on the limit
    figures = rd.queues()[queue]
    assert (figures["ready"], figures["in_flight"], figures["held"]) == (1, 1, 2)
    rd.pause(queue=queue)
    echo = echo_on(rd)
    paused = [echo.apply_async((n,), countdown=3600).id for n in range(4)]
    make_due(rd, client, paused)
    rd.tick()
    figures = rd.queues()[queue]
    # The calls waiting on the limit leave their gate for the pause when the release looks at them again.
    assert figures["paused"] >= 4 and figures["paused"] + figures["held"] == 6 and figures["ready"] == 1


def test_the_split_by_queue_is_scaled_up_beyond_what_it_reads(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app()
    echo = echo_on(rd)
    queue = queue_of(rd)
    ids = [echo.apply_async((n,), countdown=3600).id for n in range(30)]
    make_due(rd, client, ids)
    rd.tick()
    figures = queue_latency.queue_figures(rd.depot, most_read=10)[queue]
    assert figures.in_flight == 30 and figures.estimated  # 10 read, all of this queue: scaled by 3
    assert figures.ready == 30  # counted exactly: LLEN


def test_a_worker_drains_the_queue_to_zero(redis_server: RedisServer) -> None:
    with pool_worker(redis_server, "prefork", start=False) as run:
        queue = run.conf["task_default_queue"]
        record = run.task("pools.record")
        ids = [record.apply_async((f"{run.prefix}:runs", n), countdown=3600).id for n in range(5)]
        make_due(run.rd, run.rd.client, ids, late_ms=2000)
        assert run.rd.tick()["released"] == 5
        figures = run.rd.queues()[queue]
        assert (figures["ready"], figures["in_flight"]) == (5, 5)
        run.worker.start()
        wait_for(lambda: "ready." in run.worker.output(), 60, "the worker to be ready")
        drained = wait_for(
            lambda: (found := run.rd.queues()[queue])["ready"] == 0 and found["in_flight"] == 0 and found,
            60,
            "the worker to drain the queue",
        )
        assert drained["oldest_ready_seconds"] == 0.0
        assert len(run.notes(f"{run.prefix}:runs")) == 5


def test_the_json_endpoint_for_keda(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app()
    echo = echo_on(rd)
    queue = queue_of(rd)
    make_due(rd, client, [echo.apply_async((n,), countdown=3600).id for n in range(3)])
    rd.tick()
    web = create_app(rd, read_only=True).test_client()
    response = web.get(f"/api/queues/{queue}")
    assert response.status_code == 200 and response.mimetype == "application/json"
    body = response.get_json()
    assert set(body) == {"queue", *queue_latency.FIELDS, "estimated"}
    assert body["queue"] == queue and body["ready"] == 3 and isinstance(body["oldest_ready_seconds"], float)
    every = web.get("/api/queues").get_json()
    assert every["queues"][queue]["ready"] == 3
    missing = web.get("/api/queues/no-task-routes-here")
    assert missing.status_code == 404 and missing.mimetype == "application/json"
    refused = missing.get_json()
    assert refused["queue"] == "no-task-routes-here" and queue in refused["known_queues"]
    assert "no task routes" in refused["error"]
    # Behind the dashboard's basic auth when it has one (KEDA's TriggerAuthentication gives the credentials).
    guarded = create_app(rd, read_only=True, auth="keda:secret").test_client()
    assert guarded.get(f"/api/queues/{queue}").status_code == 401
    credentials = {"Authorization": "Basic " + base64.b64encode(b"keda:secret").decode()}
    assert guarded.get(f"/api/queues/{queue}", headers=credentials).get_json()["ready"] == 3


def scrape(rd: RedisDelay) -> str:
    """What a real exporter of ``rd``'s store serves at /metrics."""
    server = serve(rd.depot, free_port())
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as response:
            return str(response.read().decode())
    finally:
        server.shutdown()
        server.server_close()


def test_the_exporter_and_status_show_each_queue(make_app: MakeApp, client: redis.Redis) -> None:
    pytest.importorskip("prometheus_client")
    _, rd = make_app()
    echo = echo_on(rd)
    queue = queue_of(rd)
    make_due(rd, client, [echo.apply_async((n,), countdown=3600).id for n in range(2)])
    rd.tick()
    scraped = scrape(rd)
    assert f'redisdelay_queue_ready{{queue="{queue}"}} 2.0' in scraped
    assert f'redisdelay_queue_oldest_ready_seconds{{queue="{queue}"}}' in scraped
    for name in ("in_flight", "paused", "held"):
        assert f'redisdelay_queue_{name}{{queue="{queue}"}}' in scraped
    assert "redisdelay_release_lag_p50_seconds" in scraped and "redisdelay_release_lag_p99_seconds" in scraped
    result = CliRunner().invoke(redisdelay, ["status"], obj=SimpleNamespace(app=rd.app))
    assert result.exit_code == 0, result.output
    assert "queue" in result.output and queue in result.output


# -- the examples of docs/operations.rst ------------------------------------------------------------------------

DOCS = ROOT / "docs" / "operations.rst"
EXAMPLE_QUEUE = "payments"  # the queue the examples scale on
MINUTES = 10


def section_yaml() -> list[dict[str, Any]]:
    """Every YAML document of the section "Queue latency and autoscaling"."""
    text = DOCS.read_text()
    section = text.split("Queue latency and autoscaling\n", 1)[1].split("\n.. _", 1)[0]
    blocks = re.findall(r"\.\. code-block:: yaml\n\n((?:    .*\n|\n)+)", section)
    assert len(blocks) == 3, "the Prometheus scaler, the metrics-api scaler and the plain HPA"
    return [doc for block in blocks for doc in yaml.safe_load_all(textwrap.dedent(block)) if doc]


def documented_queries() -> list[str]:
    """The PromQL queries the section gives: the KEDA triggers', the adapter's (its template filled in as the
    adapter fills it for the HPA's selector) and the release lag's."""
    found = []
    for doc in section_yaml():
        for trigger in doc.get("spec", {}).get("triggers", []):
            if trigger["type"] == "prometheus":
                found.append(trigger["metadata"]["query"])
        for rule in doc.get("externalRules", []):
            series = rule["seriesQuery"].split("{")[0].strip("'")
            query = rule["metricsQuery"].replace("<<.Series>>", series)
            found.append(query.replace("<<.LabelMatchers>>", f'queue="{EXAMPLE_QUEUE}"'))
    found += re.findall(r"``(histogram_quantile\(.+?\))``", DOCS.read_text())
    return found


def test_the_documented_examples_parse_and_use_what_is_served() -> None:
    docs = section_yaml()
    kinds = [doc["kind"] for doc in docs if "kind" in doc]
    assert kinds == ["ScaledObject", "ScaledObject", "TriggerAuthentication", "HorizontalPodAutoscaler"]
    for doc in docs:
        for trigger in doc.get("spec", {}).get("triggers", []):
            if trigger["type"] == "metrics-api":
                assert trigger["metadata"]["url"].endswith(f"/api/queues/{EXAMPLE_QUEUE}")
                assert trigger["metadata"]["valueLocation"] in queue_latency.FIELDS
                assert trigger["authenticationRef"]["name"] == docs[2]["metadata"]["name"]
    (hpa,) = [doc for doc in docs if doc.get("kind") == "HorizontalPodAutoscaler"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == "redisdelay_queue_oldest_ready_seconds"
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {"queue": EXAMPLE_QUEUE}
    assert len(documented_queries()) == 4


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


def test_promtool_evaluates_the_documented_queries_on_a_real_scrape(
    make_app: MakeApp, client: redis.Redis, tmp_path: Path
) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    tool = promtool()
    _, rd = make_app()
    echo = echo_on(rd)
    queue = queue_of(rd)
    make_due(rd, client, [echo.apply_async((n,), countdown=3600).id for n in range(3)])
    rd.tick()
    scraped = scrape(rd)
    series, oldest = [], None
    for family in text_string_to_metric_families(scraped):
        for sample in family.samples:
            labels = dict(sample.labels)
            if labels.get("queue") not in (None, queue):
                continue  # another test's queues
            if "queue" in labels:
                labels["queue"] = EXAMPLE_QUEUE
            values = f"{sample.value!r}x{MINUTES}"
            if sample.name == "redisdelay_release_lateness_seconds_bucket":  # 1 call a second, 0.5 s to 1 s late
                values = f"0+{60 if float(labels['le']) >= 1 else 0}x{MINUTES}"
            if sample.name == "redisdelay_queue_oldest_ready_seconds":
                oldest = sample.value
            for instance in ("a:9808", "b:9808"):  # two exporters: each reports every queue
                tags = {**labels, "job": "celery", "instance": instance}
                text = ", ".join(f'{key}="{value}"' for key, value in sorted(tags.items()))
                series.append({"series": f"{sample.name}{{{text}}}", "values": values})
    assert oldest is not None
    expected = {
        f'max(redisdelay_queue_oldest_ready_seconds{{job="celery", queue="{EXAMPLE_QUEUE}"}})': [{"value": oldest}],
        f'max(redisdelay_queue_ready{{job="celery", queue="{EXAMPLE_QUEUE}"}})': [{"value": 3}],
        f'max by (queue) (redisdelay_queue_oldest_ready_seconds{{queue="{EXAMPLE_QUEUE}"}})': [
            {"labels": f'{{queue="{EXAMPLE_QUEUE}"}}', "value": oldest}
        ],
        "histogram_quantile(0.99, max by (le) (rate(redisdelay_release_lateness_seconds_bucket[5m])))": [
            {"value": 0.995}  # in the (0.5, 1] bucket, 99% of the way
        ],
    }
    assert sorted(documented_queries()) == sorted(expected)
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": query, "eval_time": f"{MINUTES}m", "exp_samples": samples}
                for query, samples in expected.items()
            ],
        }
    ]
    rules = tmp_path / "rules.yml"
    rules.write_text("groups: []\n")
    spec = tmp_path / "test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}))
    done = subprocess.run([tool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
