"""The chaos runner at CI size (``python -m chaos``): under worker, beat and releaser kills, a Redis restart,
SIGKILLs of Redis and dropped connections, with pool processes forked anew every 20 tasks beside the workers'
precise releaser threads, no validation message goes missing but what Redis's own bound allows a SIGKILL to lose
and no pool process hangs; a one-minute soak with the broker on its own Redis leaves no key behind. Timings are
not judged here. Also the runner's ledger, which tells an acknowledged park that Redis lost, against a real server,
and a park whose reply is lost on the way back, retried by the client: the history counts it once, as the ledger
does."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
from celery import Celery
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redisdelay import RedisDelay
from celery_redisdelay.operations.history import read_history
from chaos.analysis import read_runs
from chaos.harness.ledger import EventLog
from chaos.ledger import CALL, FSYNC_BOUND_SECONDS, Ledger, exposure

from .conftest import run_module

CHAOS_TIMEOUT = 240
CI_SIZE = (
    "--count",
    "2000",
    "--worker-kills",
    "5",
    "--redis-restarts",
    "1",
    "--redis-kills",
    "2",
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
    # The workers fork a new pool process after every 20 tasks while their precise releaser thread runs: none
    # may hang (the report counts hung pool processes).
    "--precise-in-worker",
    "--max-tasks-per-child",
    "20",
    # The validation gives up before the test does, so a failing run still prints its report.
    "--deadline",
    "180",
)
SOAK_TIMEOUT = 300
CI_SOAK = (
    "--soak",
    "1",
    "--rate",
    "10",
    "--broker-apart",
    "--worker-kills",
    "1",
    "--releaser-kills",
    "1",
    "--beat-kills",
    "0",
    "--redis-kills",
    "1",
    "--broker-kills",
    "1",
    "--client-kills",
    "1",
    "--deadline",
    "150",
)


def run_chaos(tmp_path: Path, args: tuple[str, ...], timeout: float) -> tuple[int, str, dict[str, Any]]:
    out = tmp_path / "chaos.json"
    status, output = run_module("chaos", *args, "--json", str(out), timeout=timeout)
    print(output)
    return status, output, json.loads(out.read_text())


@pytest.mark.e2e
@pytest.mark.slow  # CI's battle runs the same faults for three minutes
@pytest.mark.timeout(CHAOS_TIMEOUT + 90)
def test_chaos_run_loses_no_message(tmp_path: Path) -> None:
    status, output, report = run_chaos(tmp_path, CI_SIZE, CHAOS_TIMEOUT)

    assert report["result"]["expected"] == 2000, output
    kills = report["losses"]["kills"]
    assert len(kills) == 2 and all(kill["exposed"] is not None for kill in kills), output
    assert report["losses"]["lost_beyond_bound"] == 0, output
    assert report["losses"]["missing_other"] == 0, output
    assert report["settings"]["precise_in_worker"] and report["settings"]["max_tasks_per_child"] == 20, output
    assert report["hung_processes"] == [], output
    # The history, written by the same scripts as the changes it counts, agrees with the ledger after the kills.
    history = report["history"]
    assert history["ok"] and history["calls"] == 2000, output
    assert {row["name"] for row in history["totals"]} >= {"parked", "released", "acked", "swept", "dead_lettered"}
    assert status == 0, output


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(SOAK_TIMEOUT + 90)
def test_a_short_soak_loses_nothing_and_leaves_no_key(tmp_path: Path) -> None:
    status, output, report = run_chaos(tmp_path, CI_SOAK, SOAK_TIMEOUT)

    soak = report["soak"]
    assert report["result"]["expected"] > 0 and report["losses"]["missing_other"] == 0, output
    assert set(soak["redis"]) == {"store", "broker"}, output
    assert soak["leaked_keys"] == [], output
    names = {row["name"] for row in soak["rss"]}
    assert {"runner", "redis store", "redis broker"} <= {name.split(" :")[0] for name in names}, output
    assert any(name.startswith("worker") and name.endswith("pool") for name in names), output
    assert status == 0, output


def test_the_ledger_finds_an_acknowledged_park_that_is_gone(rd: RedisDelay, tmp_path: Path) -> None:
    @rd.delayed(name="tests.chaos.noop")
    def noop(run_id: str, number: int) -> None:
        return None

    ledger = Ledger(tmp_path / "ledger.jsonl")
    try:
        ids = [noop.apply_async(("run", number), countdown=60).id for number in range(3)]
        for number, call_id in enumerate(ids):
            ledger.record(call_id, number, CALL)
        processed_key = rd.keys.validation_keys("run")[0]
        assert rd.cancel(ids[1]) and rd.cancel(ids[2])
        rd.client.hset(processed_key, "1", 1)  # 1 ran and was acknowledged; 2 is simply gone

        lost = ledger.lost(rd.client, rd.shards.stores, processed_key, before=ledger.entries[-1].t)

        assert [entry.id for entry in lost] == [ids[2]]
        assert exposure(ledger.entries, ledger.entries[-1].t) == 3
        assert exposure(ledger.entries, ledger.entries[-1].t + FSYNC_BOUND_SECONDS + 1) == 0
        lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
        assert [json.loads(line)["id"] for line in lines] == ids
    finally:
        ledger.close()


def test_the_runs_are_read_back_from_the_workers_event_files(tmp_path: Path) -> None:
    log = EventLog(str(tmp_path))
    log.write(e="start", id="a", run="r", n=1, items=None)
    log.write(e="end", id="a", state="SUCCESS", exc=None)
    log.write(e="start", id="b", run="other", n=2, items=None)  # another validation's
    log.write(e="end", id="b", state="SUCCESS", exc=None)
    log.write(e="start", id="c", run="r", n=3, items=[4, 5])  # a batch, cut short
    with (tmp_path / f"events-{os.getpid()}.jsonl").open("a") as file:
        file.write('{"e":"end","id":"c","sta')  # a line cut by a SIGKILL

    runs = read_runs(tmp_path, "r")

    assert sorted(runs) == ["a", "c"]
    (first,), (cut,) = runs["a"], runs["c"]
    assert first.state == "SUCCESS" and first.recorded and first.pid == os.getpid() and first.ended is not None
    assert cut.numbers == (3, 4, 5) and cut.state is None and cut.ended is None


class LosingReplies(redis.Connection):
    """A connection that reads the server's reply to a script call naming an armed call id, then drops it as a
    broken connection would: the script ran on the real server, and the client never hears that it did."""

    armed: ClassVar[dict[str, int]] = {}  # call id -> replies still to drop
    dropped: ClassVar[list[str]] = []
    lock = threading.Lock()

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        packed = b"".join(command) if isinstance(command, list) else command
        self._about = next((i for i in self.armed if i.encode() in packed and b"EVALSHA" in packed), None)
        super().send_packed_command(command, check_health)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        reply = super().read_response(*args, **kwargs)
        about = getattr(self, "_about", None)
        with self.lock:
            if about is not None and self.armed.get(about, 0) > 0:
                self.armed[about] -= 1
                self.dropped.append(about)
                self.disconnect()
                raise redis.ConnectionError(f"the reply to the park of {about} was lost")
        return reply


def losing_replies(retries: int = 3) -> dict[str, Any]:
    """Connection options of a store client whose replies :class:`LosingReplies` drops, and that redis-py sends
    again ``retries`` times."""
    return {
        "connection_class": LosingReplies,
        "retry": Retry(NoBackoff(), retries),
        "retry_on_error": [redis.ConnectionError],
    }


@pytest.mark.parametrize("drops", [1, 2], ids=["the-direct-path-tries-again", "redis-py-retries-too"])
def test_a_park_whose_reply_was_lost_is_counted_once(
    make_app: Callable[..., tuple[Celery, RedisDelay]], tmp_path: Path, drops: int
) -> None:
    """The park lands, its reply is dropped, the client sends it again (the store's direct path falls back to
    redis-py's, which retries under the client's policy): the history and the ledger agree on every count."""
    _, rd = make_app(redisdelay_connection_options=losing_replies())

    @rd.delayed(name="tests.chaos.lost_reply")
    def noop(run_id: str, number: int) -> None:
        return None

    ledger = Ledger(tmp_path / "ledger.jsonl")
    try:
        unlucky = rd.shards.new_id()
        LosingReplies.armed[unlucky] = drops
        for number in range(5):
            options = {"task_id": unlucky} if number == 2 else {}
            ledger.record(noop.apply_async(("run", number), countdown=60, **options).id, number, CALL)
        assert LosingReplies.dropped.count(unlucky) == drops, "the park's reply was lost"
        ids = [entry.id for entry in ledger.entries]
        assert unlucky in ids and rd.stats()["delayed"] == 5

        for call_id in ids:  # due now: released, then run to an end
            store = rd.shards.home(call_id)
            store.client.zadd(store.keys.delayed, {call_id: 0})
        assert rd.tick()["released"] == 5
        assert all(rd.shards.first(i, lambda store, i=i: store.ack(i)) for i in ids)

        totals = read_history(rd.depot, 5).totals()
        assert {name: totals[name] for name in ("parked", "released", "acked")} == dict.fromkeys(
            ("parked", "released", "acked"), len(ledger.calls_before(float("inf")))
        )
    finally:
        LosingReplies.armed.pop(unlucky, None)
        ledger.close()
