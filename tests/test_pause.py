"""Pausing a task or a queue for the whole fleet (``rd.pause``, ``rd.resume``, ``rd.paused``): the API and its bad
input, parked calls that fall due while paused, tracked calls due now, calls already queued when the pause is set
(on a real worker), a pause that ends by itself, and the release's bound. Against a real redis-server."""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner, Result
from prometheus_client import CollectorRegistry, generate_latest

from celery_redisdelay import RedisDelay
from celery_redisdelay.cli.commands import redisdelay
from celery_redisdelay.operations.metrics import RedisDelayCollector
from celery_redisdelay.operations.pausing import MOST_REASON, PauseError, parse_duration
from celery_redisdelay.release.releaser import TickReport
from celery_redisdelay.testing import RedisServer, wait_for
from celery_redisdelay.testing.processes import kill_group
from celery_redisdelay.testing.topologies import LocalCluster
from celery_redisdelay.web.app import create_app
from celery_redisdelay.worker.pausing import PausedCalls
from tests import topology_proj
from tests.pool_run import pool_worker

MakeApp = Callable[..., tuple[Celery, RedisDelay]]
TRACKING = {"redisdelay_all_tasks": True, "redisdelay_track_due_now": True}


def queued(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The messages waiting in ``queue``'s list, in the order a worker takes them (kombu pops the right end)."""
    return [json.loads(raw) for raw in reversed(client.lrange(queue, 0, -1))]


def queued_ids(client: redis.Redis, queue: str) -> list[str]:
    return [str(message["headers"]["id"]) for message in queued(client, queue)]


def tasks_of(rd: RedisDelay) -> tuple[Any, Any]:
    @rd.delayed(name="pause.alpha")
    def alpha(n: int) -> int:
        return n

    @rd.delayed(name="pause.beta")
    def beta(n: int) -> int:
        return n

    return alpha, beta


def park_due(task: Any, count: int, *, first: int = 0, **options: Any) -> list[str]:
    """Park ``count`` calls already due, in due order (their etas a second apart, in the past)."""
    now = datetime.now(UTC)
    return [
        str(task.apply_async((first + i,), eta=now - timedelta(seconds=count + 1 - i), **options).id)
        for i in range(count)
    ]


def store_dump(client: redis.Redis, rd: RedisDelay) -> dict[str, Any]:
    return {key: client.dump(key) for key in rd.keys.store_keys}


# -- the API -----------------------------------------------------------------------------------------------------


def test_pause_is_listed_until_resumed(rd: RedisDelay) -> None:
    assert rd.paused() == []
    before = datetime.now(UTC)
    entry = rd.pause(task="pause.alpha", reason="payment provider down")
    assert entry["kind"] == "task" and entry["name"] == "pause.alpha"
    assert entry["until"] is None and entry["reason"] == "payment provider down" and entry["waiting"] == 0
    assert abs((entry["since"] - before).total_seconds()) < 5
    assert rd.paused() == [entry]
    queue_entry = rd.pause(queue="emails")
    assert [(one["kind"], one["name"]) for one in rd.paused()] == [("queue", "emails"), ("task", "pause.alpha")]
    assert queue_entry["reason"] == ""
    assert rd.resume(task="pause.alpha") is True
    assert rd.resume(task="pause.alpha") is False, "not paused any more"
    assert rd.resume(queue="never-paused") is False
    assert [one["name"] for one in rd.paused()] == ["emails"]
    assert rd.resume(queue="emails") is True
    assert rd.paused() == []


def test_pausing_twice_keeps_the_first_since_and_updates_until(rd: RedisDelay) -> None:
    first = rd.pause(task="pause.alpha", reason="first")
    wait_for(lambda: datetime.now(UTC) - first["since"] > timedelta(milliseconds=20), 5, "a later instant")
    second = rd.pause(task="pause.alpha", seconds="10m")
    assert second["since"] == first["since"]
    assert second["until"] is not None
    assert timedelta(minutes=9) < second["until"] - datetime.now(UTC) <= timedelta(minutes=10, seconds=5)
    assert second["reason"] == "first", "an empty reason keeps the one given"
    third = rd.pause(task="pause.alpha", reason="second")
    assert third["since"] == first["since"] and third["until"] is None and third["reason"] == "second"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "give the task or the queue"),
        ({"task": "a", "queue": "b"}, "not both"),
        ({"task": ""}, "non-empty"),
        ({"task": 3}, "non-empty"),
        ({"queue": "a\0b"}, "without NUL"),
        ({"task": "a", "seconds": -1}, "positive"),
        ({"task": "a", "seconds": 0}, "positive"),
        ({"task": "a", "seconds": math.nan}, "positive, finite"),
        ({"task": "a", "seconds": math.inf}, "positive, finite"),
        ({"task": "a", "seconds": "soon"}, "cannot read"),
        ({"task": "a", "seconds": "-5m"}, "cannot read"),
        ({"task": "a", "seconds": True}, "number of seconds"),
        ({"task": "a", "seconds": 1e12}, "at most"),
        ({"task": "a", "reason": "x" * (MOST_REASON + 1)}, "at most 500"),
        ({"task": "a", "reason": 5}, "a text"),
    ],
)
def test_bad_input_is_refused_and_stores_nothing(
    rd: RedisDelay, client: redis.Redis, options: dict[str, Any], message: str
) -> None:
    before = store_dump(client, rd)
    with pytest.raises(PauseError, match=message):
        rd.pause(**options)
    assert store_dump(client, rd) == before
    assert rd.paused() == []


def test_resume_needs_one_target(rd: RedisDelay) -> None:
    with pytest.raises(PauseError, match="not both"):
        rd.resume(task="a", queue="b")
    with pytest.raises(PauseError, match="give the task or the queue"):
        rd.resume()


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("10m", 600), ("2h", 7200), ("1d", 86400), ("90", 90), ("1.5m", 90), (7, 7)]
)
def test_durations(text: Any, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_reason_at_the_limit_is_kept(rd: RedisDelay) -> None:
    assert rd.pause(task="a", reason="é" * MOST_REASON)["reason"] == "é" * MOST_REASON


# -- parked calls ------------------------------------------------------------------------------------------------


def test_parked_calls_wait_while_paused_and_go_in_due_order_after_resume(rd: RedisDelay, client: redis.Redis) -> None:
    alpha, beta = tasks_of(rd)
    queue = rd.app.conf.task_default_queue
    rd.pause(task="pause.alpha", reason="incident")
    paused_ids = park_due(alpha, 6)
    other_ids = park_due(beta, 3, first=100)
    rd.tick()
    assert sorted(queued_ids(client, queue)) == sorted(other_ids), "the other task's calls run on"
    assert rd.paused()[0]["waiting"] == 6
    assert client.zcard(rd.keys.delayed) == 0, "moved aside, out of the delay set"
    assert rd.stats()["paused"] == 6 and rd.stats()["delayed"] == 6, "still parked, for an operator"
    # Later releases do not look at them again.
    rd.tick()
    assert len(queued_ids(client, queue)) == 3
    client.delete(queue)
    assert rd.resume(task="pause.alpha") is True
    rd.tick()
    assert queued_ids(client, queue) == paused_ids, "all of them, once each, in due order"
    assert rd.paused() == [] and client.zcard(rd.keys.paused) == 0 and client.hlen(rd.keys.pauses) == 0
    for call_id in paused_ids:
        found = rd.find(call_id)
        assert found is not None and found.state == "inflight"


def test_a_queue_pause_holds_the_calls_routed_to_it(rd: RedisDelay, client: redis.Redis) -> None:
    alpha, _ = tasks_of(rd)
    queue = rd.app.conf.task_default_queue
    other = f"other-{uuid.uuid4().hex[:8]}"
    rd.pause(queue=queue)
    held = park_due(alpha, 2)
    elsewhere = park_due(alpha, 2, first=10, queue=other)
    prioritized = park_due(alpha, 1, first=20, priority=5)
    rd.tick()
    assert queued_ids(client, queue) == []
    assert client.llen(f"{queue}\x06\x163") == 0
    assert sorted(queued_ids(client, other)) == sorted(elsewhere)
    assert rd.paused()[0]["waiting"] == 3
    rd.resume(queue=queue)
    rd.tick()
    assert queued_ids(client, queue) == held
    assert [m["headers"]["id"] for m in queued(client, f"{queue}\x06\x163")] == prioritized
    client.delete(other)


def test_a_pause_for_seconds_ends_by_itself(rd: RedisDelay, client: redis.Redis) -> None:
    alpha, _ = tasks_of(rd)
    queue = rd.app.conf.task_default_queue
    started = time.monotonic()  # the pause's own start: on a busy machine the parks and tick below took over a second
    entry = rd.pause(task="pause.alpha", seconds=2)
    assert entry["until"] is not None
    ids = park_due(alpha, 3)
    rd.tick()
    assert queued_ids(client, queue) == []

    def released() -> bool:
        rd.tick()
        return queued_ids(client, queue) == ids

    wait_for(released, 10, "the calls of the ended pause to go out")
    assert time.monotonic() - started > 1, "not before the pause ended"
    assert rd.paused() == []


def test_the_release_brings_calls_back_a_step_at_a_time(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_release_batch=10)
    alpha, _ = tasks_of(rd)
    queue = rd.app.conf.task_default_queue
    rd.pause(task="pause.alpha")
    ids = park_due(alpha, 25)
    rd.tick()
    assert rd.paused()[0]["waiting"] == 25 and client.llen(queue) == 0
    rd.resume(task="pause.alpha")
    releaser = rd.releaser
    releaser.release_step(TickReport())
    assert client.llen(queue) == 10, "one step brings back and releases at most a step's worth"
    assert client.zcard(rd.keys.paused) == 15
    rd.tick()
    assert queued_ids(client, queue) == ids


def test_a_call_in_a_gate_leaves_it_for_the_pause(rd: RedisDelay, client: redis.Redis) -> None:
    @rd.delayed(name="pause.limited", limit_concurrency=1)
    def limited(n: int) -> int:
        return n

    queue = rd.app.conf.task_default_queue
    ids = park_due(limited, 3)
    rd.tick()
    assert queued_ids(client, queue) == ids[:1], "one slot: the others wait in their gate"
    rd.pause(task="pause.limited")
    rd.store.ack(ids[0])  # its run ended: a slot is free
    rd.tick()
    assert queued_ids(client, queue) == ids[:1]
    assert rd.paused()[0]["waiting"] == 2
    rd.resume(task="pause.limited")
    rd.tick()
    assert queued_ids(client, queue) == ids[:2], "back under its limits: one slot"


# -- what an operator sees of a paused call: find, cancel, stats ------------------------------------------------------


def test_find_and_stats_show_a_paused_call(rd: RedisDelay, client: redis.Redis) -> None:
    alpha, beta = tasks_of(rd)
    queue = rd.app.conf.task_default_queue
    rd.pause(task="pause.alpha")
    ids = park_due(alpha, 3)
    park_due(beta, 1, first=10)
    parked_meta = client.hmget(rd.keys.meta, ids)
    dues = [client.zscore(rd.keys.delayed, call_id) for call_id in ids]
    rd.tick()
    for call_id, due in zip(ids, dues, strict=True):
        found = rd.find(call_id)
        assert found is not None, "a paused call is still parked"
        assert found.state == "delayed" and found.meta["s"] == "paused" and found.score_ms == due
        assert found.envelope is not None
    stats = rd.stats()
    assert stats["paused"] == 3 and stats["delayed"] == 3
    assert stats["due"] == 0, "no releaser is behind with a paused call"
    rd.resume(task="pause.alpha")
    rd.tick()
    assert queued_ids(client, queue)[1:] == ids
    assert client.hmget(rd.keys.meta, ids) == parked_meta, "back with its metadata as it left"
    assert all(rd.find(call_id).state == "inflight" for call_id in ids)  # type: ignore[union-attr]
    assert rd.stats()["paused"] == 0


def test_cancel_drops_a_paused_call(rd: RedisDelay, client: redis.Redis) -> None:
    alpha, _ = tasks_of(rd)
    queue = rd.app.conf.task_default_queue
    rd.pause(task="pause.alpha")
    ids = park_due(alpha, 4)
    rd.tick()
    assert rd.cancel(ids[1]) is True
    assert rd.cancel(ids[1]) is False, "cancelled once"
    assert rd.cancel_many([ids[2], "unknown-id"]) == [ids[2]]
    assert rd.find(ids[1]) is None and rd.find(ids[2]) is None
    assert int(client.hget(rd.keys.counters, "cancelled") or 0) == 2
    assert rd.paused()[0]["waiting"] == 2 and rd.stats()["paused"] == 2
    rd.resume(task="pause.alpha")
    rd.tick()
    assert queued_ids(client, queue) == [ids[0], ids[3]], "the cancelled calls do not go out"
    assert rd.paused() == [] and client.zcard(rd.keys.paused) == 0


def test_cancel_drops_a_call_a_worker_held_back_and_one_that_left_its_gate(rd: RedisDelay, client: redis.Redis) -> None:
    alpha, _ = tasks_of(rd)

    @rd.delayed(name="pause.limited", limit_concurrency=1)
    def limited(n: int) -> int:
        return n

    queue = rd.app.conf.task_default_queue
    [held] = park_due(alpha, 1)
    gated = park_due(limited, 2, first=10)
    rd.tick()
    assert sorted(queued_ids(client, queue)) == sorted([held, gated[0]]), "one slot: the other waits in its gate"
    rd.pause(task="pause.alpha")
    rd.pause(task="pause.limited")
    assert rd.store.hold_paused(held, "w1", 1) == 1
    rd.store.ack(gated[0])
    rd.tick()  # the gated call leaves its gate for its pause
    client.delete(queue)
    for call_id in (held, gated[1]):
        found = rd.find(call_id)
        assert found is not None and found.state == "delayed" and found.meta["s"] == "paused", call_id
    assert rd.stats()["paused"] == 2
    assert rd.cancel_many([held, gated[1]]) == [held, gated[1]]
    assert rd.stats()["paused"] == 0 and rd.stats()["delayed"] == 0
    rd.resume(task="pause.alpha")
    rd.resume(task="pause.limited")
    rd.tick()
    assert client.llen(queue) == 0, "neither goes out after the resume"


# -- calls due now and calls in flight --------------------------------------------------------------------------


def test_a_tracked_call_due_now_of_a_paused_task_waits(make_app: MakeApp, client: redis.Redis) -> None:
    app, rd = make_app(**TRACKING)
    queue = app.conf.task_default_queue

    @app.task(name="pause.plain", shared=False)
    def plain(n: int) -> int:
        return n

    @app.task(name="pause.other", shared=False)
    def other(n: int) -> int:
        return n

    rd.pause(task="pause.plain")
    held = plain.delay(1)
    sent = other.delay(2)
    assert queued_ids(client, queue) == [sent.id], "the other task's call is tracked and queued at once"
    assert rd.paused()[0]["waiting"] == 1
    rd.tick()
    assert queued_ids(client, queue) == [sent.id]
    rd.resume(task="pause.plain")
    rd.tick()
    assert queued_ids(client, queue) == [sent.id, held.id]
    found = rd.find(held.id)
    assert found is not None and found.state == "inflight"


def test_a_worker_holds_a_queued_call_of_a_paused_task_back(rd: RedisDelay, client: redis.Redis) -> None:
    alpha, _ = tasks_of(rd)
    queue = rd.app.conf.task_default_queue
    [call_id] = park_due(alpha, 1)
    rd.tick()
    assert queued_ids(client, queue) == [call_id]
    rd.pause(task="pause.alpha")
    assert rd.store.hold_paused(call_id, "w1", 2) == 0, "not the delivery in flight"
    assert rd.store.hold_paused(call_id, "w1", 1) == 1
    assert rd.store.hold_paused(call_id, "w1", 1) == 0, "held once"
    client.delete(queue)
    assert rd.paused()[0]["waiting"] == 1
    assert rd.resume(task="pause.alpha")
    rd.tick()
    [message] = queued(client, queue)
    assert message["properties"]["delivery_tag"] == f"{call_id}.2", "a later delivery"
    assert message["headers"]["redelivered"] is True
    rd.pause(task="pause.beta")
    assert rd.store.hold_paused(call_id, "w1", 2) == -1, "its task is not paused"


def test_with_no_pause_the_release_reads_one_key(rd: RedisDelay, client: redis.Redis) -> None:
    """The pause hash is asked once (EXISTS) and nothing else of the pauses is read or written."""
    alpha, _ = tasks_of(rd)
    park_due(alpha, 3)
    client.config_resetstat()
    rd.tick()
    stats = client.info("commandstats")
    assert "cmdstat_hgetall" not in stats
    assert "cmdstat_zrangebylex" not in stats
    assert client.exists(rd.keys.pauses, rd.keys.paused) == 0


# -- on a real worker --------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_queued_calls_do_not_start_on_a_worker_while_paused(redis_server: RedisServer) -> None:
    """Calls already in the broker's queue when the pause is set, parked ones and plain ones Celery sent itself:
    the worker holds them back; after the resume each runs once. Another task's calls run meanwhile."""
    with pool_worker(redis_server, "prefork", concurrency=2, start=False, redisdelay_all_tasks=True) as run:
        record, plain = run.task("pools.record"), run.task("plain.record")
        key, other_key = f"pause-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"
        now = datetime.now(UTC)
        parked = [record.apply_async((key, i), eta=now - timedelta(seconds=10 - i)).id for i in range(6)]
        run.rd.tick()
        sent = [plain.apply_async((key, 100 + i)).id for i in range(3)]  # Celery's own path: not tracked
        queue = run.app.conf.task_default_queue
        assert run.marks.llen(key) == 0
        with redis.Redis.from_url(run.conf["broker_url"]) as broker:
            assert broker.llen(queue) == 9
        run.rd.pause(task="pools.record", reason="test")
        run.rd.pause(task="plain.record", reason="test")
        run.worker.start()
        wait_for(lambda: "ready." in run.worker.output(), 60, "the worker to be ready")

        def held() -> bool:
            run.rd.tick()  # the plain calls the worker took into the store are put aside by the release
            return sum(one["waiting"] for one in run.rd.paused()) == 9

        wait_for(held, 30, "the worker to hold all 9 back")
        # Meanwhile a task that is not paused runs on the same worker (its start and its end noted).
        run.task("pools.sleep").apply_async((other_key, 0), countdown=0)
        wait_for(lambda: (run.rd.tick() or True) and run.marks.llen(other_key) >= 2, 30, "another task to run")
        assert run.marks.llen(key) == 0, "no call of a paused task started"
        run.rd.resume(task="pools.record")
        run.rd.resume(task="plain.record")

        def all_ran() -> bool:
            run.rd.tick()
            return run.marks.llen(key) >= 9

        wait_for(all_ran, 60, "every held call to run after the resume")
        wait_for(lambda: (run.rd.tick() or True) and run.settled(), 30, "the store to settle")
        ran = [note["id"] for note in run.notes(key)]
        assert sorted(ran) == sorted(parked + sent), "each once"


def started_ids(run: Any, key: str) -> list[str]:
    """The ids of the calls noted under ``key`` (``pools.record`` notes each run, ``pools.sleep`` its start)."""
    return [note["id"] for note in run.notes(key) if note.get("at", "start") == "start"]


@pytest.mark.e2e
def test_a_pause_holds_on_two_workers_and_every_call_runs_once_after_the_resume(redis_server: RedisServer) -> None:
    """The issue's target, scaled down: with two workers busy, 20 calls of a task wait in the broker's queue when it
    is paused, and 60 more fall due over 5 s; none starts until the resume, then all start within 2 s, each once.
    Another task's calls run meanwhile. The workers release (precise releasers), no beat."""
    with pool_worker(
        redis_server, "prefork", concurrency=2, hostname="first@%h", start=False, redisdelay_precise_release=True
    ) as run:
        second = run.new_worker("second@%h")
        try:
            run.worker.start()
            second.start()
            for one in (run.worker, second):
                wait_for(lambda one=one: "ready." in one.output(), 60, "both workers to be ready")
            record, sleep = run.task("pools.record"), run.task("pools.sleep")
            queue = run.app.conf.task_default_queue
            key, busy, other = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("paused", "busy", "other"))
            broker = redis.Redis.from_url(run.conf["broker_url"])
            # Both workers busy: two calls running on each, and one more taken by each process (prefetch 1), for
            # 12 s in all, so that the 20 calls below still wait in the broker's queue when the pause comes, however
            # slow the machine is in between.
            for _ in range(8):
                sleep.apply_async((busy, 6), countdown=0)
            wait_for(lambda: len(started_ids(run, busy)) >= 4 and broker.llen(queue) == 0, 30, "the workers busy")
            queued = [record.apply_async((key, i), countdown=0).id for i in range(20)]
            wait_for(lambda: broker.llen(queue) == 20, 10, "the 20 calls to wait in the broker's queue")
            paused_at = time.time()
            run.rd.pause(task="pools.record", reason="incident")
            falling = [record.apply_async((key, 100 + i), countdown=0.1 + i * 5 / 60).id for i in range(60)]
            others = [sleep.apply_async((other, 0), countdown=0.5 * i).id for i in range(10)]
            wait_for(lambda: run.rd.paused()[0]["waiting"] == 80, 30, "all 80 calls to wait on the pause")
            wait_for(lambda: sorted(started_ids(run, other)) == sorted(others), 30, "the other task's calls to run")
            assert started_ids(run, key) == [], "no call of the paused task started"
            time.sleep(max(0.0, paused_at + 7 - time.time()))
            assert started_ids(run, key) == [] and run.rd.paused()[0]["waiting"] == 80
            resumed_at = time.time()
            assert run.rd.resume(task="pools.record")
            wait_for(lambda: len(started_ids(run, key)) >= 80, 60, "every call to run after the resume")
            notes = run.notes(key)
            assert sorted(note["id"] for note in notes) == sorted(queued + falling), "each once"
            starts = [note["at_ms"] / 1000 - resumed_at for note in notes]
            assert min(starts) >= 0, "none before the resume"
            assert max(starts) < 2, f"all within 2 s of the resume (the last after {max(starts):.2f} s)"
            assert len({note["pid"] for note in notes}) > 1, "run by more than one process"
            wait_for(run.settled, 30, "the store to settle")  # nothing left in flight to run again
            assert len(run.notes(key)) == 80, "none ran twice"
            broker.close()
        except BaseException:
            print(second.output()[-6000:])
            raise
        finally:
            second.stop()
            second.remove_files()


@pytest.mark.e2e
def test_a_pause_holds_across_a_sigkill_of_the_worker_and_of_redis() -> None:
    """Faults while two tasks are paused: the worker and Redis (with AOF, fsync always) are SIGKILLed and started
    again, with calls parked, calls falling due and calls Celery sent itself waiting in the broker's queue for the new
    worker. The pauses still hold (no call of them starts), and after the resume every call runs, each once: none
    lost."""
    server = RedisServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"]).start()
    try:
        with pool_worker(
            server,
            "prefork",
            concurrency=2,
            redisdelay_precise_release=True,
            redisdelay_all_tasks=True,
            redisdelay_track_due_now=False,  # the calls due now take Celery's own path, into the broker's queue
        ) as run:
            record, plain, sleep = run.task("pools.record"), run.task("plain.record"), run.task("pools.sleep")
            key, other = f"paused-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"
            queue = run.app.conf.task_default_queue
            run.rd.pause(task="pools.record", reason="incident")
            run.rd.pause(task="plain.record", reason="incident")
            before = [record.apply_async((key, i), countdown=0.1 + i * 0.1).id for i in range(30)]
            wait_for(lambda: waiting(run) == 30, 30, "30 calls to wait on the pause")
            run.worker.kill()
            assert server.process is not None
            kill_group(server.process)  # as a crash would: no save at exit; the AOF has every write
            server.process.wait(10)
            server.process = None
            server.start()
            pauses = run.rd.paused()
            assert [one["reason"] for one in pauses] == ["incident"] * 2 and waiting(run) == 30, "all survived"
            # Calls Celery sends itself wait in the broker's queue for the new worker, which holds them back.
            sent = [plain.apply_async((key, 200 + i)).id for i in range(5)]
            with redis.Redis.from_url(run.conf["broker_url"]) as broker:
                assert broker.llen(queue) == 5
            run.restart_after_kill()
            after = [record.apply_async((key, 100 + i), countdown=0.1 + i * 0.2).id for i in range(10)]
            others = [sleep.apply_async((other, 0), countdown=0.2 * i).id for i in range(5)]
            wait_for(lambda: sorted(started_ids(run, other)) == sorted(others), 30, "the other task's calls to run")
            wait_for(lambda: (run.rd.tick() or True) and waiting(run) == 45, 30, "the later calls to wait too")

            def barrier() -> None:
                """Calls of the other task sent now and run: the worker took every message queued before them."""
                markers = [sleep.apply_async((other, 0)).id for _ in range(2)]  # one per pool process
                wait_for(lambda: set(markers) <= set(started_ids(run, other)), 30, "the markers to run")

            barrier()
            assert started_ids(run, key) == [], "no call of a paused task started"
            assert run.rd.resume(task="pools.record") and run.rd.resume(task="plain.record")
            wait_for(lambda: len(started_ids(run, key)) >= 45, 60, "every call to run after the resume")
            wait_for(lambda: (run.rd.tick() or True) and run.settled(), 30, "the store to settle")
            barrier()
            assert sorted(started_ids(run, key)) == sorted(before + after + sent), "none lost, each once"
    finally:
        server.stop()


def waiting(run: Any) -> int:
    """The calls waiting on every pause of ``run``'s store."""
    return sum(one["waiting"] for one in run.rd.paused())


# -- the command line --------------------------------------------------------------------------------------------


def cli(rd: RedisDelay, *args: str) -> Result:
    """Run ``celery -A <app> redisdelay ARGS`` in this process, as Celery's CLI would."""
    return CliRunner().invoke(redisdelay, list(args), obj=SimpleNamespace(app=rd.app))


def test_the_commands_pause_list_and_resume(rd: RedisDelay) -> None:
    done = cli(rd, "pause", "--task", "pause.alpha", "--for", "10m", "--reason", "payments down")
    assert done.exit_code == 0, done.output
    assert "task pause.alpha: paused since" in done.output and "payments down" in done.output
    assert rd.paused()[0]["until"] is not None
    listed = cli(rd, "paused")
    assert listed.exit_code == 0 and "pause.alpha" in listed.output and "payments down" in listed.output
    as_json = json.loads(cli(rd, "paused", "--json").output)
    assert as_json[0]["name"] == "pause.alpha" and as_json[0]["waiting"] == 0 and as_json[0]["until"]
    status = cli(rd, "status")
    assert status.exit_code == 0 and "task pause.alpha (0 waiting)" in status.output, status.output
    resumed = cli(rd, "resume", "--task", "pause.alpha")
    assert resumed.exit_code == 0 and "resumed" in resumed.output
    again = cli(rd, "resume", "--task", "pause.alpha")
    assert again.exit_code == 0 and "was not paused" in again.output
    assert "nothing is paused" in cli(rd, "paused").output
    assert re.search(r"^paused\s+nothing$", cli(rd, "status").output, re.MULTILINE)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pause"], "give the task or the queue"),
        (["pause", "--task", "a", "--queue", "b"], "not both"),
        (["pause", "--task", "a", "--for", "soon"], "cannot read"),
        (["pause", "--task", "a", "--for", "-5m"], "cannot read"),
        (["pause", "--queue", "a", "--reason", "x" * 501], "at most 500"),
        (["resume"], "give the task or the queue"),
    ],
)
def test_the_commands_refuse_bad_input(rd: RedisDelay, args: list[str], message: str) -> None:
    result = cli(rd, *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert rd.paused() == []


# -- metrics -----------------------------------------------------------------------------------------------------


def test_the_exporter_says_what_is_paused(rd: RedisDelay) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RedisDelayCollector(rd))
    assert "redisdelay_paused_targets 0.0" in generate_latest(registry).decode()
    alpha, _ = tasks_of(rd)
    rd.pause(task="pause.alpha")
    park_due(alpha, 2)
    rd.tick()
    text = generate_latest(registry).decode()
    assert "redisdelay_paused_targets 1.0" in text
    assert 'redisdelay_paused_calls{kind="task",name="pause.alpha"} 2.0' in text
    assert 'redisdelay_paused_since_timestamp_seconds{kind="task",name="pause.alpha"}' in text


# -- shards, the generic claim, the worker's cache ------------------------------------------------------------------


def test_a_pause_holds_on_every_shard(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_shards=3)
    alpha, beta = tasks_of(rd)
    queue = rd.app.conf.task_default_queue
    rd.pause(task="pause.alpha")
    assert all(store.client.hexists(store.keys.pauses, "task:pause.alpha") for store in rd.shards.all())
    ids = park_due(alpha, 12)
    others = park_due(beta, 3, first=50)
    assert len({rd.shards.home(call_id).keys.tag for call_id in ids}) > 1, "spread over the shards"
    rd.tick()
    assert sorted(queued_ids(client, queue)) == sorted(others)
    assert rd.paused()[0]["waiting"] == 12
    client.delete(queue)
    assert rd.resume(task="pause.alpha")
    rd.tick()
    assert sorted(queued_ids(client, queue)) == sorted(ids)
    assert rd.paused() == []


def test_the_generic_claim_holds_paused_calls_too(rd: RedisDelay) -> None:
    alpha, beta = tasks_of(rd)
    rd.pause(task="pause.alpha")
    park_due(alpha, 2)
    others = park_due(beta, 2, first=10)
    assert [call.id for call in rd.store.claim(100, 5000)] == others
    assert rd.paused()[0]["waiting"] == 2
    rd.resume(task="pause.alpha")
    assert len(rd.store.claim(100, 5000)) == 2


def test_a_worker_reads_the_pauses_at_most_once_a_refresh(rd: RedisDelay, client: redis.Redis) -> None:
    calls = PausedCalls(rd.depot, rd.rules_of, lambda task: True, "w1", refresh=0.3)
    message = SimpleNamespace(headers={"task": "pause.alpha", "id": "x"}, delivery_info={"routing_key": "q"})
    client.config_resetstat()
    assert not any(calls.paused(message) for _ in range(50))
    assert client.info("commandstats")["cmdstat_hgetall"]["calls"] == 1, "one read for 50 messages"
    rd.pause(task="pause.alpha")
    assert not calls.paused(message), "the cached set stands until the refresh"
    wait_for(lambda: calls.paused(message), 5, "the refresh to see the pause")
    assert client.info("commandstats")["cmdstat_hgetall"]["calls"] <= 2 + 5 / 0.3
    rd.resume(task="pause.alpha")
    rd.pause(queue="q")
    wait_for(lambda: calls.paused(message) and calls.queues == frozenset({"q"}), 5, "the queue pause")
    assert calls.tasks == frozenset(), "paused by the queue it came by"


# -- the dashboard -------------------------------------------------------------------------------------------------


def test_the_dashboard_lists_pauses_with_a_banner_and_pauses_and_resumes(rd: RedisDelay) -> None:
    web = create_app(rd).test_client()
    html = web.get("/").get_data(as_text=True)
    assert "Nothing is paused." in html and "paused-banner" not in html
    token = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]
    assert web.post("/pauses", data={"kind": "task", "name": "pause.alpha", "reason": "a"}).status_code == 400
    done = web.post("/pauses", data={"csrf_token": token, "kind": "task", "name": "pause.alpha", "for": "10m"})
    assert done.status_code == 302
    assert rd.paused()[0]["name"] == "pause.alpha" and rd.paused()[0]["until"] is not None
    bad = web.post("/pauses", data={"csrf_token": token, "kind": "task", "name": "x", "for": "soon"})
    assert bad.status_code == 302 and [one["name"] for one in rd.paused()] == ["pause.alpha"]
    for url in ("/", "/calls/delayed"):
        page = web.get(url).get_data(as_text=True)
        assert "paused-banner" in page and "task pause.alpha" in page, url
    assert web.post("/pauses/resume", data={"csrf_token": token, "kind": "task", "name": "pause.alpha"}).status_code
    assert rd.paused() == []
    read_only = create_app(rd, read_only=True).test_client()
    rd.pause(queue="emails")
    page = read_only.get("/").get_data(as_text=True)
    assert "paused-banner" in page and 'action="/pauses' not in page
    assert read_only.post("/pauses/resume", data={"kind": "queue", "name": "emails"}).status_code == 403
    assert rd.paused()[0]["name"] == "emails"


def test_status_as_json_says_what_is_paused(rd: RedisDelay) -> None:
    rd.pause(queue="emails", reason="smtp down")
    found = json.loads(cli(rd, "status", "--json").output)
    assert [(one["kind"], one["name"], one["reason"]) for one in found["paused"]] == [("queue", "emails", "smtp down")]


def test_a_pause_and_its_calls_survive_a_restart_of_redis(make_app: MakeApp) -> None:
    server = RedisServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"]).start()
    try:
        app, rd = make_app(broker_url=f"{server.url}/0", redisdelay_url=f"{server.url}/0")
        alpha, _ = tasks_of(rd)
        queue = app.conf.task_default_queue
        rd.pause(task="pause.alpha", reason="incident")
        ids = park_due(alpha, 3)
        rd.tick()
        server.restart()
        client = redis.Redis.from_url(f"{server.url}/0")
        wait_for(lambda: client.ping(), 30, "the restarted server")
        [entry] = rd.paused()
        assert entry["reason"] == "incident" and entry["waiting"] == 3
        park_due(alpha, 1, first=10)
        rd.tick()
        assert client.llen(queue) == 0
        assert rd.resume(task="pause.alpha")
        rd.tick()
        assert queued_ids(client, queue)[:3] == ids and client.llen(queue) == 4
        client.close()
    finally:
        server.stop()


def test_a_pause_holds_on_a_redis_cluster(
    local_cluster: LocalCluster, redis_server: RedisServer, client: redis.Redis
) -> None:
    conf = {
        "broker_url": f"{redis_server.url}/0",
        "redisdelay_url": local_cluster.url.replace("redis://", "redis+cluster://"),
        "redisdelay_shards": 3,
        "redisdelay_key_prefix": f"cl-{uuid.uuid4().hex[:6]}",
        "task_default_queue": f"cl-queue-{uuid.uuid4().hex[:6]}",
    }
    app, rd = topology_proj.make_app(conf, name=f"cl{uuid.uuid4().hex[:4]}")
    try:
        alpha, beta = tasks_of(rd)
        queue = app.conf.task_default_queue
        rd.pause(task="pause.alpha", seconds=600)
        ids = park_due(alpha, 9)
        others = park_due(beta, 2, first=50)
        rd.tick()
        assert sorted(queued_ids(client, queue)) == sorted(others)
        [entry] = rd.paused()
        assert entry["waiting"] == 9 and entry["until"] is not None
        client.delete(queue)
        assert rd.resume(task="pause.alpha")
        rd.tick()
        assert sorted(queued_ids(client, queue)) == sorted(ids)
        assert rd.paused() == []
    finally:
        client.delete(conf["task_default_queue"])
        app.close()
