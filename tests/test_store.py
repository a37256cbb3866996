"""The call store against a real redis-server: every state change of a call's life, and bad data.

Deadlines are made short (milliseconds) directly on the store and waited for by polling the sweep
with a deadline; nothing here sleeps hoping a deadline has passed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from celery_redisdelay import RedisDelay, RedisDelayError, StoreUnavailableError
from celery_redisdelay.store.calls import Claimed, Entry
from celery_redisdelay.testing import wait_for

ENVELOPE = b'{"opaque": "to the store"}'
LONG_MS = 60_000
SHORT_MS = 50
WAIT = 5.0


def redis_ms(client: redis.Redis) -> int:
    """The Redis server's clock, in ms since the epoch."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def entry(rd: RedisDelay, call_id: str) -> Entry:
    found = rd.find(call_id)
    assert found is not None, f"call {call_id} is not in the store"
    return found


def score(client: redis.Redis, key: str, call_id: str) -> float | None:
    value: float | None = client.zscore(key, call_id)
    return value


def sweep_until(rd: RedisDelay, expected: tuple[int, int], max_deliveries: int = 10) -> None:
    """Sweep until the sweep reports ``expected`` (requeued, dead); fail after WAIT seconds."""
    seen: list[tuple[int, int]] = []

    def swept() -> bool:
        result = rd.store.sweep(100, max_deliveries)
        if result != (0, 0):
            seen.append(result)
        return result != (0, 0)

    wait_for(swept, WAIT, f"the sweep to report {expected}")
    assert seen == [expected]


def claim_one(rd: RedisDelay, claim_timeout_ms: int = LONG_MS) -> Claimed:
    claimed = rd.store.claim(10, claim_timeout_ms)
    assert len(claimed) == 1, claimed
    return claimed[0]


def snapshot(client: redis.Redis, rd: RedisDelay) -> dict[str, Any]:
    """Byte-exact state of the five store keys."""
    return {key: client.dump(key) for key in rd.keys.store_keys}


# -- the life of a call ----------------------------------------------------------------------------


def test_life_of_a_call_park_claim_confirm_start_ack(rd: RedisDelay, client: redis.Redis) -> None:
    store = rd.store
    meta = {"t": "tasks.charge", "m": 3, "r": 30_000, "q": 40_000}
    before = redis_ms(client)
    due = store.park("call-1", ENVELOPE, meta, countdown_ms=0)
    assert before <= due <= redis_ms(client)
    parked = entry(rd, "call-1")
    assert (parked.state, parked.envelope) == ("delayed", ENVELOPE)
    assert parked.meta == {**meta, "d": 0, "s": "delayed"}

    assert store.claim(10, LONG_MS) == [Claimed("call-1", ENVELOPE, 1)]
    claimed = entry(rd, "call-1")
    assert (claimed.state, claimed.meta["s"], claimed.meta["d"]) == ("inflight", "claimed", 1)
    assert claimed.score_ms >= due + LONG_MS
    assert store.claim(10, LONG_MS) == [], "a claimed call must not be claimed twice"

    now = redis_ms(client)
    assert store.confirm(["call-1"], 1) == 1
    queued = entry(rd, "call-1")
    assert queued.meta["s"] == "queued"
    assert now + 40_000 <= queued.score_ms <= redis_ms(client) + 40_000, "the call's own queue timeout (q) wins"

    now = redis_ms(client)
    assert store.start("call-1", 1) == 1
    running = entry(rd, "call-1")
    assert running.meta["s"] == "running"
    assert now + 30_000 <= running.score_ms <= redis_ms(client) + 30_000, "the call's own run timeout (r) wins"

    assert store.ack("call-1") is True
    assert rd.find("call-1") is None
    assert not client.hexists(rd.keys.payloads, "call-1")
    assert not client.hexists(rd.keys.meta, "call-1")
    assert rd.stats() == {
        "delayed": 0,
        "inflight": 0,
        "dead": 0,
        "due": 0,
        "inflight_expired": 0,
        "batch_groups": 0,
        "batch_items": 0,
        "limited": 0,
        "paused": 0,
    }
    assert store.ack("call-1") is False, "a second ack finds nothing"


def test_confirm_and_start_use_the_default_timeouts_without_meta(rd: RedisDelay, client: redis.Redis) -> None:
    rd.store.park("plain", ENVELOPE, {}, countdown_ms=0)
    claim_one(rd)
    now = redis_ms(client)
    assert rd.store.confirm(["plain"], 7_000) == 1
    assert now + 7_000 <= entry(rd, "plain").score_ms <= redis_ms(client) + 7_000
    now = redis_ms(client)
    assert rd.store.start("plain", 9_000) == 1
    assert now + 9_000 <= entry(rd, "plain").score_ms <= redis_ms(client) + 9_000


def test_confirm_after_start_keeps_the_run_deadline(rd: RedisDelay) -> None:
    """A worker may start the call before the releaser confirms it; the late confirm must not win."""
    rd.store.park("fast", ENVELOPE, {"r": 30_000, "q": 1}, countdown_ms=0)
    claim_one(rd)
    assert rd.store.start("fast", 1) == 1
    running = entry(rd, "fast")
    assert rd.store.confirm(["fast"], 1) == 0
    after = entry(rd, "fast")
    assert (after.meta["s"], after.score_ms) == ("running", running.score_ms)


def test_start_and_touch_of_unknown_calls(rd: RedisDelay) -> None:
    assert rd.store.start("never-parked", 1_000) == 0
    assert rd.store.touch("never-parked", 1_000) is False
    rd.store.park("waiting", ENVELOPE, {}, countdown_ms=LONG_MS)
    assert rd.store.touch("waiting", 1_000) is False, "touch is for calls in flight only"
    assert rd.store.start("waiting", 1_000) == 0, "a call still delayed is not started"
    assert entry(rd, "waiting").state == "delayed"


def test_touch_extends_the_deadline(rd: RedisDelay, client: redis.Redis) -> None:
    rd.store.park("long-run", ENVELOPE, {"r": SHORT_MS, "q": SHORT_MS, "m": 3}, countdown_ms=0)
    claim_one(rd)
    assert rd.store.start("long-run", SHORT_MS) == 1
    first_deadline = entry(rd, "long-run").score_ms
    now = redis_ms(client)
    assert rd.store.touch("long-run", LONG_MS) is True
    touched = entry(rd, "long-run")
    assert now + LONG_MS <= touched.score_ms <= redis_ms(client) + LONG_MS
    wait_for(lambda: redis_ms(client) > first_deadline + 5, WAIT, "the first deadline to pass")
    assert rd.store.sweep(100, 3) == (0, 0)
    assert entry(rd, "long-run").state == "inflight"
    assert rd.stats()["inflight_expired"] == 0


# -- the sweep -------------------------------------------------------------------------------------


def test_sweep_ignores_calls_before_their_deadline(rd: RedisDelay) -> None:
    rd.store.park("patient", ENVELOPE, {"m": 1}, countdown_ms=0)
    claim_one(rd, LONG_MS)
    assert rd.store.sweep(100, 1) == (0, 0)
    assert entry(rd, "patient").state == "inflight"


def test_sweep_puts_back_calls_past_every_kind_of_deadline_then_dead_letters(
    rd: RedisDelay, client: redis.Redis
) -> None:
    """Claim deadline, queue deadline, run deadline: each one missed brings the call back, the third
    missed delivery (m=3) dead-letters it with the reason in meta['why']."""
    store = rd.store
    store.park("lost", ENVELOPE, {"r": SHORT_MS, "q": SHORT_MS, "m": 3}, countdown_ms=0)

    # 1st delivery: the releaser claims it and dies before publishing.
    assert claim_one(rd, SHORT_MS).deliveries == 1
    sweep_until(rd, (1, 0), max_deliveries=10)
    swept = entry(rd, "lost")
    assert (swept.state, swept.meta["s"], swept.meta["d"]) == ("delayed", "swept", 1)
    assert swept.score_ms <= redis_ms(client), "a swept call is due at once"
    assert swept.envelope == ENVELOPE

    # 2nd delivery: published, but no worker ever takes it from the broker queue.
    assert claim_one(rd, LONG_MS).deliveries == 2
    assert store.confirm(["lost"], LONG_MS) == 1
    sweep_until(rd, (1, 0), max_deliveries=10)
    assert entry(rd, "lost").meta["d"] == 2

    # 3rd delivery: a worker starts it and dies.
    assert claim_one(rd, LONG_MS).deliveries == 3
    store.confirm(["lost"], LONG_MS)
    assert store.start("lost", LONG_MS) == 1
    sweep_until(rd, (0, 1), max_deliveries=10)
    dead = entry(rd, "lost")
    assert dead.state == "dead"
    assert dead.meta["s"] == "dead"
    assert dead.meta["why"] == "not acknowledged after 3 deliveries (last seen running)"
    assert dead.envelope == ENVELOPE, "a dead-lettered call keeps its payload for requeue"
    assert [e.id for e in rd.dead_letters()] == ["lost"]
    assert store.claim(10, LONG_MS) == []


def test_sweep_uses_the_default_max_deliveries_when_the_call_has_none(rd: RedisDelay) -> None:
    rd.store.park("default-limit", ENVELOPE, {}, countdown_ms=0)
    claim_one(rd, 1)
    sweep_until(rd, (0, 1), max_deliveries=1)
    assert entry(rd, "default-limit").meta["why"] == "not acknowledged after 1 deliveries (last seen claimed)"


def test_max_deliveries_zero_means_no_limit(rd: RedisDelay) -> None:
    rd.store.park("forever", ENVELOPE, {"m": 0}, countdown_ms=0)
    for delivery in range(1, 4):
        assert claim_one(rd, 1).deliveries == delivery
        sweep_until(rd, (1, 0), max_deliveries=1)
    assert entry(rd, "forever").state == "delayed"


def test_sweep_dead_letters_an_inflight_call_whose_payload_vanished(rd: RedisDelay, client: redis.Redis) -> None:
    rd.store.park("vanished", ENVELOPE, {"m": 5}, countdown_ms=0)
    claim_one(rd, 1)
    client.hdel(rd.keys.payloads, "vanished")
    sweep_until(rd, (0, 1))
    assert entry(rd, "vanished").meta["why"] == "payload missing at sweep"


def test_ack_of_a_swept_call_removes_the_pending_redelivery(rd: RedisDelay) -> None:
    rd.store.park("late", ENVELOPE, {"m": 3}, countdown_ms=0)
    claim_one(rd, 1)
    sweep_until(rd, (1, 0))
    assert entry(rd, "late").state == "delayed"
    assert rd.store.ack("late") is True, "the late delivery finished: the redelivery is not needed"
    assert rd.find("late") is None
    assert rd.store.claim(10, LONG_MS) == []
    assert rd.stats()["delayed"] == 0


def test_ack_does_not_drop_a_parked_call_that_was_never_delivered(rd: RedisDelay) -> None:
    rd.store.park("parked", ENVELOPE, {}, countdown_ms=0)
    assert rd.store.ack("parked") is False
    assert entry(rd, "parked").state == "delayed"


def test_start_of_a_swept_call_takes_it_back(rd: RedisDelay, client: redis.Redis) -> None:
    rd.store.park("slow-queue", ENVELOPE, {"r": 20_000, "m": 3}, countdown_ms=0)
    claim_one(rd, 1)
    sweep_until(rd, (1, 0))
    now = redis_ms(client)
    assert rd.store.start("slow-queue", 1) == 2
    running = entry(rd, "slow-queue")
    assert (running.state, running.meta["s"], running.meta["d"]) == ("inflight", "running", 1)
    assert now + 20_000 <= running.score_ms <= redis_ms(client) + 20_000
    assert score(client, rd.keys.delayed, "slow-queue") is None
    assert rd.store.claim(10, LONG_MS) == [], "the running call must not be delivered a second time"


def test_unclaim_gives_calls_back_without_counting_the_delivery(rd: RedisDelay, client: redis.Redis) -> None:
    store = rd.store
    store.park("a", ENVELOPE, {"m": 1}, countdown_ms=0)
    store.park("b", ENVELOPE, {"m": 1}, countdown_ms=0)
    store.park("published", ENVELOPE, {"m": 1}, countdown_ms=0)
    assert sorted(call.id for call in store.claim(10, LONG_MS)) == ["a", "b", "published"]
    assert store.confirm(["published"], LONG_MS) == 1
    before = redis_ms(client)
    assert store.unclaim(["a", "b", "published", "unknown"]) == 2, "only claimed calls go back"
    for call_id in ("a", "b"):
        back = entry(rd, call_id)
        assert (back.state, back.meta["s"], back.meta["d"]) == ("delayed", "delayed", 0)
        assert before <= back.score_ms <= redis_ms(client)
    assert entry(rd, "published").meta["s"] == "queued"
    assert store.unclaim([]) == 0
    # Given back twice without a delivery: still the first delivery, so m=1 is not exhausted.
    assert sorted((c.id, c.deliveries) for c in store.claim(10, LONG_MS)) == [("a", 1), ("b", 1)]


def test_a_claim_that_ran_out_leaves_the_next_claim_alone(rd: RedisDelay) -> None:
    """A releaser whose claim ran out (the sweep put the call back, another releaser claimed it again) confirms or gives
    back only its own claim: confirming the other's would say a publish that may still fail went out (the call would
    then wait its queue timeout); giving it back would let a third releaser publish what the second is publishing."""
    store = rd.store
    store.park("call", ENVELOPE, {}, countdown_ms=0)
    first = claim_one(rd, claim_timeout_ms=SHORT_MS)
    sweep_until(rd, (1, 0))
    second = claim_one(rd)
    assert (first.deliveries, second.deliveries) == (1, 2)
    assert store.confirm([first], LONG_MS) == 0
    assert store.unclaim([first]) == 0
    assert (entry(rd, "call").meta["s"], entry(rd, "call").meta["d"]) == ("claimed", 2)
    assert store.confirm([second], LONG_MS) == 1
    assert entry(rd, "call").meta["s"] == "queued"


# -- dead letters: requeue and cancel --------------------------------------------------------------


def bury_by_sweep(rd: RedisDelay, call_id: str) -> None:
    rd.store.park(call_id, ENVELOPE, {"m": 1, "t": "tasks.x"}, countdown_ms=0)
    claim_one(rd, 1)
    sweep_until(rd, (0, 1))
    assert entry(rd, call_id).state == "dead"


def test_requeue_brings_a_dead_call_back_with_deliveries_reset(rd: RedisDelay, client: redis.Redis) -> None:
    bury_by_sweep(rd, "revived")
    before = redis_ms(client)
    assert rd.requeue("revived") is True
    back = entry(rd, "revived")
    assert back.state == "delayed"
    assert back.meta == {"m": 1, "t": "tasks.x", "d": 0, "s": "delayed"}, "no 'why' left, deliveries reset"
    assert before <= back.score_ms <= redis_ms(client)
    assert back.envelope == ENVELOPE
    assert rd.requeue("revived") is False, "not dead-lettered any more"
    assert rd.store.claim(10, LONG_MS) == [Claimed("revived", ENVELOPE, 1)]


def test_requeue_of_unknown_call_is_false(rd: RedisDelay) -> None:
    assert rd.requeue("nobody") is False


def test_requeue_without_payload_raises_and_the_entry_stays_dead(rd: RedisDelay, client: redis.Redis) -> None:
    rd.store.park("hollow", ENVELOPE, {}, countdown_ms=LONG_MS)
    rd.store.bury("hollow", "operator said so")
    client.hdel(rd.keys.payloads, "hollow")
    with pytest.raises(RedisDelayError, match="no payload"):
        rd.requeue("hollow")
    still = entry(rd, "hollow")
    assert (still.state, still.meta["why"], still.meta["s"]) == ("dead", "operator said so", "dead")


def test_cancel_drops_a_parked_call_once(rd: RedisDelay, client: redis.Redis) -> None:
    rd.store.park("unwanted", ENVELOPE, {}, countdown_ms=LONG_MS)
    rd.store.park("kept", ENVELOPE, {}, countdown_ms=LONG_MS)
    assert rd.cancel("unwanted") is True
    assert rd.cancel("unwanted") is False
    assert rd.find("unwanted") is None
    assert not client.hexists(rd.keys.payloads, "unwanted")
    assert not client.hexists(rd.keys.meta, "unwanted")
    assert entry(rd, "kept").state == "delayed"
    assert rd.cancel("never-parked") is False


def test_cancel_does_not_touch_an_inflight_call(rd: RedisDelay) -> None:
    rd.store.park("busy", ENVELOPE, {}, countdown_ms=0)
    claim_one(rd)
    assert rd.cancel("busy") is False
    busy = entry(rd, "busy")
    assert (busy.state, busy.envelope) == ("inflight", ENVELOPE)


def test_park_replaces_an_earlier_call_with_the_same_id(rd: RedisDelay) -> None:
    bury_by_sweep(rd, "retried")
    rd.store.park("retried", b"second", {"m": 4}, countdown_ms=LONG_MS)
    again = entry(rd, "retried")
    assert (again.state, again.envelope, again.meta) == ("delayed", b"second", {"m": 4, "d": 0, "s": "delayed"})
    assert rd.stats()["dead"] == 0


# -- bad data --------------------------------------------------------------------------------------


@pytest.mark.parametrize("key_name", ["delayed", "inflight", "dead", "payloads", "meta"])
def test_wrong_key_type_refuses_park_and_writes_nothing(rd: RedisDelay, client: redis.Redis, key_name: str) -> None:
    rd.store.park("existing", ENVELOPE, {"m": 1}, countdown_ms=LONG_MS)
    key = getattr(rd.keys, key_name)
    client.set(key, "someone else's string")
    before = snapshot(client, rd)
    with pytest.raises(StoreUnavailableError, match="WRONGTYPE") as raised:
        rd.store.park("new", ENVELOPE, {"m": 1}, countdown_ms=0)
    assert key in str(raised.value)
    assert snapshot(client, rd) == before, "a refused park must not write anything"
    with pytest.raises(StoreUnavailableError, match="WRONGTYPE"):
        rd.store.claim(10, LONG_MS)
    with pytest.raises(StoreUnavailableError, match="WRONGTYPE"):
        rd.store.sweep(10, 1)
    assert snapshot(client, rd) == before


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b"[1, 2]", id="array"),
        pytest.param(b"null", id="null"),
        pytest.param(b'"text"', id="string"),
        pytest.param(b'{"d": "many", "m": "some", "r": [], "q": {}}', id="wrong-types"),
        pytest.param(b"[" * 2000, id="too-deep"),
        pytest.param(b'{"d": 1e400}', id="number-out-of-range"),
    ],
)
def test_corrupt_meta_does_not_break_claim_or_sweep(rd: RedisDelay, client: redis.Redis, corrupt: bytes) -> None:
    now = redis_ms(client)
    for offset, call_id in enumerate(["first", "corrupt", "last"]):
        rd.store.park(call_id, ENVELOPE, {"m": 5}, due_ms=now - 3 + offset)
    client.hset(rd.keys.meta, "corrupt", corrupt)
    claimed = rd.store.claim(10, 1)
    assert [(c.id, c.deliveries) for c in claimed] == [("first", 1), ("corrupt", 1), ("last", 1)]
    sweep_until(rd, (3, 0), max_deliveries=5)
    for call_id in ("first", "corrupt", "last"):
        back = entry(rd, call_id)
        assert (back.state, back.meta["s"], back.meta["d"]) == ("delayed", "swept", 1)
        assert json.loads(client.hget(rd.keys.meta, call_id) or b"")["s"] == "swept"


def test_claim_dead_letters_a_due_member_without_payload(rd: RedisDelay, client: redis.Redis) -> None:
    now = redis_ms(client)
    rd.store.park("good-1", ENVELOPE, {}, due_ms=now - 3)
    client.zadd(rd.keys.delayed, {"ghost": now - 2})
    rd.store.park("good-2", b"other", {}, due_ms=now - 1)
    claimed = rd.store.claim(10, LONG_MS)
    assert claimed == [Claimed("good-1", ENVELOPE, 1), Claimed("good-2", b"other", 1)]
    ghost = entry(rd, "ghost")
    assert ghost.state == "dead"
    assert "payload missing" in ghost.meta["why"]
    assert ghost.envelope is None


def test_identical_calls_parked_twice_stay_two_entries(rd: RedisDelay, client: redis.Redis) -> None:
    @rd.delayed
    def charge(order_id: int) -> int:
        return order_id

    first = charge.apply_async((42,), countdown=30)
    second = charge.apply_async((42,), countdown=30)
    assert first.id != second.id
    assert rd.stats()["delayed"] == 2
    for result in (first, second):
        parked = entry(rd, result.id)
        assert parked.envelope is not None and result.id.encode() in parked.envelope
    assert client.hlen(rd.keys.payloads) == 2


def test_countdown_is_measured_by_the_redis_clock(rd: RedisDelay, client: redis.Redis) -> None:
    @rd.delayed
    def later() -> None:
        return None

    before = redis_ms(client)
    direct = rd.store.park("direct", ENVELOPE, {}, countdown_ms=45_000)
    result = later.apply_async(countdown=30)
    after = redis_ms(client)
    assert before + 45_000 <= direct <= after + 45_000
    assert score(client, rd.keys.delayed, "direct") == direct
    parked = score(client, rd.keys.delayed, result.id)
    assert parked is not None
    assert before + 30_000 <= parked <= after + 30_000
    at = rd.store.park("at", ENVELOPE, {}, due_ms=1_234_567)
    assert at == 1_234_567 == score(client, rd.keys.delayed, "at")


def test_park_needs_a_due_time(rd: RedisDelay) -> None:
    with pytest.raises(ValueError, match="countdown_ms or due_ms"):
        rd.store.park("x", ENVELOPE, {})
    assert rd.find("x") is None


def test_stats_counts_every_state(rd: RedisDelay, client: redis.Redis) -> None:
    assert rd.stats() == {
        "delayed": 0,
        "inflight": 0,
        "dead": 0,
        "due": 0,
        "inflight_expired": 0,
        "batch_groups": 0,
        "batch_items": 0,
        "limited": 0,
        "paused": 0,
    }
    now = redis_ms(client)
    store = rd.store
    store.park("running", ENVELOPE, {}, due_ms=now - 4_000)
    store.park("expiring", ENVELOPE, {}, due_ms=now - 3_000)
    store.park("buried", ENVELOPE, {}, due_ms=now + LONG_MS)
    store.park("due-1", ENVELOPE, {}, due_ms=now - 2_000)
    store.park("due-2", ENVELOPE, {}, due_ms=now - 1_000)
    store.park("future", ENVELOPE, {}, due_ms=now + LONG_MS)
    assert rd.stats() == {
        "delayed": 6,
        "inflight": 0,
        "dead": 0,
        "due": 4,
        "inflight_expired": 0,
        "batch_groups": 0,
        "batch_items": 0,
        "limited": 0,
        "paused": 0,
    }
    assert [c.id for c in store.claim(1, LONG_MS)] == ["running"]
    assert [c.id for c in store.claim(1, 1)] == ["expiring"]
    store.bury("buried", "test")
    wait_for(lambda: rd.stats()["inflight_expired"] == 1, WAIT, "'expiring' to be past its deadline")
    assert rd.stats() == {
        "delayed": 3,
        "inflight": 2,
        "dead": 1,
        "due": 2,
        "inflight_expired": 1,
        "batch_groups": 0,
        "batch_items": 0,
        "limited": 0,
        "paused": 0,
    }
    assert [e.id for e in store.entries("delayed")] == ["due-1", "due-2", "future"]
    assert [e.id for e in store.entries("inflight")] == ["expiring", "running"]
