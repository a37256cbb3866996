"""``redisdelay_skip_unacked`` (on by default where the broker is the store's Redis) on real workers
(:mod:`celery_redisdelay.worker.unacked`): kombu's unacked hash holds none of the store's deliveries while
Celery's own messages keep kombu's bookkeeping, and with the setting False it holds both; a call rejected with
requeue runs again at once; the calls a worker held unstarted when it stops warmly run at once on another
worker; a killed worker's calls run again once their leases run out. The lease is the default (30 s) where "at
once" is checked: no lease ran out in the wait, so only the worker's putting back can have brought the call.
A rejected call is put back under every pool; the calls a worker holds unstarted, under the pools that hold
calls while they run one."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from celery_redisdelay.testing import RedisServer, wait_for
from tests.pool_run import PoolRun, pool_worker

pytestmark = pytest.mark.e2e

CONF: dict[str, Any] = {"redisdelay_precise_release": True}  # redisdelay_skip_unacked: its default
#: Celery's pools whose worker fetches and holds calls while it runs one (gevent's and eventlet's block the
#: consumer while every green thread is busy: they hold none).
HOLDING_POOLS = ["prefork", "threads"]
#: Well inside the default 30 s lease (plus its 10 s renewal), which the sweep would wait for.
AT_ONCE = 20.0
UNACKED = "unacked"  # kombu's unacked hash (its default name; the tests set no prefix), shared by the tests


def noted_ids(broker: redis.Redis) -> set[str]:
    """The task ids of the messages in kombu's unacked hash."""
    return {json.loads(raw)[0]["headers"]["id"] for raw in broker.hvals(UNACKED)}


def holder(run: PoolRun, call_id: str) -> str:
    found = run.rd.find(call_id)
    return "" if found is None else str(found.meta.get("h") or "")


def where(run: PoolRun, call_id: str) -> tuple[str, dict[str, Any]] | None:
    """A call's state and metadata, for a failure's message."""
    found = run.rd.find(call_id)
    return None if found is None else (found.state, dict(found.meta))


def starts(run: PoolRun, key: str) -> dict[str, list[str]]:
    """Each call's runs, by the name of the worker that started them."""
    found: dict[str, list[str]] = {}
    for note in run.notes(key):
        if note.get("at") == "start":
            found.setdefault(note["id"], []).append(note["worker"].split("@")[0])
    return found


@pytest.mark.parametrize("skip", [None, False], ids=["default", "off"])
def test_kombu_keeps_no_copy_of_the_stores_deliveries(redis_server: RedisServer, skip: bool | None) -> None:
    conf = {**CONF, **({} if skip is None else {"redisdelay_skip_unacked": skip})}
    with pool_worker(redis_server, "prefork", concurrency=1, worker_prefetch_multiplier=20, **conf) as run:
        key = f"{run.prefix}:runs"
        broker = redis.Redis.from_url(run.conf["broker_url"])
        sleep = run.task("pools.sleep")
        long = sleep.apply_async((key, 20.0))  # the worker holds the others meanwhile, on a busy machine too
        wait_for(lambda: long.id in starts(run, key), 30, "the long call to start")
        quick = [sleep.apply_async((key, 0.0)).id for _ in range(5)]
        plain = run.task("plain.record").apply_async((key,))  # published by kombu, due now: not the store's
        wait_for(lambda: broker.llen(run.conf["task_default_queue"]) == 0, 30, "the worker to fetch every message")
        wait_for(lambda: all(holder(run, i) for i in [long.id, *quick]), 30, "the worker to hold the store's calls")
        wait_for(lambda: plain.id in noted_ids(broker), 30, "kombu to note its own message")
        if skip is None:
            assert not noted_ids(broker) & {long.id, *quick}, "kombu keeps no copy of the store's deliveries"
        else:
            assert set(quick) <= noted_ids(broker), "with the setting False, kombu notes those it holds"
        wait_for(run.settled, 60, "every call of the store to finish")
        ran = starts(run, key)
        assert all(len(ran[i]) == 1 for i in [long.id, *quick]), ran
        wait_for(lambda: plain.id not in noted_ids(broker), 30, "kombu's own message to be acknowledged")
        broker.close()


@pytest.mark.parametrize("pool", [*HOLDING_POOLS, "gevent", "eventlet", "solo"])
def test_a_call_rejected_with_requeue_runs_again_at_once(redis_server: RedisServer, pool: str) -> None:
    with pool_worker(redis_server, pool, concurrency=1, **CONF) as run:
        key = f"{run.prefix}:runs"
        call = run.task("pools.reject_once").apply_async((key,))
        wait_for(lambda: run.notes(key), AT_ONCE, "the rejected call to run again before its lease could run out")
        [note] = run.notes(key)
        assert (note["id"], note["runs"], note["delivery"]) == (call.id, 2, 2)
        wait_for(run.settled, 30, "the call to be acknowledged")


def running_one_holding_ten(run: PoolRun, key: str, seconds: float) -> tuple[str, list[str]]:
    """A call of ``seconds`` running on the run's first worker (concurrency 1) and ten quick calls it fetched
    and holds meanwhile: their ids."""
    broker = redis.Redis.from_url(run.conf["broker_url"])
    sleep = run.task("pools.sleep")
    long = sleep.apply_async((key, seconds))
    wait_for(lambda: long.id in starts(run, key), 30, "the long call to start")
    quick = [sleep.apply_async((key, 0.0)).id for _ in range(10)]
    wait_for(lambda: broker.llen(run.conf["task_default_queue"]) == 0, 30, "the worker to fetch them all")
    wait_for(lambda: all(holder(run, i).startswith("first@") for i in quick), 30, "the worker to hold them")
    broker.close()
    return long.id, quick


@pytest.mark.parametrize("pool", HOLDING_POOLS)
def test_a_warm_stop_puts_back_the_calls_not_started_and_another_worker_runs_them(
    redis_server: RedisServer, pool: str
) -> None:
    with pool_worker(
        redis_server, pool, concurrency=1, hostname="first@%h", worker_prefetch_multiplier=20, **CONF
    ) as run:
        key = f"{run.prefix}:runs"
        long, quick = running_one_holding_ten(run, key, 3.0)
        run.worker.stop()  # warm: the long call ends, the others are put back
        run.worker = run.new_worker("second@%h").start()
        wait_for(lambda: "ready." in run.worker.output(), 60, "the second worker to be ready")
        try:
            wait_for(lambda: all(i in starts(run, key) for i in quick), AT_ONCE, "the calls put back to run")
        except TimeoutError:
            missing = {i: where(run, i) for i in quick if i not in starts(run, key)}
            raise AssertionError(f"not run again: {missing}; runs: {starts(run, key)}") from None
        ran = starts(run, key)
        assert ran[long] == ["first"], ran
        if pool == "prefork":
            assert all(ran[i] == ["second"] for i in quick), ran
        else:  # Celery 5.3's threads pool runs the calls it had queued before it stops; later ones do not
            assert all(len(ran[i]) == 1 for i in quick), ran
        wait_for(run.settled, 30, "every call to be acknowledged")


def test_a_killed_workers_calls_run_again_once_their_leases_run_out(redis_server: RedisServer) -> None:
    short: dict[str, Any] = {"redisdelay_lease": 3.0, "redisdelay_lease_renewal": 0.5}
    with pool_worker(
        redis_server, "prefork", concurrency=1, hostname="first@%h", worker_prefetch_multiplier=20, **CONF, **short
    ) as run:
        key = f"{run.prefix}:runs"
        long, quick = running_one_holding_ten(run, key, 600.0)
        first = run.worker
        first.kill()
        run.marks.set(f"{key}:sleep", 0)  # the long call, run again, ends at once
        run.worker = run.new_worker("second@%h").start()
        wait_for(lambda: "ready." in run.worker.output(), 60, "the second worker to be ready")
        every = [long, *quick]
        wait_for(lambda: all("second" in starts(run, key).get(i, []) for i in every), 60, "every call to run again")
        ran = starts(run, key)
        assert ran[long] == ["first", "second"], "the run cut short runs again"
        assert all(ran[i] == ["second"] for i in quick), ran
        wait_for(run.settled, 30, "every call to be acknowledged")
        first.remove_files()


@pytest.mark.parametrize("skip", [None, True], ids=["default", "insisted"])
def test_a_store_apart_from_the_broker_keeps_kombus_bookkeeping(redis_server: RedisServer, skip: bool | None) -> None:
    """Where the store is not the broker's Redis, the sweep cannot find a call in the broker's lists, so kombu
    keeps its bookkeeping: silently by default, with a warning where the setting insists."""
    conf = {**CONF, "redisdelay_url": f"{redis_server.url}/6"}
    if skip is not None:
        conf["redisdelay_skip_unacked"] = skip
    with pool_worker(redis_server, "prefork", concurrency=1, **conf) as run:
        assert not run.rd.fast_release
        key = f"{run.prefix}:runs"
        call = run.task("pools.record").apply_async((key, "apart"), countdown=0.2)
        wait_for(lambda: run.notes(key), 30, "the call to run")
        assert [note["id"] for note in run.notes(key)] == [call.id]
        warned = "redisdelay_skip_unacked is True, but the broker" in run.worker.output()
        assert warned is bool(skip), run.output()
