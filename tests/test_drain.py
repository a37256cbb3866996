"""The way out (``celery -A proj redisdelay drain``): every call waiting in the store handed back to Celery, then run by
a worker of the same app without the extension, once each, at or after its eta (operations/drain.py).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from celery_redisdelay.operations.drain import DrainError, drain
from celery_redisdelay.testing import RedisServer, free_port, wait_for, worker
from tests.conftest import ROOT

RECORD = "tests.drain_proj.record"


@pytest.fixture
def proj(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Any]:
    """``tests.drain_proj`` with the extension, on a prefix and a broker database of this test's own."""
    monkeypatch.setenv("REDISDELAY_TEST_URL", redis_server.url)
    monkeypatch.setenv("REDISDELAY_TEST_PREFIX", f"drain-{request.node.name[:40]}")
    monkeypatch.delenv("REDISDELAY_TEST_PLAIN", raising=False)
    module = importlib.reload(importlib.import_module("tests.drain_proj"))
    for db in (8, 9, 10):
        redis_server.client().execute_command("SELECT", db)
    for client in (module.marks, module.rd.client, module.app.connection().default_channel.client):
        client.flushdb()
    yield module
    module.app.close()


def cli(module: ModuleType, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", module.__name__, "redisdelay", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**env_of(), **(env or {})},
    )


def env_of() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def runs(module: ModuleType, key: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in module.marks.lrange(key, 0, -1)]


@pytest.mark.e2e
def test_every_waiting_call_runs_once_at_its_eta_on_a_worker_without_the_extension(proj: Any) -> None:
    rd = proj.rd
    # 50 calls of a paused task, set aside on the pause once released (no worker of the extension runs here);
    # then 1,000 calls due over the next 20 s, and 20 items held in an open batch group.
    rd.pause(task=RECORD, reason="drain test")
    paused = [proj.record.apply_async(("runs", 1000 + n), countdown=0.1).id for n in range(50)]
    wait_for(lambda: rd.tick() and rd.paused()[0]["waiting"] == 50, 30, "50 calls set aside on the pause")
    assert all(rd.find(call_id).meta["s"] == "paused" for call_id in paused)
    parked = [proj.record.apply_async(("runs", n), countdown=2 + n * 0.018).id for n in range(1000)]
    for n in range(20):
        proj.gather.add("open", n)
    due = {call_id: rd.find(call_id).score_ms for call_id in parked + paused}
    assert all(rd.find(call_id) is not None for call_id in parked + paused)
    assert rd.stats()["batch_groups"] == 1

    done = cli(proj, "drain", "--force", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["handed_back"] == 1050, report
    assert report["open_batch_groups"] == 1 and report["batch_items"] == 20, report
    assert rd.stats()["delayed"] == 0 and rd.find(parked[0]) is None and rd.find(paused[0]) is None
    # A second drain finds nothing to hand out.
    again = cli(proj, "drain", "--force", "--json")
    assert json.loads(again.stdout)["handed_back"] == 0, again.stdout + again.stderr

    plain = worker(
        "tests.drain_proj",
        concurrency=4,
        queues="drain",
        env={**env_of(), "REDISDELAY_TEST_PLAIN": "1"},
        cwd=str(ROOT),
    ).start()
    try:
        wait_for(lambda: proj.marks.llen("runs") >= 1050, 90, "the 1,050 calls to run on the plain worker")
    finally:
        plain.stop()
        print(plain.output()[-3000:])
        plain.remove_files()
    ran = runs(proj, "runs")
    # Stopped warmly, with nothing left in the queue or unacknowledged: no copy is left to run a second time.
    broker = proj.app.connection().default_channel.client
    assert broker.llen("drain") == 0 and broker.zcard("unacked_index") == 0
    ids = [entry["id"] for entry in ran]
    assert sorted(ids) == sorted(parked + paused), "a call was lost or ran twice"
    early = [(e["id"], due[e["id"]] - e["ms"]) for e in ran if e["ms"] < due[e["id"]]]
    assert not early, f"ran before their eta (id, ms early): {early[:5]}"
    # The eta the worker saw is the call's due time, so Celery's own worker held it: none ran from the store.
    assert all(entry["eta"] for entry in ran if entry["id"] in parked)


def test_a_broker_that_refuses_keeps_the_calls_for_the_next_drain(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RedisServer() as broker:
        monkeypatch.setenv("REDISDELAY_TEST_URL", redis_server.url)
        monkeypatch.setenv("REDISDELAY_TEST_BROKER", f"{broker.url}/0")
        monkeypatch.setenv("REDISDELAY_TEST_PREFIX", "drain-refused")
        proj = importlib.reload(importlib.import_module("tests.drain_proj"))
        rd = proj.rd
        rd.client.flushdb()
        try:
            ids = [proj.record.apply_async(("runs", n), countdown=600).id for n in range(30)]
            broker.terminate()  # each publish fails now; what the drain took stays in the store
            with pytest.raises(DrainError, match="drain again"):
                drain(proj.app, rd.depot, rd.celery_send_task)
            store = rd.depot.store
            taken = len(store.undrained(1000))
            assert taken > 0 and taken + rd.stats()["delayed"] == 30
            # The broker back: the next drain hands out what the first took, then the rest; nothing twice.
            broker.start()
            report = drain(proj.app, rd.depot, rd.celery_send_task)
            assert sorted(report.handed) == sorted(ids)
            assert store.undrained(1000) == [] and rd.stats()["delayed"] == 0
            assert broker.client().llen("drain") == 30
        finally:
            proj.app.close()


def test_a_drain_of_a_store_that_is_down_fails_saying_so(proj: Any) -> None:
    port = free_port()
    done = cli(proj, "drain", "--force", env={"REDISDELAY_TEST_URL": f"redis://127.0.0.1:{port}"})
    assert done.returncode == 1
    assert "unreachable" in done.stderr, done.stderr
