"""Leases against a real redis-server: a worker holds the calls it received, renews them in one script, gives
back the ones it did not start; the sweep takes back a call whose lease ran out, with kombu's copy of its
delivery; the task's own timeout stays a hard end that only ``touch()`` moves. The settings are checked at
start-up. (The worker's side, on real workers under each pool: ``tests/test_lease_workers.py``.)"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redisdelay import ConfigurationError, RedisDelay
from celery_redisdelay.errors import StoreUnavailableError
from celery_redisdelay.store.calls import Entry
from celery_redisdelay.testing import wait_for
from celery_redisdelay.worker.leases import Leases
from tests.test_release import echo_task
from tests.test_store import entry, redis_ms

ENVELOPE = b'{"opaque": "to the store"}'
LONG_MS = 600_000
LEASE_MS = 30_000
WAIT = 5.0
MakeApp = Callable[..., tuple[Celery, RedisDelay]]


def in_flight(rd: RedisDelay, call_id: str, meta: dict[str, Any] | None = None) -> Entry:
    """A call released to the broker and waiting there, with a long queue deadline."""
    rd.store.park(call_id, ENVELOPE, {"r": LONG_MS, "q": LONG_MS, "m": 5, **(meta or {})}, countdown_ms=0)  # type: ignore[typeddict-item]
    assert [claimed.id for claimed in rd.store.claim(10, LONG_MS)] == [call_id]
    assert rd.store.confirm([call_id], LONG_MS) == 1
    return entry(rd, call_id)


def workers(rd: RedisDelay, client: redis.Redis) -> dict[str, dict[str, int]]:
    return {key.decode(): json.loads(value) for key, value in client.hgetall(rd.keys.workers).items()}


def test_a_held_call_is_due_at_the_end_of_its_lease_and_renewed(rd: RedisDelay, client: redis.Redis) -> None:
    queued = in_flight(rd, "held")
    before = redis_ms(client)
    assert rd.store.lease("w1", LEASE_MS, [("held", "tag-1")], 1) == []
    held = entry(rd, "held")
    assert before + LEASE_MS <= held.score_ms <= redis_ms(client) + LEASE_MS < queued.score_ms
    assert (held.meta["h"], held.meta["g"], held.meta["s"]) == ("w1", "tag-1", "queued")
    assert workers(rd, client)["w1"]["n"] == 1

    assert rd.store.touch("held", LONG_MS)  # a task's heartbeat: a renewal keeps the later deadline
    touched = entry(rd, "held").score_ms
    assert rd.store.lease("w1", LEASE_MS, [("held", "tag-1")], 1) == []
    assert entry(rd, "held").score_ms == touched

    client.zadd(rd.keys.inflight, {"held": before})  # the lease as it stands after a pause of the worker
    assert rd.store.lease("w1", LEASE_MS, [("held", "tag-1")], 1) == []
    assert entry(rd, "held").score_ms >= before + LEASE_MS


def test_another_workers_call_and_unknown_ones_are_not_held(rd: RedisDelay, client: redis.Redis) -> None:
    in_flight(rd, "theirs")
    assert rd.store.lease("w1", LEASE_MS, [("theirs", "")], 1) == []
    deadline = entry(rd, "theirs").score_ms
    assert rd.store.lease("w2", LEASE_MS, [("theirs", ""), ("never-parked", "")], 2) == ["theirs", "never-parked"]
    assert entry(rd, "theirs").meta["h"] == "w1" and entry(rd, "theirs").score_ms == deadline
    rd.store.park("waiting", ENVELOPE, {}, countdown_ms=LONG_MS)
    assert rd.store.lease("w2", LEASE_MS, [("waiting", "")], 1) == ["waiting"], "a parked call is no one's"
    assert "h" not in entry(rd, "waiting").meta


def test_a_lapsed_lease_is_swept_with_kombus_copy_of_the_delivery(rd: RedisDelay, client: redis.Redis) -> None:
    in_flight(rd, "orphan")
    unacked, index = f"{rd.keys.prefix}-unacked", f"{rd.keys.prefix}-unacked_index"
    client.hset(unacked, "tag-9", "kombu's copy")
    client.zadd(index, {"tag-9": 1.0})
    client.hset(unacked, "someone-else", "kept")
    assert rd.store.lease("dead-worker", 1, [("orphan", "tag-9")], 1) == []
    wait_for(lambda: rd.store.sweep(100, 5, (unacked, index)) == (1, 0), WAIT, "the lapsed lease to be swept")

    swept = entry(rd, "orphan")
    assert swept.state == "delayed" and swept.meta["s"] == "swept"
    assert not {"h", "g", "x"} & set(swept.meta), "any worker may take it now"
    assert client.hkeys(unacked) == [b"someone-else"] and client.zcard(index) == 0
    assert rd.store.lease("dead-worker", LEASE_MS, [("orphan", "tag-9")], 1) == ["orphan"]


def test_a_call_delivered_again_is_not_taken_back_by_the_worker_of_its_earlier_delivery(
    rd: RedisDelay, client: redis.Redis
) -> None:
    """A worker renews a call for a while after it received it, even once its run ended (an ``Abandon``). Should
    the sweep deliver the call again meanwhile, that renewal must not take it: the new delivery would find it
    held by another worker under a live lease and be dropped as stale, and the call wait out the lease (the
    chaos run's message 1708, once)."""
    unacked, index = f"{rd.keys.prefix}-unacked", f"{rd.keys.prefix}-unacked_index"
    in_flight(rd, "again")
    assert entry(rd, "again").meta["d"] == 1
    assert rd.store.lease("w1", 1, [("again", "again.1")], 1) == []  # its lease runs out at once
    wait_for(lambda: rd.store.sweep(100, 5, (unacked, index)) == (1, 0), WAIT, "the lapsed lease to be swept")
    assert [claimed.id for claimed in rd.store.claim(10, LONG_MS)] == ["again"]
    assert rd.store.confirm(["again"], LONG_MS) == 1
    assert entry(rd, "again").meta["d"] == 2 and "h" not in entry(rd, "again").meta

    assert rd.store.lease("w1", LEASE_MS, [("again", "again.1")], 1) == ["again"]
    assert "h" not in entry(rd, "again").meta
    assert rd.store.current("again", 2, "w2"), "the new delivery runs wherever it goes"
    assert rd.store.lease("w2", LEASE_MS, [("again", "again.2")], 1) == []
    assert entry(rd, "again").meta["h"] == "w2"
    assert rd.store.lease("w3", LEASE_MS, [("again", "kombus-own-tag")], 1) == ["again"], "held by w2"


def test_start_takes_the_lease_and_the_tasks_own_timeout_is_a_hard_end(rd: RedisDelay, client: redis.Redis) -> None:
    in_flight(rd, "plain")
    before = redis_ms(client)
    assert rd.store.start("plain", LONG_MS, LEASE_MS, "w1") == 1
    started = entry(rd, "plain")
    assert started.meta["h"] == "w1" and "x" not in started.meta
    assert started.score_ms <= redis_ms(client) + LEASE_MS, "the lease, not the run timeout"

    in_flight(rd, "own", {"r": 2_000, "o": 1})
    assert rd.store.start("own", LONG_MS, LEASE_MS, "w1") == 1
    own = entry(rd, "own")
    assert before + 2_000 <= own.meta["x"] == own.score_ms <= redis_ms(client) + 2_000
    assert rd.store.lease("w1", LEASE_MS, [("own", "")], 1) == []
    assert entry(rd, "own").score_ms == own.meta["x"], "no renewal passes the task's own timeout"
    assert rd.store.touch("own", LONG_MS)
    touched = entry(rd, "own")
    assert touched.meta["x"] == touched.score_ms >= before + LONG_MS, "touch() moves the hard end"

    in_flight(rd, "someone-elses")
    rd.store.lease("w2", LEASE_MS, [("someone-elses", "")], 1)
    deadline = entry(rd, "someone-elses").score_ms
    assert rd.store.start("someone-elses", LONG_MS, LEASE_MS, "w1") == 1
    assert (entry(rd, "someone-elses").meta["h"], entry(rd, "someone-elses").score_ms) == ("w2", deadline)


def test_unstarted_calls_are_given_back_and_running_ones_kept(rd: RedisDelay, client: redis.Redis) -> None:
    in_flight(rd, "waiting")
    in_flight(rd, "running")
    rd.store.lease("w1", LEASE_MS, [("waiting", "t1"), ("running", "t2")], 2)
    rd.store.start("running", LONG_MS, LEASE_MS, "w1")
    before = redis_ms(client)
    assert rd.store.give_back("w1", LEASE_MS, [("waiting", "t1"), ("running", "t2")]) == ["running"]
    given = entry(rd, "waiting")
    assert given.meta["s"] == "queued" and not {"h", "g"} & set(given.meta)
    assert given.score_ms >= before + LONG_MS, "it waits in the broker again, with its queue timeout"
    assert entry(rd, "running").meta["h"] == "w1"
    assert "w1" not in workers(rd, client)


def test_calls_put_back_go_to_the_delay_set_due_now(rd: RedisDelay, client: redis.Redis) -> None:
    """``redisdelay_skip_unacked``: kombu keeps no copy of the store's deliveries, so a worker puts back a call it
    gives up (a warm stop, a reject with requeue) itself, started or not, held by it or not held yet."""
    for call_id in ("waiting", "running", "unheld", "elsewhere", "again"):
        in_flight(rd, call_id)
    rd.store.lease("w1", LEASE_MS, [("waiting", "waiting.1"), ("running", "running.1")], 2)
    rd.store.start("running", LONG_MS, LEASE_MS, "w1")
    rd.store.lease("w2", LEASE_MS, [("elsewhere", "elsewhere.1")], 1)
    assert entry(rd, "again").meta["d"] == 1
    before = redis_ms(client)
    assert rd.store.put_back(
        "w1",
        [("waiting", "waiting.1"), ("running", "running.1"), ("unheld", "unheld.1"), ("elsewhere", "elsewhere.1")],
    ) == ["elsewhere"]
    for call_id in ("waiting", "running", "unheld"):
        back = entry(rd, call_id)
        assert back.state == "delayed" and back.meta["s"] == "swept" and not {"h", "g"} & set(back.meta)
        assert before <= back.score_ms <= redis_ms(client), "due now"
    assert entry(rd, "elsewhere").meta["h"] == "w2", "another worker's call stays with it"
    assert rd.store.put_back("w1", [("again", "again.0")]) == ["again"], "an earlier delivery than the current one"
    assert set(workers(rd, client)) == {"w1", "w2"}, "a putting back leaves the workers hash as it is"
    released = {call.id for call in rd.store.claim(10, LONG_MS)}
    assert released == {"waiting", "running", "unheld"}, "the next release delivers them again"


def test_a_late_start_of_a_rejected_delivery_is_stale_but_not_one_of_a_call_put_back_at_close(
    rd: RedisDelay, client: redis.Redis
) -> None:
    """A pool process writes its starts in batches, so a run's start may reach Redis after its worker put the
    call back. After a reject with requeue that run is over: the call stays due, for its next delivery. After
    a channel's close the worker may not have heard yet that a pool process started the call: the start takes
    it back, as after the sweep, so that it does not run twice."""
    for call_id in ("rejected", "closed"):
        in_flight(rd, call_id)
    rd.store.lease("w1", LEASE_MS, [("rejected", "rejected.1"), ("closed", "closed.1")], 2)
    assert rd.store.put_back("w1", [("rejected", "rejected.1")], rejected=True) == []
    assert rd.store.put_back("w1", [("closed", "closed.1")]) == []
    assert rd.store.start("rejected", LONG_MS, LEASE_MS, "w1") == 0, "the rejected run's start is stale"
    stayed = entry(rd, "rejected")
    assert (stayed.state, stayed.meta["s"], stayed.meta["rj"]) == ("delayed", "swept", 1)
    assert rd.store.start("closed", LONG_MS, LEASE_MS, "w1") == 2, "a start at close takes the call back"
    assert (entry(rd, "closed").state, entry(rd, "closed").meta["s"]) == ("inflight", "running")

    [again] = rd.store.claim(10, LONG_MS)  # the next delivery of the rejected call: its start is not stale
    assert again.id == "rejected" and entry(rd, "rejected").meta["d"] == 2
    assert rd.store.start("rejected", LONG_MS, LEASE_MS, "w2") == 1
    started = entry(rd, "rejected")
    assert started.meta["s"] == "running" and "rj" not in started.meta


def test_the_workers_hash_forgets_idle_and_silent_workers(rd: RedisDelay, client: redis.Redis) -> None:
    in_flight(rd, "a")
    rd.store.lease("w1", LEASE_MS, [("a", "")], 1)
    client.hset(rd.keys.workers, mapping={"gone": json.dumps({"n": 3, "at": 1}), "garbage": "{not json"})
    rd.store.lease("w2", LEASE_MS, [("", "")], 0)
    assert set(workers(rd, client)) == {"w1"}
    found = workers(rd, client)["w1"]
    assert found["n"] == 1 and abs(found["at"] - redis_ms(client)) < 5_000
    rd.store.lease("w1", LEASE_MS, [("", "")], 0)
    assert client.exists(rd.keys.workers) == 0


def test_bad_metadata_does_not_stop_a_renewal(rd: RedisDelay, client: redis.Redis) -> None:
    in_flight(rd, "good")
    in_flight(rd, "bad")
    client.hset(rd.keys.meta, "bad", "{not json")
    assert rd.store.lease("w1", LEASE_MS, [("bad", ""), ("good", "")], 2) == []
    assert entry(rd, "good").meta["h"] == "w1" and entry(rd, "bad").meta["h"] == "w1"


# -- the worker's side, without a worker: the batches ---------------------------------------------------------


def test_a_worker_takes_its_calls_in_batches_and_renews_them_all_at_once(
    rd: RedisDelay, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery.worker import state

    ids = [f"batch-{n}" for n in range(5)]
    for call_id in ids:
        in_flight(rd, call_id)
    scripts: list[int] = []
    original = rd.store.lease
    monkeypatch.setattr(rd.store, "lease", lambda *a, **k: scripts.append(len(a[2])) or original(*a, **k))
    leases = Leases(rd.depot, "w1")
    for call_id in ids:  # received before the thread looks: one batch, whatever the machine's load
        leases.received(call_id, f"tag-{call_id}")
    thread = threading.Thread(target=leases.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: all(entry(rd, i).meta.get("h") == "w1" for i in ids), WAIT, "the calls to be held")
        assert scripts == [5], "five calls received together are taken in one script"

        monkeypatch.setattr(state, "requests", {call_id: object() for call_id in ids[:3]})
        for held in leases.held.values():
            held.received -= 3600  # received long ago: held only while Celery knows the request
        scripts.clear()
        leases.renew()
        assert scripts == [3] and set(leases.held) == set(ids[:3])
        assert workers(rd, client)["w1"]["n"] == 3
    finally:
        leases.stop()
        thread.join(WAIT)
    assert not thread.is_alive()


def test_an_outage_is_logged_once_and_the_leases_renewed_after_it(
    rd: RedisDelay, client: redis.Redis, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_redisdelay import StoreUnavailableError

    in_flight(rd, "kept")
    leases = Leases(rd.depot, "w1")
    leases.received("kept", "")
    original = rd.store.lease

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailableError("celery-redisdelay could not renew: Redis is unreachable")

    monkeypatch.setattr(rd.store, "lease", unreachable)
    with caplog.at_level(logging.WARNING, logger="celery_redisdelay.worker.leases"):
        for _ in range(3):
            leases.renew()
        monkeypatch.setattr(rd.store, "lease", original)
        leases.renew()
    messages = [record.getMessage() for record in caplog.records]
    assert sum("could not renew" in message for message in messages) == 1, messages
    assert sum("answers again" in message for message in messages) == 1, messages
    assert entry(rd, "kept").meta["h"] == "w1"


def test_a_stuck_event_loop_stops_renewing_the_calls_it_has_not_started(
    rd: RedisDelay, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker's lease thread renews on its own: for a consumer whose event loop no longer turns, it would hold
    # the calls that loop will never start for as long as the worker lives. After a whole lease without a turn,
    # the renewals keep only the running calls; a run in the loop's own thread (the solo pool's) is no stall.
    from celery.worker import state

    now = [1000.0]
    leases = Leases(rd.depot, "w1", clock=lambda: now[0])
    for call_id in ("running", "waiting"):
        in_flight(rd, call_id)
        leases.received(call_id, f"tag-{call_id}")
    leases.take_new()  # as the thread does, at once
    monkeypatch.setattr(state, "requests", {"running": object(), "waiting": object()})
    monkeypatch.setattr(state, "active_requests", [SimpleNamespace(id="running")])
    renewed: list[list[str]] = []
    original = rd.store.lease
    monkeypatch.setattr(
        rd.store, "lease", lambda *a, **k: renewed.append([call for call, _ in a[2] if call]) or original(*a, **k)
    )
    lease = rd.settings.lease

    def renew() -> list[str]:
        renewed.clear()
        leases.renew()
        return sorted(call for script in renewed for call in script)

    assert renew() == ["running", "waiting"], "a loop never seen turning is not watched"
    leases.loop_turns()
    now[0] += lease - 1
    assert renew() == ["running", "waiting"], "less than a lease without a turn"
    with caplog.at_level(logging.WARNING, logger="celery_redisdelay.worker.leases"):
        now[0] += 2
        assert renew() == ["running"], "a lease without a turn: the call not started is left to lapse"
        assert renew() == ["running"]
        leases.run_in_loop(True)  # a solo pool's run holds the loop's thread: not a stall
        now[0] += 5 * lease
        assert renew() == ["running", "waiting"]
        leases.run_in_loop(False)
        now[0] += lease + 1
        assert renew() == ["running"]
        other = threading.Thread(target=leases.run_in_loop, args=(True,))  # a run in another thread holds nothing
        other.start()
        other.join(WAIT)
        assert renew() == ["running"]
        leases.loop_turns()
        assert renew() == ["running", "waiting"]
    messages = [record.getMessage() for record in caplog.records]
    assert sum("has not turned for" in message and "1 call(s)" in message for message in messages) == 2, messages
    assert sum("turns again" in message for message in messages) == 2, messages


# -- settings ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("conf", "named"),
    [
        ({"redisdelay_lease": 10, "redisdelay_lease_renewal": 10}, "redisdelay_lease (10 s)"),
        ({"redisdelay_lease": 5}, "redisdelay_lease (5 s) must be longer than redisdelay_lease_renewal (10 s)"),
        ({"redisdelay_lease_renewal": 0}, "redisdelay_lease_renewal must be a positive number"),
        ({"redisdelay_lease": "30s"}, "redisdelay_lease must be a positive number of seconds, not '30s'"),
        ({"redisdelay_lease_renewal": float("nan")}, "redisdelay_lease_renewal must be a positive number"),
    ],
)
def test_bad_lease_settings_are_refused_naming_the_setting(make_app: MakeApp, conf: dict[str, Any], named: str) -> None:
    _, rd = make_app(**conf)
    with pytest.raises(ConfigurationError, match=re.escape(named)):
        _ = rd.settings  # read at start-up: by a worker's lease step, by beat, by the first call


def test_the_lease_settings_default_to_30_and_10_seconds(rd: RedisDelay) -> None:
    assert (rd.settings.lease, rd.settings.lease_renewal) == (30.0, 10.0)


# -- who holds what: status, list, show, metrics, the dashboard ---------------------------------------------


def test_every_view_says_which_worker_holds_a_call(rd: RedisDelay, client: redis.Redis) -> None:
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from celery_redisdelay.operations.metrics import RedisDelayCollector
    from celery_redisdelay.web import create_app
    from tests.test_cli import as_json, ok

    for call_id in ("a", "b", "c"):
        in_flight(rd, call_id)
    rd.store.lease("w1@host", LEASE_MS, [("a", ""), ("b", "")], 2)
    rd.store.lease("w2@host", LEASE_MS, [("c", "")], 1)

    workers_seen = as_json(rd, "status")["workers"]
    assert {name: row["leases"] for name, row in workers_seen.items()} == {"w1@host": 2, "w2@host": 1}
    assert all(0 <= row["renewed_seconds_ago"] < 60 for row in workers_seen.values())
    assert re.search(r"\n  w1@host +2 calls, renewed ", ok(rd, "status").stdout)
    listed = ok(rd, "list", "--state", "inflight").stdout
    assert "WORKER" in listed and listed.count("w1@host") == 2 and listed.count("w2@host") == 1
    assert as_json(rd, "show", "c")["worker"] == "w2@host"
    assert "held by" in ok(rd, "show", "c").stdout

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RedisDelayCollector(rd))
    scraped = generate_latest(registry).decode()
    assert 'redisdelay_worker_leases{worker="w1@host"} 2.0' in scraped
    assert 'redisdelay_worker_lease_renewed_timestamp_seconds{worker="w2@host"}' in scraped

    web = create_app(rd).test_client()
    overview = web.get("/").get_data(as_text=True)
    assert "w1@host" in overview and "w2@host" in overview
    assert "w1@host" in web.get("/calls/inflight").get_data(as_text=True)
    assert "w2@host" in web.get("/call/c").get_data(as_text=True)


#: A worker's consumer in a process of its own: it pops one message of the queue as kombu does (the delivery
#: noted in kombu's unacked hash and index), says its delivery tag, and waits to be killed.
POPPER = """
import sys
from kombu import Connection, Consumer, Queue
with Connection(sys.argv[1]) as connection:
    got = []
    with Consumer(connection, [Queue(sys.argv[2])], callbacks=[lambda body, message: got.append(message)]):
        while not got:
            connection.drain_events(timeout=10)
        print(got[0].delivery_tag, flush=True)
        sys.stdin.read()
"""


def popped_by_a_dying_worker(app: Celery) -> str:
    """The delivery tag of the message a worker's consumer popped (kombu noted it) before it was killed."""
    command = [sys.executable, "-c", POPPER, app.conf.broker_url, app.conf.task_default_queue]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as popper:
        try:
            assert popper.stdout is not None
            return popper.stdout.readline().strip()
        finally:
            popper.kill()  # it dies before any lease thread could hold the call
            popper.wait(10)


def short_leases(make_app: MakeApp) -> tuple[Celery, RedisDelay]:
    """An app whose calls are released by the release script itself, under a one-second lease."""
    app, rd = make_app(redisdelay_lease=1.0, redisdelay_lease_renewal=0.2)
    assert rd.depot.fast_release
    return app, rd


def test_a_call_popped_by_a_worker_that_died_before_holding_it_is_swept_a_lease_later(
    make_app: MakeApp, client: redis.Redis
) -> None:
    app, rd = short_leases(make_app)
    echo = echo_task(rd)
    popped, waiting = echo.apply_async(("popped",)), echo.apply_async(("waiting",))
    assert rd.tick()["released"] == 2
    tag = popped_by_a_dying_worker(app)
    first = popped.id if tag.startswith(popped.id) else waiting.id
    left = waiting.id if first == popped.id else popped.id
    assert tag == f"{first}.1" and client.hexists("unacked", tag), "kombu noted the delivery"

    swept = rd.tick()
    assert swept["requeued"] == 0, "popped less than a lease ago: its worker may still hold it"
    wait_for(lambda: rd.tick()["requeued"] == 1, WAIT, "the call popped by the dead worker to be swept")
    again = entry(rd, first)
    assert (again.state, again.meta["s"]) in {("delayed", "swept"), ("inflight", "queued")}
    assert not client.hexists("unacked", tag) and client.zscore("unacked_index", tag) is None, (
        "kombu does not restore it as well"
    )
    assert entry(rd, left).meta["s"] in {"delayed", "queued"} and "h" not in entry(rd, left).meta
    assert rd.tick()["requeued"] == 0, "the call still in the queue is not taken back"
    assert client.hget(rd.keys.history, "unacked_seen") is not None


def tick_until(rd: RedisDelay, done: Callable[[], bool], what: str) -> None:
    """Sweep and release (a tick) until ``done()`` holds after one."""

    def ticked() -> bool:
        rd.tick()
        return done()

    wait_for(ticked, WAIT, what)


def test_a_call_popped_by_a_worker_that_died_before_kombu_noted_it_is_swept_a_lease_later(
    make_app: MakeApp, client: redis.Redis
) -> None:
    app, rd = short_leases(make_app)
    queue = app.conf.task_default_queue
    echo = echo_task(rd)
    calls = {echo.apply_async((word,)).id: word for word in ("first", "second")}
    assert rd.tick()["released"] == 2

    def pop() -> str:
        """A worker pops the oldest message and dies before kombu notes it: it is in neither the list nor
        kombu's unacked hash (its BRPOP's reply died unread in its socket)."""
        popped = client.brpop([queue], timeout=5)
        assert popped is not None
        tag = str(json.loads(popped[1])["properties"]["delivery_tag"])
        assert not client.hexists("unacked", tag)
        return tag.rsplit(".", 1)[0]

    lost = pop()
    waiting = next(call_id for call_id in calls if call_id != lost)
    assert rd.tick()["requeued"] == 0, "pushed less than a lease ago: its worker may be about to note it"
    wait_for(lambda: rd.tick()["requeued"] == 1, WAIT, "the call lost with its worker to be swept")
    assert entry(rd, lost).meta["s"] in {"swept", "queued"}
    assert entry(rd, lost).meta.get("d") in {1, 2}, "delivered again, not dead-lettered"
    assert entry(rd, waiting).meta["s"] in {"delayed", "queued"}, "the call still in its list stays there"
    assert rd.tick()["requeued"] == 0, "the call still in its list is not taken back"

    # The call that waited in its list is looked at again, sweep after sweep: lost later, it comes back too.
    tick_until(rd, lambda: client.llen(queue) == 2, "the first call's second delivery")
    while True:  # the second call (delivery 1) is the oldest in the list: a worker pops it and dies
        popped = pop()
        if popped == waiting:
            break
    wait_for(lambda: rd.tick()["requeued"] >= 1 and entry(rd, waiting).meta.get("d", 0) >= 1, WAIT, "the second")
    assert entry(rd, waiting).meta["s"] in {"swept", "queued"} and entry(rd, waiting).meta.get("d") == 2


def test_a_call_a_live_worker_popped_after_a_lease_in_its_list_is_not_swept_before_its_take(
    make_app: MakeApp, client: redis.Redis
) -> None:
    """A backlog older than a lease: a worker pops a call that waited that long, and the sweep looks before the
    worker's take reaches Redis (a moment later; under load, or at its next renewal, later still). It must not take
    the call for lost: swept then, the call ran twice (once from the pop, once from the sweep's delivery)."""
    app, rd = short_leases(make_app)
    queue = app.conf.task_default_queue
    call = echo_task(rd).apply_async(("backlog",))
    assert rd.tick()["released"] == 1
    pushed = redis_ms(client)
    wait_for(lambda: redis_ms(client) > pushed + 1500, WAIT, "the call to wait in its list past its lease")
    assert rd.tick()["requeued"] == 0, "still in its list"
    popped = client.brpop([queue], timeout=5)  # a live worker pops it; its take is on the way
    assert popped is not None
    tag = str(json.loads(popped[1])["properties"]["delivery_tag"])
    assert rd.tick()["requeued"] == 0, "popped a moment ago: its worker's take may be on the way"
    assert rd.store.lease("w1", LONG_MS, [(call.id, tag)], -1) == [], "the take, late, holds it"
    missed = redis_ms(client)
    wait_for(lambda: redis_ms(client) > missed + 1500, WAIT, "a lease and a half to pass")
    assert rd.tick()["requeued"] == 0, "held: not swept"
    held = entry(rd, call.id)
    assert (held.meta["s"], held.meta["d"], held.meta["h"]) == ("queued", 1, "w1")


def test_a_call_popped_from_a_list_too_long_to_look_through_is_swept_by_the_oldest_message_left(
    make_app: MakeApp, client: redis.Redis
) -> None:
    """Over 1,000 messages queued (a fleet behind its queue), the sweep does not look through the list: it drains
    from its oldest end, so a call pushed before the oldest message still there was popped. A worker that died
    before noting it no longer leaves it to the queue timeout (two hours by default)."""
    app, rd = short_leases(make_app)
    queue = app.conf.task_default_queue
    echo = echo_task(rd)
    lost = echo.apply_async(("lost",)).id
    assert rd.tick()["released"] == 1
    pushed = redis_ms(client)
    wait_for(lambda: redis_ms(client) > pushed, WAIT, "the server's clock to move on")
    later = [echo.apply_async((n,)).id for n in range(1_001)]  # pushed after it, in one step or more
    tick_until(rd, lambda: client.llen(queue) == 1 + len(later), "every later call to be queued")
    popped = client.brpop([queue], timeout=5)  # a worker pops the oldest message and dies before noting it
    assert popped is not None and json.loads(popped[1])["properties"]["delivery_tag"] == f"{lost}.1"
    assert client.llen(queue) == len(later) > 1_000, "too long to look through"

    wait_for(lambda: rd.tick()["requeued"] == 1, WAIT, "the call popped by the dead worker to be swept")
    assert entry(rd, lost).meta.get("d") in {1, 2} and entry(rd, lost).meta["s"] in {"swept", "queued"}
    again = redis_ms(client)
    wait_for(lambda: redis_ms(client) > again + 1500, WAIT, "a lease and a half to pass")
    assert rd.tick()["requeued"] == 0, "the calls still in the list, pushed with the oldest or after, stay there"
    assert all(entry(rd, call_id).meta.get("d", 1) == 1 for call_id in later)


KOMBU_PUBLISHER = """
import sys
from kombu import Connection, Producer
with Connection(sys.argv[1]) as connection:
    Producer(connection).publish(b"{}", routing_key=sys.argv[2], headers={"lang": "py", "task": "t", "id": sys.argv[3]})
"""


def test_a_call_published_through_kombu_and_popped_by_a_worker_that_died_is_swept_by_its_task_id(
    make_app: MakeApp, client: redis.Redis
) -> None:
    """A flushed batch goes through kombu, which tags the delivery itself: the sweep finds the call by the task
    id in the headers of kombu's copy of the delivery."""
    app, rd = short_leases(make_app)
    in_flight(rd, "by-kombu")
    publish = [sys.executable, "-c", KOMBU_PUBLISHER, app.conf.broker_url, app.conf.task_default_queue, "by-kombu"]
    subprocess.run(publish, check=True)
    tag = popped_by_a_dying_worker(app)
    assert not tag.startswith("by-kombu") and client.hexists("unacked", tag), "kombu noted it under its own tag"

    def sweep() -> tuple[int, int]:  # a tick's sweep without its release (the envelope here is opaque)
        return rd.store.sweep(100, 5, ("unacked", "unacked_index"), 1000)

    wait_for(lambda: sweep() == (1, 0), WAIT, "the call popped by the dead worker to be swept")
    assert entry(rd, "by-kombu").meta["s"] == "swept"
    assert not client.hexists("unacked", tag), "kombu does not restore it as well"


def test_a_call_given_back_at_a_warm_shutdown_is_not_looked_for_in_its_list(
    make_app: MakeApp, client: redis.Redis
) -> None:
    """kombu puts a given-back message back in its own form (its JSON written again, marked redelivered), so
    the sweep cannot find it in the list by the bytes the release pushed: it must not take it for lost."""
    app, rd = short_leases(make_app)
    queue = app.conf.task_default_queue
    call = echo_task(rd).apply_async(("back",))
    assert rd.tick()["released"] == 1
    popped = client.brpop([queue], timeout=5)
    assert popped is not None
    message = json.loads(popped[1])
    tag = message["properties"]["delivery_tag"]
    assert rd.store.lease("w1", 1000, [(call.id, tag)], -1) == []  # the worker's take
    assert rd.store.give_back("w1", 1000, [(call.id, tag)]) == []
    message["headers"]["redelivered"] = message["properties"]["delivery_info"]["redelivered"] = True
    client.rpush(queue, json.dumps(message))  # kombu's restore of the message
    assert entry(rd, call.id).meta.get("b") == 1
    given_back = redis_ms(client)
    wait_for(lambda: redis_ms(client) > given_back + 1500, WAIT, "a lease and a half to pass")
    assert rd.tick()["requeued"] == 0 and entry(rd, call.id).meta["s"] == "queued"


def test_a_lease_belongs_to_one_attempt_of_a_retried_call(make_app: MakeApp) -> None:
    """A call retried with ``self.retry(countdown=0)`` is sent again under its id, tagged ``<id>.1`` like its first
    attempt. The worker that ran the first attempt renews the call for a while after the run ended; that renewal must
    not take the new attempt, or the worker that runs it would not hold it, and the sweep would deliver it again
    while it runs once the first worker forgets it."""
    from tests.test_adoption import plain_tasks

    app, rd = make_app(redisdelay_all_tasks=True, redisdelay_track_due_now=True)
    add = plain_tasks(app)["add"]
    call_id = add.delay(1, 2).id
    tag = f"{call_id}.1"
    assert rd.store.lease("w1", LEASE_MS, [(call_id, tag)], -1) == [], "the first attempt's worker takes it"
    assert rd.store.track([("start", call_id)], LONG_MS, LEASE_MS, "w1") == []
    add.apply_async((1, 2), task_id=call_id)  # the retry: the same id sent again, due now
    assert "h" not in entry(rd, call_id).meta

    assert rd.store.lease("w1", LEASE_MS, [(call_id, tag)], 1) == [call_id], "a renewal of the first attempt"
    assert "h" not in entry(rd, call_id).meta
    assert rd.store.lease("w2", LEASE_MS, [(call_id, tag)], -1) == [], "the worker that received the new attempt"
    assert entry(rd, call_id).meta["h"] == "w2"
    assert rd.store.lease("w1", LEASE_MS, [(call_id, tag)], 1) == [call_id]
    assert entry(rd, call_id).meta["h"] == "w2"


def test_a_worker_whose_take_failed_takes_its_calls_at_the_renewal(
    rd: RedisDelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal does not take a call no worker has taken since it was sent (the attempt above): a worker whose take
    did not reach Redis takes its calls again at the renewal, as takes."""
    from tests.test_adoption import plain_tasks

    app = rd.app
    app.conf.update(redisdelay_all_tasks=True, redisdelay_track_due_now=True)
    call_id = plain_tasks(app)["add"].delay(1, 2).id
    leases = Leases(rd.depot, "w1")
    leases.received(call_id, f"{call_id}.1")
    original = rd.store.lease
    failing = [True]

    def lease(*args: Any, **kwargs: Any) -> list[str]:
        if failing[0]:
            failing[0] = False
            raise StoreUnavailableError("Redis is unreachable (a test's)")
        return original(*args, **kwargs)

    monkeypatch.setattr(rd.store, "lease", lease)
    leases.take_new()
    assert "h" not in entry(rd, call_id).meta, "the take failed"
    leases.renew()
    assert entry(rd, call_id).meta["h"] == "w1"


class Run:
    """A request as Celery's worker state keeps it: its id, its task's name, hashed by identity."""

    def __init__(self, call_id: str) -> None:
        self.id = call_id
        self.name = "tests.leases.run"


def test_a_call_stays_held_while_celery_knows_one_of_its_requests(rd: RedisDelay, client: redis.Redis) -> None:
    # A run deferred behind a lock ends (task_ready) after the woken delivery of the same call was received and
    # started: Celery's requests dict, one request an id, loses the id, but the second run is still going.
    from celery.worker import state

    in_flight(rd, "deferred")
    now = [1000.0]
    leases = Leases(rd.depot, "w1", clock=lambda: now[0])
    deferred_run, woken_run = Run("deferred"), Run("deferred")
    state.task_accepted(deferred_run)
    leases.received("deferred", "deferred.1")
    leases.take_new()
    try:
        state.task_reserved(woken_run)
        state.task_accepted(woken_run)
        state.task_ready(deferred_run)
        assert "deferred" not in state.requests, "Celery's own dict forgot the id"
        now[0] += 3600  # a renewal period and more later
        leases.renew()
        assert set(leases.held) == {"deferred"}, "held while the woken run goes on"
        assert entry(rd, "deferred").meta["h"] == "w1"
    finally:
        state.task_ready(woken_run)
    leases.renew()
    assert leases.held == {}, "forgotten once no request of it is left"


def test_a_call_a_worker_holds_before_its_publish_is_confirmed_keeps_its_lease(
    rd: RedisDelay, client: redis.Redis
) -> None:
    """On RabbitMQ the store hears of a publish after the broker confirmed it, and a worker may have received the call
    and taken it under its lease by then. The confirm marks it released, but leaves the lease's deadline: with the
    queue timeout's (a day on AMQP), renewed as the later of the two, a worker killed before it started the call
    would leave it waiting a day."""
    rd.store.park("fast", ENVELOPE, {"r": LONG_MS, "m": 5}, countdown_ms=0)
    [claimed] = rd.store.claim(10, LONG_MS)
    before = redis_ms(client)
    assert rd.store.lease("w1", LEASE_MS, [("fast", "1")], 1) == []
    assert rd.store.confirm([claimed], 86_400_000) == 1
    held = entry(rd, "fast")
    assert (held.meta["s"], held.meta["h"]) == ("queued", "w1")
    assert before + LEASE_MS <= held.score_ms <= redis_ms(client) + LEASE_MS, "the lease's deadline, not a day"
