"""The delivery contract (docs/guarantees.rst, "What becomes of a run cut short"): a worker SIGKILLed while it runs
a call and holds others it has not started. The calls it had not started run again on another worker, whatever the
task. The one it was running runs again if its task acknowledges late or is an ``@rd.delayed`` task; if it
acknowledges early (Celery's default) it becomes a dead letter saying what happened, and runs again only when a
person requeues it. On real workers, prefork and threads, with no beat and no releaser: the workers release and
sweep themselves."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redisdelay import RedisDelay
from celery_redisdelay.errors import ConfigurationError
from celery_redisdelay.settings import DEAD_LETTER, RUN_AGAIN
from celery_redisdelay.store.scripts import compose
from celery_redisdelay.testing import RedisServer, wait_for
from celery_redisdelay.worker.contract import check_tasks, worker_lost
from tests.pool_run import PoolRun, pool_worker
from tests.test_lease_workers import held
from tests.test_store import ENVELOPE, LONG_MS, SHORT_MS, claim_one, entry, redis_ms, sweep_until

MakeApp = Callable[..., tuple[Celery, RedisDelay]]

TRACKING = {"redisdelay_all_tasks": True, "redisdelay_track_due_now": True}
#: A short lease, so a dead worker's calls come back within seconds.
SHORT = {"redisdelay_lease": 3.0, "redisdelay_lease_renewal": 0.5}

CASES = [
    # (pool, task, how the long call is sent, whether its run cut short runs again)
    pytest.param("prefork", "plain.sleep", {}, False, id="prefork-early-ack-due-now"),
    pytest.param("threads", "plain.sleep", {}, False, id="threads-early-ack-due-now"),
    pytest.param("prefork", "plain.sleep", {"countdown": 0.5}, False, id="prefork-early-ack-parked"),
    pytest.param("prefork", "plain.sleep_late", {}, True, id="prefork-acks-late-due-now"),
    pytest.param("threads", "plain.sleep_late", {"countdown": 0.5}, True, id="threads-acks-late-parked"),
    pytest.param("prefork", "pools.sleep", {"countdown": 0.5}, True, id="prefork-delayed-task"),
]


def kill_while_running(run: PoolRun, key: str, name: str, options: dict[str, Any]) -> tuple[str, list[str]]:
    """Start a long call of ``name`` on the run's worker (named ``first``), have it prefetch six quick ones, SIGKILL
    it, start a worker named ``second``; the long call's id and the quick ones'."""
    sleep = run.task(name)
    long = sleep.apply_async((key, 600.0), **options)
    wait_for(lambda: any(n["at"] == "start" for n in run.notes(key)), 30, "the long call to start")
    quick = [sleep.delay(key, 0.0).id for _ in range(6)]
    broker = redis.Redis.from_url(run.conf["broker_url"])
    try:
        wait_for(lambda: broker.llen(run.conf["task_default_queue"]) == 0, 30, "the worker to prefetch them")
    finally:
        broker.close()
    wait_for(
        lambda: all((held(run, i) or "").startswith("first@") for i in [long.id, *quick]),
        30,
        "the worker to hold every call it has",
    )
    first = run.worker
    first.kill()
    run.marks.set(f"{key}:sleep", 0)  # the long call, if it runs again, ends at once
    run.worker = run.new_worker("second@%h").start()
    wait_for(lambda: "ready." in run.worker.output(), 60, "the second worker to be ready")
    first.remove_files()
    return long.id, quick


@pytest.mark.e2e
@pytest.mark.parametrize(("pool", "name", "options", "runs_again"), CASES)
def test_a_run_cut_short_with_its_worker_keeps_its_tasks_contract(
    redis_server: RedisServer, pool: str, name: str, options: dict[str, Any], runs_again: bool
) -> None:
    with pool_worker(
        redis_server, pool, concurrency=1, hostname="first@%h", worker_prefetch_multiplier=10, **TRACKING, **SHORT
    ) as run:
        key = f"{run.prefix}:runs"
        long, quick = kill_while_running(run, key, name, options)

        def on_second() -> set[str]:
            return {n["id"] for n in run.notes(key) if n["worker"].startswith("second@")}

        wait_for(lambda: on_second() >= set(quick), 60, "every call the killed worker had not started to run again")
        if runs_again:
            wait_for(lambda: long in on_second(), 60, "the run cut short to run again")
            assert run.starts_by_worker(key)[long] == ["first", "second"]
        else:
            wait_for(lambda: state(run, long) == "dead", 60, "the run cut short to be dead-lettered")
            entry = run.rd.find(long)
            assert entry is not None
            why = str(entry.meta.get("why"))
            assert why.startswith("worker lost: the run of delivery 1 that started on first@"), why
            assert "requeue it" in why
            assert int(run.rd.client.hget(run.rd.keys.counters, "worker_lost") or 0) == 1
            assert run.starts_by_worker(key)[long] == ["first"], "it does not run again by itself"
            [start] = [n for n in run.notes(key) if n["id"] == long and n["at"] == "start"]
            assert (start["phase"], start["once"]) == ("running", 1), "the start was written before the body ran"
            assert run.rd.requeue(long), "a person requeues it"
            wait_for(lambda: long in on_second(), 60, "the requeued call to run")
            assert run.starts_by_worker(key)[long] == ["first", "second"]
        wait_for(run.settled, 30, "every call to be acknowledged")
        assert all(run.starts_by_worker(key)[call_id] == ["second"] for call_id in quick), "each ran once"


def state(run: PoolRun, call_id: str) -> str | None:
    entry = run.rd.find(call_id)
    return entry.state if entry is not None else None


@pytest.mark.e2e
def test_a_call_to_a_topic_exchange_runs_at_once_with_no_beat_and_is_tracked(redis_server: RedisServer) -> None:
    """A call due now routed to a topic exchange cannot be pushed by send.lua: it is parked due now. With no beat,
    the workers' releasers send it at once, and it is tracked as a released call."""
    with pool_worker(redis_server, "threads", concurrency=2, topic_queue="topical", **TRACKING) as run:
        key = f"{run.prefix}:runs"
        ids = [run.task("plain.record").delay(key, n).id for n in range(5)]
        wait_for(lambda: len(run.notes(key)) >= 5, 30, "the calls to run")
        assert sorted(n["id"] for n in run.notes(key)) == sorted(ids)
        assert {n["phase"] for n in run.notes(key)} == {"running"}, "the store knew each call while it ran"
        wait_for(run.settled, 30, "every call to be acknowledged")


@pytest.mark.e2e
def test_a_worker_that_does_not_release_says_so_when_nothing_releases(redis_server: RedisServer) -> None:
    with pool_worker(redis_server, "threads", concurrency=1, redisdelay_precise_release=False, **TRACKING) as run:
        wait_for(lambda: "nothing releases" in run.worker.output(), 30, "the worker's warning")
        assert "redisdelay_precise_release is False and no releaser has run ever" in run.worker.output()


# -- the store's side, against a real redis-server -----------------------------------------------------------------


def start_and_lose(rd: RedisDelay, call_id: str, op: str) -> None:
    """Park ``call_id``, release it, start it on ``w1@host`` with a 50 ms lease, and let the lease lapse."""
    rd.store.park(call_id, ENVELOPE, {}, countdown_ms=0)
    claim_one(rd, LONG_MS)
    rd.store.confirm([call_id], LONG_MS)
    assert rd.store.track([(op, call_id)], LONG_MS, SHORT_MS, "w1@host") == []


def test_a_start_once_run_that_loses_its_lease_is_dead_lettered_saying_why(rd: RedisDelay, client: redis.Redis) -> None:
    before = redis_ms(client)
    start_and_lose(rd, "charge", "start-once")
    sweep_until(rd, (0, 1))
    dead = entry(rd, "charge")
    assert (dead.state, dead.meta["s"], dead.envelope) == ("dead", "dead", ENVELOPE)
    why = dead.meta["why"]
    prefix = "worker lost: the run of delivery 1 that started on w1@host at "
    assert why.startswith(prefix), why
    started = datetime.strptime(why[len(prefix) :].split(" ")[0], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert before <= started.timestamp() * 1000 <= redis_ms(client), "the start's time, by the server's clock"
    assert int(client.hget(rd.keys.counters, "worker_lost") or 0) == 1
    assert rd.requeue("charge") and entry(rd, "charge").meta.get("c") is None, "a requeued call starts afresh"


def test_a_run_started_the_usual_way_that_loses_its_lease_runs_again(rd: RedisDelay) -> None:
    start_and_lose(rd, "idempotent", "start")
    sweep_until(rd, (1, 0))
    assert entry(rd, "idempotent").meta["s"] == "swept"


def test_an_ack_after_the_dead_letter_takes_it_back(rd: RedisDelay, client: redis.Redis) -> None:
    """A worker that lost Redis for longer than its lease ends the run after all: the call is done, no dead letter."""
    start_and_lose(rd, "slow", "start-once")
    sweep_until(rd, (0, 1))
    assert rd.store.track([("acked", "slow")], LONG_MS) == []
    assert rd.find("slow") is None and rd.dead_letters() == []
    assert int(client.hget(rd.keys.counters, "acked") or 0) == 1


@pytest.mark.parametrize(
    "ms",
    [0, 951_782_400_000, 951_868_799_999, 1_709_210_096_789, 4_102_444_800_000, 253_402_300_799_999],
    ids=["epoch", "2000-02-29", "2000-02-29-end", "2024-02-29", "2100-01-01", "9999-12-31"],
)
def test_the_scripts_clock_text_is_pythons(rd: RedisDelay, ms: int) -> None:
    """The UTC text the scripts write (clock.lua's utc_text) is Python's isoformat of the same instant."""
    script = compose("-- requires: clock\nreturn utc_text(tonumber(ARGV[1]))")
    keys = rd.store.keys.store_keys
    text = rd.client.eval(script, len(keys), *keys, ms).decode()
    instant = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)  # exact, where a float is not
    expected = instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert text == expected


@pytest.mark.parametrize("value", ["dead-letter", "DEAD_LETTER", True, 1])
def test_an_unknown_choice_is_refused_naming_the_allowed_values(make_app: MakeApp, value: object) -> None:
    with pytest.raises(ConfigurationError, match="'dead_letter' or 'run_again'"):
        make_app(redisdelay_worker_lost=value)


@pytest.mark.parametrize(
    ("options", "setting", "expected"),
    [
        ({}, None, DEAD_LETTER),
        ({"acks_late": True}, None, RUN_AGAIN),
        ({}, RUN_AGAIN, RUN_AGAIN),
        ({"acks_late": True}, DEAD_LETTER, DEAD_LETTER),
        ({"redisdelay_worker_lost": RUN_AGAIN}, DEAD_LETTER, RUN_AGAIN),
        ({"redisdelay_worker_lost": DEAD_LETTER, "acks_late": True}, None, DEAD_LETTER),
    ],
)
def test_each_task_has_one_contract(
    make_app: MakeApp, options: dict[str, Any], setting: str | None, expected: str
) -> None:
    app, rd = make_app(redisdelay_all_tasks=True, redisdelay_worker_lost=setting)

    @app.task(name=f"contract.{uuid.uuid4().hex}", shared=False, **options)
    def plain() -> None: ...

    @rd.delayed(name=f"contract.{uuid.uuid4().hex}", **options)
    def delayed() -> None: ...

    assert worker_lost(plain, rd.settings.worker_lost) == expected
    delayed_default = RUN_AGAIN if setting is None and "redisdelay_worker_lost" not in options else expected
    assert worker_lost(delayed, rd.settings.worker_lost) == delayed_default, "a delayed task runs at least once"


def test_a_tasks_unknown_choice_stops_the_worker_naming_the_task(make_app: MakeApp) -> None:
    app, rd = make_app(redisdelay_all_tasks=True)

    @app.task(name="contract.misspelt", shared=False, redisdelay_worker_lost="never")
    def misspelt() -> None: ...

    with pytest.raises(ConfigurationError, match=r"redisdelay_worker_lost of the task 'contract\.misspelt' must be"):
        check_tasks([misspelt], rd.settings.worker_lost)
