"""A redelivered message of a parked call runs only if it is the call's current delivery: the store's answer
(``delivery.lua``), the marks a message carries, and a real worker that receives both kombu's restore of an old
delivery and the sweep's new one, and runs the call once."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import redis
from kombu import Consumer, Queue

from celery_redisdelay import RedisDelay
from celery_redisdelay.message.marks import (
    DELIVERY_HEADER,
    PARKED_HEADER,
    RELEASED_HEADER,
    delivery_number,
    possibly_superseded,
    redelivered,
    superseded_after_ms,
)
from celery_redisdelay.testing import RedisServer, wait_for
from tests.pool_run import pool_worker
from tests.test_fidelity import echo_on
from tests.test_leases import ENVELOPE, LONG_MS, in_flight
from tests.test_store import entry


def test_the_store_says_which_delivery_is_current(rd: RedisDelay, client: redis.Redis) -> None:
    in_flight(rd, "call")  # delivery 1, in flight
    assert rd.store.current("call", 1)
    client.zadd(rd.keys.inflight, {"call": 0})
    assert rd.store.sweep(10, 5) == (1, 0)
    assert rd.store.current("call", 1), "swept, not yet delivered again: the start takes it back"
    assert [c.id for c in rd.store.claim(10, LONG_MS)] == ["call"] and rd.store.confirm(["call"], LONG_MS) == 1
    assert entry(rd, "call").meta["d"] == 2
    assert not rd.store.current("call", 1), "a later delivery was made"
    assert rd.store.current("call", 2)
    assert rd.store.ack("call")
    assert not rd.store.current("call", 2), "finished"

    rd.store.park("again", ENVELOPE, {}, countdown_ms=LONG_MS)  # parked again (a retry, a lock's deferral)
    assert not rd.store.current("again", 1)
    assert not rd.store.current("never-parked", 1)
    with pytest.raises(ValueError, match="a delivery number is 1 or more, not 0"):
        rd.store.current("call", 0)


def test_a_copy_of_an_earlier_attempt_is_not_the_retrys_delivery(rd: RedisDelay) -> None:
    """A retry parks the call again under its id and its deliveries count from 1 again: a copy of attempt 0's
    message (kombu restores those of a dropped connection) is told from the retry's own delivery 1 by its
    ``retries`` header, once the retry is released as while it waits (the battle saw such a copy run)."""
    echo = echo_on(rd)
    first = echo.apply_async((1,), countdown=0)
    assert rd.tick()["released"] == 1
    assert rd.store.start(first.id, LONG_MS, LONG_MS, "w1@h") == 1
    assert rd.store.current(first.id, 1, "w1@h", 0), "attempt 0's own delivery"
    retry = echo.signature((1,), retries=1).apply_async(task_id=first.id, countdown=0)  # as self.retry() parks
    assert retry.id == first.id
    assert rd.tick()["released"] == 1
    stored = rd.find(first.id)
    assert stored is not None and stored.meta["d"] == 1, "the retry's first delivery is number 1 again"
    assert not rd.store.current(first.id, 1, "w1@h", 0), "a copy of attempt 0 is stale"
    assert rd.store.current(first.id, 1, "w1@h", 1), "the retry's own delivery runs"
    assert rd.store.current(first.id, 1, "w1@h"), "a message without the header is judged as before"


def test_a_message_says_which_delivery_it_is() -> None:
    assert delivery_number("abc", "abc.3", {}) == 3
    assert delivery_number("abc", "xyz.3", {PARKED_HEADER: 1, "x-delivery-count": 2}) == 3
    assert delivery_number("abc", "kombu-uuid", {PARKED_HEADER: 1}) == 1
    assert delivery_number("abc", "kombu-uuid", {}) is None, "never parked"
    assert delivery_number("abc", "kombu-uuid", {PARKED_HEADER: 1, "x-delivery-count": "2"}) is None
    # Our own header first: a quorum queue rewrites x-delivery-count with its own count (tests/test_rabbitmq.py).
    assert delivery_number("abc", 7, {PARKED_HEADER: 1, DELIVERY_HEADER: 3, "x-delivery-count": 1}) == 3
    assert delivery_number("abc", 7, {PARKED_HEADER: 1, DELIVERY_HEADER: True, "x-delivery-count": 1}) == 2
    assert delivery_number("abc", 7, {DELIVERY_HEADER: 3}) is None, "not marked parked"

    class Message:
        def __init__(self, info: dict[str, Any], headers: dict[str, Any]) -> None:
            self.delivery_info, self.headers = info, headers

    assert redelivered(Message({"redelivered": True}, {}))
    assert redelivered(Message({}, {"redelivered": True}))
    assert not redelivered(Message({}, {}))


def test_kombus_restore_of_an_old_delivery_is_dropped_and_the_call_runs_once(redis_server: RedisServer) -> None:
    with pool_worker(redis_server, "solo", concurrency=1, start=False) as run:
        key = f"{run.prefix}:runs"
        queue = run.conf["task_default_queue"]
        call = run.task("pools.sleep").apply_async((key, 0.0))
        assert run.rd.tick()["released"] == 1
        client = redis.Redis.from_url(run.conf["broker_url"])
        # A worker takes delivery 1 and dies: kombu restores it later, marked redelivered. Before that, the
        # call's deadline passes and the sweep delivers it again.
        with (
            run.app.connection_for_read() as connection,
            Consumer(connection, [Queue(queue)], callbacks=[lambda _body, _message: None]),
        ):
            connection.drain_events(timeout=5)
            assert client.llen(queue) == 0
            client.zadd(run.rd.keys.inflight, {call.id: 0})
            assert run.rd.tick()["requeued"] == 1
            assert client.llen(queue) == 1, "delivery 2 waits in the queue"
        assert client.llen(queue) == 2, "kombu restored delivery 1 beside it"
        run.worker.start()
        wait_for(run.settled, 60, "the call to be acknowledged")
        wait_for(lambda: "dropped delivery 1 of call" in run.worker.output(), 30, "the worker to log the drop")
        wait_for(lambda: client.llen(queue) == 0, 30, "both messages to be taken")
        starts = [note for note in run.notes(key) if note["at"] == "start"]
        assert [(note["id"], note["delivery"]) for note in starts] == [(call.id, 2)], starts
        client.close()


def test_a_first_delivery_asks_nothing(rd: RedisDelay) -> None:
    from celery_redisdelay.worker.stale import StaleDeliveries

    class Message:
        def __init__(self) -> None:
            self.delivery_info: dict[str, Any] = {}
            self.headers = {"id": str(uuid.uuid4()), PARKED_HEADER: 1}
            self.delivery_tag = "tag"

    asked: list[str] = []
    rd.depot.shards.first = lambda call_id, action: asked.append(call_id)  # type: ignore[method-assign,assignment,misc]
    assert not StaleDeliveries(rd.depot, lambda task: True).is_stale(Message())
    assert asked == [], "a first delivery costs no Redis call"
    # But for one released more than half the queue timeout ago: the sweep may have delivered its call again.
    old = Message()
    old.headers[RELEASED_HEADER] = int(time.time() * 1000) - round(rd.settings.queue_timeout * 1000)
    assert StaleDeliveries(rd.depot, lambda task: True).is_stale(old)  # the fake store says: not current
    assert asked == [old.headers["id"]]


def test_a_first_delivery_is_asked_about_once_it_may_have_been_superseded() -> None:
    now = 1_000_000
    assert not possibly_superseded({}, now, 5_000), "released before 0.6: no time, no question"
    assert not possibly_superseded({RELEASED_HEADER: now - 5_000}, now, 5_000)
    assert possibly_superseded({RELEASED_HEADER: now - 5_001}, now, 5_000)
    assert not possibly_superseded({RELEASED_HEADER: "0"}, now, 5_000)
    # Half the queue timeout; on an AMQP broker, half a lease if shorter (a publish left in doubt); no lease: none.
    assert superseded_after_ms(7_200, 30, amqp_broker=False) == 3_600_000
    assert superseded_after_ms(86_400, 30, amqp_broker=True) == 15_000
    assert superseded_after_ms(20, 30, amqp_broker=True) == 10_000
    assert superseded_after_ms(86_400, 0, amqp_broker=True) == 43_200_000
    # ... and half the claim timeout, if shorter still (a releaser that stalled past its claim): AMQP only
    assert superseded_after_ms(86_400, 30, amqp_broker=True, claim_timeout=3) == 1_500
    assert superseded_after_ms(7_200, 30, amqp_broker=False, claim_timeout=3) == 3_600_000


def test_a_copy_of_a_call_another_worker_holds_under_a_live_lease_is_stale(rd: RedisDelay, client: redis.Redis) -> None:
    """kombu restores a message a live worker has held past the visibility timeout (kombu#337), and the messages of
    a dropped connection: the holder runs the call, so a copy another worker receives meanwhile is dropped. Once
    the holder's lease has run out, the copy runs (the start takes the call back)."""
    in_flight(rd, "held")
    assert rd.store.lease("w1", 60_000, [("held", "held.1")], 1) == []
    assert not rd.store.current("held", 1, "w2"), "w1 holds it and renews its lease"
    assert rd.store.current("held", 1, "w1"), "the holder's own copy"
    assert rd.store.current("held", 1), "a worker that does not say who it is: as before"
    client.zadd(rd.keys.inflight, {"held": 0})  # w1's lease ran out, the sweep has not run yet
    assert rd.store.current("held", 1, "w2")


def test_a_copy_the_broker_redelivered_leaves_the_holder(rd: RedisDelay, client: redis.Redis) -> None:
    """RabbitMQ redelivers a message only once the channel it went out on closed: the holder can no longer
    acknowledge it. Such a copy is current despite the holder's live lease, and the call leaves the holder, so that
    the receiving worker's lease takes it at once (else the sweep would deliver it again a lease later)."""
    in_flight(rd, "requeued")
    assert rd.store.lease("w1", 60_000, [("requeued", "7")], 1) == []
    assert not rd.store.current("requeued", 1, "w2"), "a copy of kombu's restore: w1 holds it"
    assert rd.store.current("requeued", 1, "w2", by_broker=True)
    assert rd.store.lease("w2", 60_000, [("requeued", "3")], -1) == [], "w2's lease takes it"
    assert not rd.store.current("requeued", 1, "w3"), "w2 holds it now"


def test_a_copy_the_broker_kept_of_a_run_started_at_most_once_is_stale(rd: RedisDelay) -> None:
    """A task acknowledged early runs at most once past its start. A copy RabbitMQ redelivers of such a run comes
    of an acknowledgement it lost (a broker restart): stale. Of a run that may run again (acks_late), current."""
    for name, once in (("once", True), ("again", False)):
        in_flight(rd, name)
        assert rd.store.track([("start-once" if once else "start", name)], 60_000, 30_000, "w1") == []
        assert rd.store.current(name, 1, "w2", by_broker=True) is not once, name


def test_a_step_that_fails_leaves_the_message_to_celery(caplog: pytest.LogCaptureFixture) -> None:
    """A defect in one of our message handler steps must not lose the message: Celery's consumer would drop it
    unacknowledged and say nothing (found on RabbitMQ, where a received eta message's body is text)."""
    from celery_redisdelay.worker import strategies

    handled: list[Any] = []
    acked: list[Any] = []

    class Task:
        Strategy = staticmethod(lambda task, app, consumer, **options: lambda *args, **kw: handled.append(args[0]))

    def broken(message: Any) -> bool:
        raise TypeError("a defect")

    tasks = {"t": Task()}
    assert strategies.wrap(tasks, "strategy.stale", lambda task: broken) == 1
    handler = tasks["t"].Strategy(tasks["t"], None, type("Consumer", (), {"connection_errors": ()})())
    handler("message", "body", lambda *args: acked.append(args), None, None)
    assert handled == ["message"] and acked == []
    assert "a message handler step failed" in caplog.text
