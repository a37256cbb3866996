"""Distributed locks and lock deferral against a real redis-server.

``rd.lock`` for code outside tasks (exclusion, expiry, extension, blocking waits woken by the
release), lock names holding any text, the deferral of a tracked call behind a busy lock
(``lock_take.lua``), the ``lock=`` template of ``@rd.delayed``, the eager path, and keys of the wrong
type. Nothing sleeps hoping: waits poll a state with ``wait_for`` or block on an event, and no test
asserts how long something took.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import pytest
import redis
from celery import Celery
from celery.app.trace import build_tracer
from redis.cluster import key_slot

from celery_redisdelay import ConfigurationError, DelayedTask, RedisDelay, StoreUnavailableError
from celery_redisdelay.errors import LockTimeout
from celery_redisdelay.producer.locks import Lock
from celery_redisdelay.testing import wait_for
from tests.test_chaos import LosingReplies, losing_replies

MakeApp = Callable[..., tuple[Celery, RedisDelay]]
WAIT = 5.0


def redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def lock_keys(rd: RedisDelay, name: str) -> list[str]:
    return [rd.keys.lock(name), rd.keys.lock_waiters(name), rd.keys.lock_wake(name)]


def snapshot(client: redis.Redis, rd: RedisDelay, name: str) -> dict[str, Any]:
    """Byte-exact state of the store's keys and of one lock's keys."""
    return {key: client.dump(key) for key in [*rd.keys.store_keys, *lock_keys(rd, name)]}


def a_millisecond_later(client: redis.Redis) -> None:
    """Wait until the Redis clock has passed the current millisecond."""
    now = redis_ms(client)
    wait_for(lambda: redis_ms(client) > now, WAIT, "the Redis clock to pass a millisecond")


def holds(client: redis.Redis, rd: RedisDelay, lock: Lock) -> bool:
    """Whether Redis has ``lock``'s name held by ``lock``'s token."""
    return lock.token is not None and client.get(rd.keys.lock(lock.name)) == lock.token.encode()


def blocked_waiter(client: redis.Redis) -> bool:
    """Whether some client is blocked in BLPOP (the only blocking command in these tests)."""
    return any(c["cmd"] == "blpop" and "b" in c["flags"] for c in client.client_list())


def unique(name: str) -> str:
    return f"tests.{name}.{uuid.uuid4().hex[:8]}"


def order_task(rd: RedisDelay) -> DelayedTask:
    @rd.delayed(name=unique("order"), lock="order:{order_id}", lock_timeout=5, lock_retry=3)
    def process(order_id: int) -> int:
        return order_id

    return process


def process_order(order_id: int, note: str = "") -> None:
    """A plain function the decoration tests try to turn into tasks."""


# -- rd.lock outside tasks ------------------------------------------------------------------------


def test_acquire_release_and_a_second_lock_on_the_same_name(rd: RedisDelay, client: redis.Redis) -> None:
    lock = rd.lock("order:1", timeout=30)
    assert lock.acquire(blocking=False) is True and lock.owned
    assert holds(client, rd, lock)
    assert 0 < client.pttl(rd.keys.lock("order:1")) <= 30_000
    other = rd.lock("order:1")
    assert other.acquire(blocking=False) is False and not other.owned
    with pytest.raises(RuntimeError, match="already held"):
        lock.acquire()
    assert lock.release() is True and not lock.owned
    assert not client.exists(rd.keys.lock("order:1"))
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()
    assert other.acquire(blocking=False) is True
    assert other.release() is True
    for name, timeout in [("", 1.0), ("x", 0), ("x", -1.0)]:
        with pytest.raises(ValueError, match=r"name|timeout"):
            rd.lock(name, timeout=timeout)


def test_release_after_expiry_returns_false_and_spares_the_new_holder(rd: RedisDelay, client: redis.Redis) -> None:
    lock = rd.lock("brief", timeout=0.2)
    assert lock.acquire(blocking=False)
    wait_for(lambda: not client.exists(rd.keys.lock("brief")), WAIT, "the lock to expire")
    newcomer = rd.lock("brief")
    assert newcomer.acquire(blocking=False)
    assert lock.release() is False, "the lost token must not release the newcomer's lock"
    assert holds(client, rd, newcomer)
    assert newcomer.release() is True


def test_extend_keeps_the_lock_alive(rd: RedisDelay, client: redis.Redis) -> None:
    lock = rd.lock("long", timeout=0.2)
    start = redis_ms(client)
    assert lock.acquire(blocking=False)
    assert lock.extend(60) is True
    assert client.pttl(rd.keys.lock("long")) > 1_000
    # Poll the Redis clock (not a sleep) until well past the lock's first expiry.
    wait_for(lambda: redis_ms(client) > start + 600, WAIT, "the first expiry to pass")
    assert holds(client, rd, lock)
    assert rd.lock("long").acquire(blocking=False) is False
    assert lock.release() is True
    # An expired lock cannot be extended back to life.
    assert lock.acquire(blocking=False)
    wait_for(lambda: not client.exists(rd.keys.lock("long")), WAIT, "the lock to expire")
    assert lock.extend(60) is False
    assert not client.exists(rd.keys.lock("long"))


def test_with_raises_lock_timeout_while_another_holds_it(rd: RedisDelay, client: redis.Redis) -> None:
    holder = rd.lock("busy")
    assert holder.acquire(blocking=False)
    with ExitStack() as stack, pytest.raises(LockTimeout, match="busy"):
        stack.enter_context(rd.lock("busy", blocking_timeout=0.3))
    assert holds(client, rd, holder)
    assert holder.release() is True


def test_a_blocked_waiter_gets_the_lock_once_the_holder_releases(rd: RedisDelay, client: redis.Redis) -> None:
    holder = rd.lock("door")
    assert holder.acquire(blocking=False)
    entered = threading.Event()

    def wait_in_line() -> bool:
        with rd.lock("door", blocking_timeout=60) as lock:
            entered.set()
            return holds(client, rd, lock)

    with ThreadPoolExecutor(1) as pool:
        waiter = pool.submit(wait_in_line)
        wait_for(lambda: blocked_waiter(client), WAIT, "the waiter to block on the wake-up list")
        assert not entered.is_set()
        assert holder.release() is True
        assert entered.wait(WAIT), "the waiter did not get the lock after the release"
        assert waiter.result(WAIT) is True, "the waiter ran without holding the lock"
    assert not client.exists(rd.keys.lock("door"))


def test_locks_exclude_each_other_across_threads(rd: RedisDelay, client: redis.Redis) -> None:
    counter = f"test-counter-{uuid.uuid4().hex}"

    def increment_twenty_times() -> None:
        for _ in range(20):
            with rd.lock("counter", timeout=30, blocking_timeout=60):
                value = int(client.get(counter) or 0)  # a read-modify-write that races without the lock
                client.set(counter, value + 1)

    try:
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(increment_twenty_times) for _ in range(6)]
        for future in futures:
            future.result()
        assert int(client.get(counter) or 0) == 120
        assert not client.exists(rd.keys.lock("counter"))
    finally:
        client.delete(counter)


def test_a_timeout_the_lock_accepts_is_one_redis_accepts(rd: RedisDelay) -> None:
    lock = rd.lock("tiny", timeout=0.0004)  # refusing it here with ValueError would also be a fix
    assert lock.acquire(blocking=False)


# -- lock names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["order:{42}", "{", "}{", "a b  c ", "zamówienie 🔒 注文", "a:b::c:", "{test}", "lock:x"]
)
def test_odd_lock_names_work_and_stay_in_the_store_slot(rd: RedisDelay, client: redis.Redis, name: str) -> None:
    slot = key_slot(rd.keys.delayed.encode())
    assert [key_slot(key.encode()) for key in lock_keys(rd, name)] == [slot] * 3
    lock = rd.lock(name)
    assert lock.acquire(blocking=False)
    assert holds(client, rd, lock)
    assert rd.lock(name).acquire(blocking=False) is False
    neighbour = rd.lock(name + "}")
    assert neighbour.acquire(blocking=False), "a different name is a different lock"
    assert neighbour.release() and lock.release()
    assert not client.exists(rd.keys.lock(name))


# -- deferral in the store ------------------------------------------------------------------------


def test_a_busy_lock_defers_a_tracked_call_and_the_release_wakes_it(rd: RedisDelay, client: redis.Redis) -> None:
    call_id = order_task(rd).apply_async(kwargs={"order_id": 42}).id
    parked = rd.find(call_id)
    assert parked is not None and parked.state == "delayed"
    deliveries = parked.meta["d"]
    [claimed] = rd.store.claim(10, 30_000)
    assert (claimed.id, claimed.deliveries) == (call_id, deliveries + 1)
    assert rd.store.start(call_id, 30_000) == 1
    outside = rd.lock("order:42")
    assert outside.acquire(blocking=False)

    before = redis_ms(client)
    status, remaining = rd.store.lock_take("order:42", "tok", 5000, call_id, 3000)
    after = redis_ms(client)
    assert status == 0 and 0 < remaining <= 60_000
    deferred = rd.find(call_id)
    assert deferred is not None and deferred.state == "delayed"
    assert deferred.meta["s"] == "deferred" and deferred.meta["d"] == deliveries
    assert before + 3000 <= deferred.score_ms <= after + 3000, "due after the retry interval, no later"
    assert client.zscore(rd.keys.lock_waiters("order:42"), call_id) is not None
    assert holds(client, rd, outside)
    assert client.hget(rd.keys.counters, "lock_deferrals") == b"1"
    assert client.hget(rd.keys.counters, "lock_lines") == b"1", "one lock has a line of waiters"

    assert outside.release() is True
    woken = rd.find(call_id)
    assert woken is not None and woken.state == "delayed"
    assert woken.score_ms <= redis_ms(client), "the release makes the first waiter due now"
    [again] = rd.store.claim(10, 30_000)
    assert (again.id, again.deliveries) == (call_id, deliveries + 1), "a deferral is not a failed delivery"
    assert rd.store.start(call_id, 30_000) == 1
    assert rd.store.lock_take("order:42", "tok", 5000, call_id, 3000)[0] == 1
    assert not client.exists(rd.keys.lock_waiters("order:42")), "the taker leaves the line"
    assert client.hget(rd.keys.counters, "lock_lines") == b"0", "and the line is gone"
    assert rd.store.lock_release("order:42", "tok") is True


def test_a_delivery_older_than_the_current_one_neither_takes_nor_defers(rd: RedisDelay, client: redis.Redis) -> None:
    """The 28-minute battle's duplicate: delivery 1 was received, the sweep delivered the call again (2) before
    delivery 1's run began, and delivery 1's run then deferred the call behind its busy lock. The deferral counted
    the delivery back and the lock's release woke the call, which the release pushed as delivery 2 a second time:
    both copies passed the worker's check and ran. Now delivery 1 changes nothing, free lock or busy."""
    call_id = order_task(rd).apply_async(kwargs={"order_id": 5}).id
    [first] = rd.store.claim(10, 30_000)
    assert rd.store.start(call_id, 30_000, 100, "w1@h") == 1  # delivery 1, under a short lease
    deadline = client.zscore(rd.keys.inflight, call_id)
    assert deadline is not None
    until = deadline
    wait_for(lambda: redis_ms(client) > until, WAIT, "the lease to run out")
    assert rd.store.sweep(10, 10) == (1, 0)
    [second] = rd.store.claim(10, 30_000)
    assert (first.deliveries, second.deliveries) == (1, 2)
    before = {key: client.dump(key) for key in rd.keys.store_keys}

    assert rd.store.lock_take("order:5", "tok-1", 5000, call_id, 3000, delivery=1)[0] == -2, "the lock is free"
    assert not client.exists(rd.keys.lock("order:5"))
    outside = rd.lock("order:5")
    assert outside.acquire(blocking=False)
    assert rd.store.lock_take("order:5", "tok-1", 5000, call_id, 3000, delivery=1)[0] == -2, "or busy"
    assert {key: client.dump(key) for key in rd.keys.store_keys} == before, "nothing changed"
    assert not client.exists(rd.keys.lock_waiters("order:5"))

    assert rd.store.lock_take("order:5", "tok-2", 5000, call_id, 3000, delivery=2)[0] == 0, "the current one waits"
    deferred = rd.find(call_id)
    assert deferred is not None and deferred.meta["s"] == "deferred"
    assert outside.release() is True


def test_only_the_first_in_line_polls_and_each_release_wakes_the_next(rd: RedisDelay, client: redis.Redis) -> None:
    task = order_task(rd)
    first, second, third = (task.apply_async(kwargs={"order_id": 3}).id for _ in range(3))
    rd.store.claim(10, 30_000)
    for call_id in (first, second, third):
        rd.store.start(call_id, 30_000)
    outside = rd.lock("order:3", timeout=600)
    assert outside.acquire(blocking=False)
    deferred_at = {}
    for call_id in (first, second, third):
        deferred_at[call_id] = redis_ms(client)
        assert rd.store.lock_take("order:3", "tok", 5000, call_id, 3000)[0] == 0
        a_millisecond_later(client)  # the line is in time order
    due = {call_id: entry.score_ms for call_id in (first, second, third) if (entry := rd.find(call_id))}
    assert deferred_at[first] + 3000 <= due[first] <= deferred_at[second] + 3000, "the first in line tries again"
    for call_id in (second, third):
        assert due[call_id] > redis_ms(client) + 590_000, "the rest wait for a release or the lock's expiry"
    assert due[second] + 2900 <= due[third], "and the further back in line, the later: a line hardly polls"

    # Each release wakes the next in line: the woken one takes the lock and leaves the line, and the one first
    # in line after it polls from then on (in case this holder dies without releasing).
    for call_id, after in ((first, second), (second, third), (third, None)):
        assert outside.release() if call_id == first else rd.store.lock_release("order:3", "tok")
        woken = rd.find(call_id)
        assert woken is not None and woken.score_ms <= redis_ms(client), call_id
        if after is not None:
            waiting = rd.find(after)
            assert waiting is not None and waiting.score_ms > redis_ms(client) + 60_000, after
        assert call_id in {claimed.id for claimed in rd.store.claim(10, 30_000)}
        rd.store.start(call_id, 30_000)
        before = redis_ms(client)
        assert rd.store.lock_take("order:3", "tok", 5000, call_id, 3000)[0] == 1
        if after is not None:
            polling = rd.find(after)
            assert polling is not None and before + 3000 <= polling.score_ms <= redis_ms(client) + 3000, after
    assert rd.store.lock_release("order:3", "tok") and not client.exists(rd.keys.lock_waiters("order:3"))


def test_a_deferred_call_rescheduled_by_hand_is_not_woken_early(rd: RedisDelay, client: redis.Redis) -> None:
    call_id = order_task(rd).apply_async(kwargs={"order_id": 7}).id
    rd.store.claim(10, 30_000)
    rd.store.start(call_id, 30_000)
    outside = rd.lock("order:7")
    assert outside.acquire(blocking=False)
    assert rd.store.lock_take("order:7", "tok", 5000, call_id, 3000)[0] == 0
    assert rd.reschedule(call_id, countdown=3600)
    assert outside.release() is True
    entry = rd.find(call_id)
    assert entry is not None
    assert entry.score_ms > redis_ms(client) + 3_000_000, "the release must not undo the reschedule"
    assert not client.exists(rd.keys.lock_waiters("order:7")), "it left the line"
    assert client.hget(rd.keys.counters, "lock_lines") == b"0", "the release dropped the emptied line"
    client.hset(rd.keys.counters, "lock_lines", 0)  # a line that waited before the count was kept
    client.zadd(rd.keys.lock_waiters("order:7"), {"gone": 1})
    assert outside.acquire(blocking=False) and outside.release() is True
    assert client.hget(rd.keys.counters, "lock_lines") == b"0", "the count never goes below zero"


def test_a_lock_whose_holder_is_gone_is_taken_over(rd: RedisDelay, client: redis.Redis) -> None:
    task = order_task(rd)
    holder, waiter, third, fourth = (task.apply_async(kwargs={"order_id": 9}).id for _ in range(4))
    assert {call.id for call in rd.store.claim(10, 30_000)} == {holder, waiter, third, fourth}
    assert rd.store.start(holder, 30_000, 300, "w1@h") == 1  # under a 300 ms lease of worker w1
    assert rd.store.lock_take("order:9", "tok-a", 60_000, holder, 3000)[0] == 1
    assert client.get(rd.keys.lock("order:9")) == f"tok-a|1|{holder}".encode(), "a tracked call names itself"
    assert rd.store.start(waiter, 30_000, 30_000, "w2@h") == 1
    assert rd.store.lock_take("order:9", "tok-b", 60_000, waiter, 600_000)[0] == 0, "busy while the lease lives"

    deadline = client.zscore(rd.keys.inflight, holder)
    assert deadline is not None
    until = deadline
    wait_for(lambda: redis_ms(client) > until, WAIT, "the holder's lease to run out")
    assert rd.store.start(third, 30_000, 30_000, "w2@h") == 1
    status, remaining = rd.store.lock_take("order:9", "tok-c", 60_000, third, 3000)
    assert (status, remaining) == (2, 0), "a holder whose lease ran out has lost its lock"
    assert client.get(rd.keys.lock("order:9")) == f"tok-c|1|{third}".encode()
    assert 59_000 < client.pttl(rd.keys.lock("order:9")) <= 60_000, "with the taker's own expiry"
    assert client.hget(rd.keys.counters, "lock_takeovers") == b"1"
    assert rd.store.lock_release("order:9", "tok-a") is False, "the dead holder's token releases nothing"
    assert rd.store.lock_extend("order:9", "tok-a", 60_000) is False
    assert rd.store.lock_extend("order:9", "tok-c", 60_000) is True, "the taker's token extends it"

    # A holder no longer in flight (finished, swept back) has lost it too.
    assert rd.store.ack(third)
    assert rd.store.start(fourth, 30_000, 300, "w2@h") == 1
    assert rd.store.lock_take("order:9", "tok-d", 60_000, fourth, 3000)[0] == 2
    # A copy of the holding delivery (kombu restored its message) finds it busy, and is not deferred.
    assert rd.store.lock_take("order:9", "tok-e", 60_000, fourth, 3000)[0] == 0
    assert rd.find(fourth) is not None and rd.find(fourth).state == "inflight"  # type: ignore[union-attr]
    # A later delivery of the holder takes it over: the sweep delivered it again, so its old run is gone.
    deadline = client.zscore(rd.keys.inflight, fourth)
    assert deadline is not None
    until = deadline
    wait_for(lambda: redis_ms(client) > until, WAIT, "the holder's lease to run out")
    assert rd.store.sweep(10, 10) == (2, 0)  # and the first holder, whose lease ran out before
    assert fourth in {call.id for call in rd.store.claim(10, 30_000)}
    assert rd.store.start(fourth, 30_000, 30_000, "w2@h") == 1
    assert rd.store.lock_take("order:9", "tok-f", 60_000, fourth, 3000)[0] == 2
    assert client.get(rd.keys.lock("order:9")) == f"tok-f|2|{fourth}".encode()
    assert rd.store.lock_release("order:9", "tok-f") is True
    woken = rd.find(waiter)
    assert woken is not None and woken.score_ms <= redis_ms(client), "and its release wakes the line"
    woken = rd.find(waiter)
    assert woken is not None and woken.score_ms <= redis_ms(client), "and its release wakes the line"
    assert client.hget(rd.keys.counters, "lock_takeovers") == b"3"


def test_the_same_take_again_holds_the_lock(rd: RedisDelay, client: redis.Redis) -> None:
    """A take whose reply was lost and that the client sends again (the same token) holds the lock, in a task or
    outside: answered busy, the task would wait behind itself, and a Lock until the expiry."""
    task = order_task(rd)
    call = task.apply_async(kwargs={"order_id": 5}).id
    assert {claimed.id for claimed in rd.store.claim(10, 30_000)} == {call}
    assert rd.store.start(call, 30_000, 30_000, "w1@h") == 1
    for _ in range(2):
        assert rd.store.lock_take("order:5", "tok-a", 60_000, call, 3000)[0] == 1
    assert rd.find(call).state == "inflight", "not deferred"  # type: ignore[union-attr]
    for _ in range(2):
        assert rd.store.lock_take("outside", "tok-b", 60_000)[0] == 1
    assert rd.store.lock_take("outside", "tok-c", 60_000)[0] == 0, "another take still finds it busy"
    assert client.hget(rd.keys.counters, "lock_takeovers") is None


def test_a_lock_whose_reply_was_lost_is_held_by_its_taker(make_app: MakeApp) -> None:
    """The take lands, its reply is dropped, redis-py sends it again: ``rd.lock`` holds it at once."""
    name = unique("lost-reply")
    _, rd = make_app(redisdelay_connection_options=losing_replies())
    LosingReplies.armed[name] = 1
    try:
        with rd.lock(name, timeout=60, blocking_timeout=0):
            assert LosingReplies.dropped.count(name) == 1, "the take's reply was lost"
    finally:
        LosingReplies.armed.pop(name, None)


def test_a_lock_held_outside_tasks_is_never_taken_over(rd: RedisDelay, client: redis.Redis) -> None:
    call_id = order_task(rd).apply_async(kwargs={"order_id": 5}).id
    rd.store.claim(10, 30_000)
    rd.store.start(call_id, 30_000)
    outside = rd.lock("order:5", timeout=60)
    assert outside.acquire(blocking=False)
    assert rd.store.lock_take("order:5", "tok", 5000, call_id, 3000)[0] == 0
    assert rd.store.lock_take("order:5", "tok", 5000, "", 0)[0] == 0
    assert holds(client, rd, outside) and outside.release()
    assert client.hget(rd.keys.counters, "lock_takeovers") is None


def test_lock_take_for_an_untracked_call_changes_nothing(rd: RedisDelay, client: redis.Redis) -> None:
    parked = order_task(rd).apply_async(kwargs={"order_id": 42}).id  # delayed, not in flight
    outside = rd.lock("order:42")
    assert outside.acquire(blocking=False)
    before = snapshot(client, rd, "order:42")
    for call_id in ("never-parked", parked):
        status, remaining = rd.store.lock_take("order:42", "tok", 5000, call_id, 3000)
        assert status == -1 and remaining > 0, call_id
    assert snapshot(client, rd, "order:42") == before
    assert outside.release() is True


# -- the lock= template ---------------------------------------------------------------------------


def test_lock_name_fills_the_template_from_the_call(rd: RedisDelay) -> None:
    @rd.delayed(name=unique("handle"), lock="{kind}:{order_id}:{flag}")
    def handle(order_id: int, kind: str = "order", flag: bool = False) -> None: ...

    assert handle.lock_name((42,), {}) == "order:42:False"
    assert handle.lock_name((), {"order_id": 7, "kind": "refund"}) == "refund:7:False"
    assert handle.lock_name((1, "x", True), {}) == "x:1:True"

    @rd.delayed(name=unique("ship"), lock="order:{order.id}/{lines[0]}/{meta[region]}")
    def ship(order: Any, lines: list[str], meta: dict[str, str]) -> None: ...

    assert ship.lock_name((SimpleNamespace(id=9), ["a"], {"region": "eu"}), {}) == "order:9/a/eu"

    @rd.delayed(name=unique("bound"), lock="user:{user_id}", bind=True)
    def bound(self: Any, user_id: int) -> None: ...

    assert bound.lock_name((5,), {}) == "user:5"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"lock": "order:{order}"}, "not an argument"),
        ({"lock": "order:{0}"}, "not an argument"),
        ({"lock": "{"}, "malformed"),
        ({"lock": "}"}, "malformed"),
        ({"lock": ""}, "non-empty"),
        ({"lock": "x:{order_id}", "lock_timeout": 0}, "lock_timeout"),
        ({"lock": "x:{order_id}", "lock_timeout": -1}, "lock_timeout"),
        ({"lock": "x:{order_id}", "lock_retry": 0}, "lock_retry"),
        ({"lock": "x:{order_id}", "lock_timeout": "5"}, "lock_timeout"),
    ],
)
def test_decoration_refuses_lock_options_that_cannot_work(rd: RedisDelay, options: dict[str, Any], match: str) -> None:
    decorate = rd.delayed(name=unique("refused"), **options)
    with pytest.raises(ConfigurationError, match=match):
        decorate(process_order)


@pytest.mark.parametrize("template", ["order:{order_id!x}", "order:{order_id.}", "order:{order_id:{nope}}"])
def test_decoration_refuses_templates_no_call_can_fill(rd: RedisDelay, template: str) -> None:
    decorate = rd.delayed(name=unique("never"), lock=template)
    with pytest.raises(ConfigurationError):
        decorate(process_order)


def test_apply_async_refuses_arguments_the_template_cannot_fill(rd: RedisDelay) -> None:
    @rd.delayed(name=unique("fill"), lock="order:{order[id]}")
    def fill(order: Any, note: str = "") -> None: ...

    @rd.delayed(name=unique("attr"), lock="order:{order.id}")
    def attr(order: Any) -> None: ...

    before = rd.stats()
    with pytest.raises(ConfigurationError, match="cannot be filled"):
        fill.apply_async(args=[{"number": 1}])  # no 'id' in the dict
    with pytest.raises(ConfigurationError, match="cannot be filled"):
        attr.delay(42)  # an int has no attribute 'id'
    with pytest.raises(TypeError, match="do not fit its signature"):
        fill.apply_async(kwargs={"note": "no order"})
    assert rd.stats() == before, "nothing may be parked"


# -- eager mode -----------------------------------------------------------------------------------


def test_an_eager_call_holds_the_lock_while_it_runs(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(task_always_eager=True)
    seen: list[bytes | None] = []

    @rd.delayed(name=unique("job"), lock="job:{n}")
    def job(n: int) -> int:
        seen.append(client.get(rd.keys.lock(f"job:{n}")))
        return n * 2

    @rd.delayed(name=unique("broken"), lock="job:{n}")
    def broken(n: int) -> None:
        seen.append(client.get(rd.keys.lock(f"job:{n}")))
        raise RuntimeError("boom")

    before = rd.stats()
    assert job.delay(21).get() == 42
    assert broken.delay(22).failed()
    assert len(seen) == 2 and all(token for token in seen), "the body ran without the lock"
    assert not client.exists(rd.keys.lock("job:21")) and not client.exists(rd.keys.lock("job:22"))
    assert rd.stats() == before, "an eager call is not parked"

    holder = rd.lock("job:23")
    assert holder.acquire(blocking=False)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(lambda: job.delay(23).get())
        wait_for(lambda: blocked_waiter(client), WAIT, "the eager call to wait for the lock")
        assert not waiting.done() and len(seen) == 2
        assert holder.release() is True
        assert waiting.result(WAIT) == 46
    assert not client.exists(rd.keys.lock("job:23"))


# -- keys of the wrong type -----------------------------------------------------------------------


@pytest.mark.parametrize("which", ["lock", "lock_waiters"])
def test_a_lock_key_of_the_wrong_type_is_refused(rd: RedisDelay, client: redis.Redis, which: str) -> None:
    key = getattr(rd.keys, which)("order:7")
    client.hset(key, "someone", "else") if which == "lock" else client.set(key, "not a zset")
    before = snapshot(client, rd, "order:7")
    lock = rd.lock("order:7")
    with pytest.raises(StoreUnavailableError, match="WRONGTYPE"):
        lock.acquire(blocking=False)
    assert not lock.owned
    assert snapshot(client, rd, "order:7") == before


def test_a_deferred_run_that_ends_after_the_wake_ups_run_began_leaves_it_acknowledged(rd: RedisDelay) -> None:
    # Under the threads, gevent and eventlet pools one call's two runs can overlap in a process: the run deferred
    # behind a lock ends (its task_postrun) after the release woke the call and its next delivery started. Both
    # go through Celery's own tracer here, in that order; the second run's end must still acknowledge the call.
    second_running, first_done = threading.Event(), threading.Event()

    @rd.delayed(name=unique("overlap"), lock="overlap:{n}", lock_timeout=5, lock_retry=3)
    def overlap(n: int) -> int:
        second_running.set()
        assert first_done.wait(WAIT), "the deferred run ended"
        return n

    store = rd.shards.for_name("overlap:1")
    take = store.lock_take

    def take_then_hold(*args: Any) -> tuple[int, int]:
        status = take(*args)
        if threading.current_thread().name == "deferred-run":
            assert second_running.wait(WAIT), "the wake-up's run started"
        return status

    call_id = overlap.apply_async((1,)).id
    [claimed] = rd.store.claim(10, 30_000)
    assert claimed.id == call_id
    request = {"id": call_id, "properties": {"delivery_tag": f"{call_id}.{claimed.deliveries}"}, "hostname": "w@h"}
    tracer = build_tracer(overlap.name, overlap, app=rd.app)
    with rd.lock("overlap:1"), patch.object(store, "lock_take", take_then_hold):
        first = threading.Thread(target=tracer, args=(call_id, (1,), {}, request), name="deferred-run")
        first.start()
        wait_for(lambda: rd.find(call_id).meta["s"] == "deferred", WAIT, "the call to be deferred")  # type: ignore[union-attr]
    [woken] = rd.store.claim(10, 30_000)
    assert (woken.id, woken.deliveries) == (call_id, claimed.deliveries), "a deferral is not a failed delivery"
    second = threading.Thread(target=tracer, args=(call_id, (1,), {}, request), name="woken-run")
    second.start()
    assert second_running.wait(WAIT)
    first.join(WAIT)
    first_done.set()
    second.join(WAIT)
    assert not first.is_alive() and not second.is_alive()
    rd.depot.outbox.flush()
    assert rd.find(call_id) is None, "the woken run's end acknowledged the call"
