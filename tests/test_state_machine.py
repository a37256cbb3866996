"""A stateful property test of the call store: random sequences of every store operation against a real
redis-server, checked step by step against a small Python model of the life of a call.

The machine drives ``rd.store`` (one Lua script per operation) directly, plus ``apply_async`` of a real
delayed task for calls that carry a fast-path broker message. After every step one consistent snapshot
of the store's keys is compared with the model: which set holds each id (or none: acknowledged,
cancelled), payloads and metadata, the unique-key index, delivery counts, batch items, locks and their
waiters, and the due times and deadlines.

Time is kept out of the way: a due time or deadline is either "soon" (now, or 1 ms away, and the check
waits by the Redis clock until it has passed) or "far" (10**9 ms away), and each step runs in a later
millisecond than the one before, so the outcome of every step (even which of several due calls a limited
claim takes) is determined by the steps alone.

Rules choose ids mostly among calls in the state they act on, sometimes any id of the pool (parked or
not, acknowledged, cancelled, or never seen). A failure is reported with its whole sequence of steps;
set REDISDELAY_SHRINK=1 to have Hypothesis shrink it first (minutes).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar
from unittest import mock

import pytest
import redis
from celery import Celery
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from celery_redisdelay import DelayedTask, RedisDelay
from celery_redisdelay.producer.batch import BatchedTask
from celery_redisdelay.store.calls import CONFLICT, KEPT, STORED, Claimed
from celery_redisdelay.store.keys import group_id

MakeApp = Callable[..., tuple[Celery, RedisDelay]]

SOON = 1  # ms: a deadline that has passed by the next check (which waits for it by the Redis clock)
FAR = 10**9  # ms (11 days): a due time or deadline that never passes during the test
LATER = 600_000  # ms: every "far" due time or deadline is at least this far away (a task's defaults: hours)
PARK_IDS = ("c0", "c1", "c2", "c3", "c4")
UNKNOWN = "nobody"  # never parked: every operation on it finds nothing
LOCKS = ("L1", "L2")
GROUPS = ("a", "b")
BATCH_SIZE = 3
LIVE = ("delayed", "inflight", "dead")
WAIT = 5.0

# Shrinking a failure can take minutes (more than the suite's per-test timeout): it is off unless
# REDISDELAY_SHRINK=1 is set, so a failure is reported at once with its whole sequence of steps.
SHRINK = os.environ.get("REDISDELAY_SHRINK") == "1"
MACHINE_SETTINGS = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    database=None,
    phases=list(Phase) if SHRINK else [phase for phase in Phase if phase is not Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class Call:
    """The model of one stored call (one incarnation of an id)."""

    state: str  # delayed | inflight | dead | done (acknowledged) | cancelled
    s: str  # the metadata's state field
    d: int  # deliveries
    payload: bytes
    meta_base: dict[str, Any]  # the limits stored at park: t, m, r, q, l
    key: str | None = None  # meta "k"
    w: int = 0  # deferrals behind a busy lock
    soon: bool = True  # delayed: due at once; inflight: deadline passes at once
    fast: bool = False  # payload is a broker message of the fast path
    items: tuple[int, ...] = ()  # a batch call's items
    why: bool = False
    x: bool = False  # meta "x": the hard end of a run under the task's own timeout (its value is the clock's)
    started: bool = False  # meta "st": when its last run started (the clock's), until it is requeued or parked again

    @property
    def live(self) -> bool:
        return self.state in LIVE

    def expected_meta(self) -> dict[str, Any]:
        meta = {**self.meta_base, "d": self.d, "s": self.s}
        if self.key is not None:
            meta["k"] = self.key
        if self.w:
            meta["w"] = self.w
        return meta


def is_delayed(call: Call) -> bool:
    return call.state == "delayed"


def is_inflight(call: Call) -> bool:
    return call.state == "inflight"


def is_claimed(call: Call) -> bool:
    return call.state == "inflight" and call.s == "claimed"


def is_delivered(call: Call) -> bool:
    """In flight, or put back by the sweep while its late delivery may still start or finish."""
    return call.state == "inflight" or call.s == "swept"


def is_dead(call: Call) -> bool:
    return call.state == "dead"


@dataclass
class Snapshot:
    """The store's keys, read in one MULTI."""

    now: int
    sets: dict[str, dict[str, float]]
    payloads: dict[str, bytes]
    meta: dict[str, dict[str, Any]]
    index: dict[str, str]
    batches: dict[str, float]
    counters: dict[str, int]
    group_items: dict[str, list[bytes]]
    locks: dict[str, tuple[str | None, int]]
    waiters: dict[str, dict[str, float]]
    wake: int


@dataclass
class Env:
    rd: RedisDelay
    echo: DelayedTask
    bundle: BatchedTask
    queue: str
    lists: list[str] = field(default_factory=list)


class StoreMachine(RuleBasedStateMachine):
    env: ClassVar[Env]  # set on a subclass by the test

    def __init__(self) -> None:
        super().__init__()
        env = self.env
        self.rd = env.rd
        self.store = env.rd.store
        self.keys = env.rd.keys
        self.client: redis.Redis = env.rd.client
        self.reset_redis()
        self.calls: dict[str, Call] = {}
        self.incarnation: dict[str, int] = {}
        self.index: dict[str, str] = {}
        self.more_ids: list[str] = []
        self.groups: dict[str, list[int]] = {group: [] for group in GROUPS}
        self.group_due: dict[str, bool | None] = dict.fromkeys(GROUPS)
        self.items_added = 0
        self.items_gone: set[int] = set()
        self.holders: dict[str, str | None] = dict.fromkeys(LOCKS)
        self.tokens: dict[str, list[str]] = {name: [] for name in LOCKS}
        self.waiters: dict[str, dict[str, float]] = {name: {} for name in LOCKS}
        self.lock_deferrals = 0
        self.lock_takeovers = 0
        self.counter = 0
        self.checks = 0
        self.seen_d: dict[str, tuple[int, int]] = {}
        self.may_decrease: set[str] = set()

    # -- helpers ---------------------------------------------------------------------------------

    def reset_redis(self) -> None:
        doomed = [*self.client.scan_iter(match=f"{{{self.keys.prefix}}}*", count=1000), *self.env.lists]
        if doomed:
            self.client.delete(*doomed)

    def teardown(self) -> None:
        self.reset_redis()

    def fresh(self, what: str) -> str:
        self.counter += 1
        return f"{what}{self.counter}"

    def redis_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def op_ids(self) -> list[str]:
        return [*PARK_IDS, UNKNOWN, *self.more_ids]

    def draw_id(self, data: st.DataObject, wanted: Callable[[Call], bool] = lambda call: True) -> str:
        """Mostly an id whose call is ``wanted`` (in the state the rule acts on), else any id, known or not."""
        ids = self.op_ids()
        fitting = [call_id for call_id in ids if (call := self.live(call_id)) is not None and wanted(call)]
        if fitting and data.draw(st.integers(0, 3), label="targeted") > 0:
            return data.draw(st.sampled_from(fitting), label="id")
        return data.draw(st.sampled_from(ids), label="id")

    def any_call(self, wanted: Callable[[Call], bool]) -> bool:
        return any(call.live and wanted(call) for call in self.calls.values())

    def draw_ids(self, data: st.DataObject, wanted: Callable[[Call], bool]) -> list[str]:
        return [self.draw_id(data, wanted) for _ in range(data.draw(st.integers(1, 3), label="how many"))]

    def live(self, call_id: str) -> Call | None:
        call = self.calls.get(call_id)
        return call if call is not None and call.live else None

    def in_state(self, call_id: str, state: str) -> Call | None:
        call = self.live(call_id)
        return call if call is not None and call.state == state else None

    def holder(self, key: str) -> str | None:
        holder = self.index.get(key)
        return holder if holder is not None and self.in_state(holder, "delayed") else None

    def free_key(self, call_id: str, call: Call) -> None:
        if call.key is not None and self.index.get(call.key) == call_id:
            del self.index[call.key]

    def new_incarnation(self, call_id: str, call: Call) -> None:
        self.calls[call_id] = call
        self.incarnation[call_id] = self.incarnation.get(call_id, 0) + 1

    def store_call(self, call_id: str, call: Call) -> None:
        """The model of ``store()`` in calls.lua: replaces whatever the id held."""
        old = self.live(call_id)
        if old is not None:
            self.free_key(call_id, old)
            self.retire_items(old)
        self.new_incarnation(call_id, call)

    def retire_items(self, call: Call) -> None:
        self.items_gone.update(call.items)

    def forget(self, call_id: str, call: Call, state: str) -> None:
        self.free_key(call_id, call)
        self.retire_items(call)
        call.state = state

    def bury(self, call_id: str) -> None:
        call = self.live(call_id)
        assert call is not None
        self.free_key(call_id, call)
        call.state, call.s, call.why, call.x = "dead", "dead", True, False

    def ordered(self, state: str, limit: int) -> list[str]:
        """The due (or expired) ids a script takes: lowest score first, ties by member, at most ``limit``."""
        key = self.keys.delayed if state == "delayed" else self.keys.inflight
        members: Any = self.client.zrange(key, 0, -1, withscores=True)
        scores = {text(member): score for member, score in members}
        ready = [call_id for call_id, call in self.calls.items() if call.state == state and call.soon]
        return sorted(ready, key=lambda call_id: (scores[call_id], call_id.encode()))[:limit]

    def deliver(self, call_id: str, call: Call, queued: bool, soon: bool) -> None:
        self.free_key(call_id, call)
        call.d += 1
        call.state, call.s, call.soon = "inflight", "queued" if queued else "claimed", soon

    def timeout_of(self, call: Call, name: str, default: int) -> int:
        value = call.meta_base.get(name)
        return int(value) if value is not None else default

    # -- parking ---------------------------------------------------------------------------------

    @rule(
        call_id=st.sampled_from(PARK_IDS),
        countdown=st.sampled_from([0, FAR]),
        mode=st.sampled_from(["", "", "unique", "debounce"]),
        key=st.sampled_from(["U1", "U2"]),
        m=st.sampled_from([None, 0, 1, 2]),
        r=st.sampled_from([None, SOON, FAR]),
        q=st.sampled_from([None, SOON, FAR]),
    )
    def park(
        self, call_id: str, countdown: int, mode: str, key: str, m: int | None, r: int | None, q: int | None
    ) -> None:
        meta: dict[str, Any] = {"t": "sm.store"}
        for name, value in (("m", m), ("r", r), ("q", q)):
            if value is not None:
                meta[name] = value
        self.counter += 1
        payload = json.dumps({"call": call_id, "version": self.counter}).encode()
        index_key = group_id(self.env.echo.name, key)
        status, _, holder = self.store.park_keyed(
            call_id, payload, meta, countdown_ms=countdown, mode=mode, key=index_key if mode else ""
        )
        current = self.holder(index_key) if mode else None
        if mode == "unique" and current is not None:
            assert (status, holder) == (KEPT, current)
            return
        has_payload = self.live(call_id) is not None
        if mode == "debounce" and current != call_id and (current is not None or has_payload):
            assert (status, holder) == (CONFLICT, current or "")
            return
        assert (status, holder) == (STORED, call_id)
        stored = Call("delayed", "delayed", 0, payload, meta, key=index_key if mode else None, soon=countdown == 0)
        self.store_call(call_id, stored)
        if mode:
            self.index[index_key] = call_id

    @rule(
        call_id=st.sampled_from(PARK_IDS),
        countdown=st.sampled_from([0, 0, FAR]),
        run_s=st.sampled_from([SOON / 1000, FAR / 1000]),
        queue_s=st.sampled_from([SOON / 1000, FAR / 1000]),
        max_deliveries=st.sampled_from([0, 1, 2]),
        unique=st.sampled_from([None, None, "U1"]),
    )
    def park_task(
        self, call_id: str, countdown: int, run_s: float, queue_s: float, max_deliveries: int, unique: str | None
    ) -> None:
        """Park through a real delayed task: the payload is the broker message of the fast path."""
        echo = self.env.echo
        self.counter += 1
        index_key = group_id(echo.name, unique) if unique else None
        current = self.holder(index_key) if index_key else None
        result = echo.apply_async(
            (self.counter,),
            task_id=call_id,
            countdown=countdown / 1000,
            visibility_timeout=run_s,
            queue_timeout=queue_s,
            max_deliveries=max_deliveries,
            unique_key=unique,
        )
        if current is not None:
            assert result.id == current, "a unique key held by a parked call keeps that call"
            return
        assert result.id == call_id
        payload: Any = self.client.hget(self.keys.payloads, call_id)
        assert isinstance(payload, bytes)
        assert payload.startswith(b'{"body": "')
        assert payload.endswith(f'"delivery_tag": "{call_id}.1"}}}}'.encode()), payload[-80:]
        meta = {"t": echo.name, "m": max_deliveries, "r": round(run_s * 1000), "q": round(queue_s * 1000), "o": 1}
        meta["l"] = self.env.queue
        stored = Call("delayed", "delayed", 0, payload, meta, key=index_key, soon=countdown == 0, fast=True)
        self.store_call(call_id, stored)
        if index_key is not None:
            self.index[index_key] = call_id

    @rule(
        count=st.integers(1, 3),
        countdown=st.sampled_from([0, 0, FAR]),
        run_s=st.sampled_from([SOON / 1000, FAR / 1000]),
        queue_s=st.sampled_from([SOON / 1000, FAR / 1000]),
        max_deliveries=st.sampled_from([0, 1, 2]),
    )
    def park_many(self, count: int, countdown: int, run_s: float, queue_s: float, max_deliveries: int) -> None:
        """``task.park_many``: fresh ids, every message rendered for the fast path from the first one's."""
        echo = self.env.echo
        calls = [(self.counter + n,) for n in range(count)]
        # Ids in the order they are minted (not random): ties between equal due times sort by id.
        shards = echo.redisdelay.shards
        with (
            mock.patch.object(shards, "new_id", side_effect=lambda store=None: self.fresh("many")),
            mock.patch.object(
                shards, "new_ids", side_effect=lambda count, store=None: [self.fresh("many") for _ in range(count)]
            ),
        ):
            results = echo.park_many(
                calls,
                countdown=countdown / 1000,
                visibility_timeout=run_s,
                queue_timeout=queue_s,
                max_deliveries=max_deliveries,
            )
        meta = {"t": echo.name, "m": max_deliveries, "r": round(run_s * 1000), "q": round(queue_s * 1000), "o": 1}
        meta["l"] = self.env.queue
        assert len({result.id for result in results}) == count
        for result in results:
            payload: Any = self.client.hget(self.keys.payloads, result.id)
            assert isinstance(payload, bytes)
            assert payload.endswith(f'"delivery_tag": "{result.id}.1"}}}}'.encode()), payload[-80:]
            assert result.id not in self.calls, "park_many mints fresh ids"
            self.store_call(
                result.id, Call("delayed", "delayed", 0, payload, dict(meta), soon=countdown == 0, fast=True)
            )
            self.more_ids.append(result.id)

    @precondition(lambda self: self.any_call(is_delayed))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        call_id = self.draw_id(data, is_delayed)
        call = self.in_state(call_id, "delayed")
        dropped = self.store.cancel(call_id)
        # A call cancelled before is remembered, recorded revoked (its caller said so), with nothing to record.
        fresh = dropped if dropped is not None and dropped.record else None
        assert (fresh is not None) is (call is not None)
        if call is not None:
            assert dropped == (call_id, call.payload, True), "cancel returns what the call held"
            self.store.cancel_done([call_id])
            self.forget(call_id, call, "cancelled")
        elif dropped is not None:
            assert dropped == (call_id, b"", False) and self.calls[call_id].state == "cancelled"

    @precondition(lambda self: self.any_call(is_delayed))
    @rule(data=st.data(), countdown=st.sampled_from([0, FAR]))
    def reschedule(self, data: st.DataObject, countdown: int) -> None:
        call_id = self.draw_id(data, is_delayed)
        call = self.in_state(call_id, "delayed")
        due = self.store.reschedule(call_id, countdown_ms=countdown)
        assert (due is not None) is (call is not None)
        if call is not None:
            call.soon = countdown == 0
            if call.s == "deferred":
                call.s = "delayed"  # moved by hand: it no longer waits for its lock

    # -- releasing -------------------------------------------------------------------------------

    @rule(limit=st.sampled_from([1, 2, 50]), claim_ms=st.sampled_from([SOON, FAR]))
    def claim(self, limit: int, claim_ms: int) -> None:
        taken = self.ordered("delayed", limit)
        claimed = self.store.claim(limit, claim_ms)
        expected = []
        for call_id in taken:
            call = self.calls[call_id]
            self.deliver(call_id, call, queued=False, soon=claim_ms == SOON)
            expected.append(Claimed(call_id, call.payload, call.d))
        assert claimed == expected

    @rule(
        limit=st.sampled_from([1, 2, 50]),
        claim_ms=st.sampled_from([SOON, FAR]),
        queue_ms=st.sampled_from([SOON, FAR]),
        to_lists=st.sampled_from([True, True, False]),
    )
    def release(self, limit: int, claim_ms: int, queue_ms: int, to_lists: bool) -> None:
        """The fast path: calls parked through the task are pushed onto the queue list, others claimed
        (all of them when the script is given no list it may push to)."""
        taken = self.ordered("delayed", limit)
        lists = self.env.lists if to_lists else []
        claimed, examined, pushed, *_ = self.store.release(limit, claim_ms, queue_ms, lists)
        expected_claimed, expected_tags, first_messages = [], [], []
        for call_id in taken:
            call = self.calls[call_id]
            if call.fast and to_lists:
                self.deliver(call_id, call, queued=True, soon=self.timeout_of(call, "q", queue_ms) == SOON)
                expected_tags.append(f"{call_id}.{call.d}")
                if call.d == 1:
                    first_messages.append(call.payload)
            else:
                self.deliver(call_id, call, queued=False, soon=claim_ms == SOON)
                expected_claimed.append(Claimed(call_id, call.payload, call.d))
        assert (examined, pushed) == (len(taken), len(expected_tags))
        assert claimed == expected_claimed
        messages = [raw for key in self.env.lists for raw in self.client.lrange(key, 0, -1)]
        if self.env.lists:
            self.client.delete(*self.env.lists)
        tags = sorted(json.loads(raw)["properties"]["delivery_tag"] for raw in messages)
        assert tags == sorted(expected_tags), "each pushed message carries the tag of its own delivery"
        for message in first_messages:
            assert message in messages, "a first delivery is pushed exactly as stored"

    @precondition(lambda self: self.any_call(is_claimed))
    @rule(data=st.data(), default_q=st.sampled_from([SOON, FAR]))
    def confirm(self, data: st.DataObject, default_q: int) -> None:
        ids = self.draw_ids(data, is_claimed)
        confirmed = 0
        for call_id in ids:
            call = self.in_state(call_id, "inflight")
            if call is not None and call.s == "claimed":
                call.s, call.soon = "queued", self.timeout_of(call, "q", default_q) == SOON
                confirmed += 1
        assert self.store.confirm(ids, default_q) == confirmed

    @precondition(lambda self: self.any_call(is_claimed))
    @rule(data=st.data())
    def unclaim(self, data: st.DataObject) -> None:
        ids = self.draw_ids(data, is_claimed)
        returned = 0
        for call_id in ids:
            call = self.in_state(call_id, "inflight")
            if call is not None and call.s == "claimed":
                call.state, call.s, call.soon, call.d = "delayed", "delayed", True, max(call.d - 1, 0)
                if call.key is not None:
                    self.index.setdefault(call.key, call_id)
                self.may_decrease.add(call_id)
                returned += 1
        assert self.store.unclaim(ids) == returned

    # -- the worker side -------------------------------------------------------------------------

    @precondition(lambda self: self.any_call(is_delivered))
    @rule(data=st.data(), default_r=st.sampled_from([SOON, FAR]))
    def start(self, data: st.DataObject, default_r: int) -> None:
        call_id = self.draw_id(data, is_delivered)
        call = self.live(call_id)
        status = 0
        if call is not None and call.state == "inflight":
            status = 1
        elif call is not None and call.state == "delayed" and call.s == "swept":
            status = 2
        assert self.store.start(call_id, default_r) == status
        if call is not None and status:
            call.state, call.s, call.soon = "inflight", "running", self.timeout_of(call, "r", default_r) == SOON
            call.x, call.started = "o" in call.meta_base, True

    @precondition(lambda self: self.any_call(is_inflight))
    @rule(data=st.data(), timeout=st.sampled_from([SOON, FAR]))
    def touch(self, data: st.DataObject, timeout: int) -> None:
        call_id = self.draw_id(data, is_inflight)
        call = self.in_state(call_id, "inflight")
        assert self.store.touch(call_id, timeout) is (call is not None)
        if call is not None:
            call.soon = timeout == SOON

    @precondition(lambda self: self.any_call(is_delivered))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        call_id = self.draw_id(data, is_delivered)
        call = self.live(call_id)
        done = call is not None and (call.state == "inflight" or (call.state == "delayed" and call.s == "swept"))
        assert self.store.ack(call_id) is done
        if call is not None and done:
            self.forget(call_id, call, "done")

    # -- sweep, dead letters ---------------------------------------------------------------------

    @precondition(lambda self: self.any_call(is_inflight))
    @rule(limit=st.sampled_from([1, 50]), default_m=st.sampled_from([0, 1, 3]))
    def sweep(self, limit: int, default_m: int) -> None:
        requeued = buried = 0
        for call_id in self.ordered("inflight", limit):
            call = self.calls[call_id]
            most = self.timeout_of(call, "m", default_m)
            if most > 0 and call.d >= most:
                self.bury(call_id)
                buried += 1
            else:
                call.state, call.s, call.soon, call.x = "delayed", "swept", True, False
                requeued += 1
        assert self.store.sweep(limit, default_m) == (requeued, buried)

    @rule(data=st.data(), only_inflight=st.booleans())
    def bury_call(self, data: st.DataObject, only_inflight: bool) -> None:
        """Dead-letter a call (without ``only_inflight``, one the store holds; an id it does not hold is
        left alone, see the test below)."""
        held = [call_id for call_id in self.op_ids() if self.live(call_id) is not None]
        if only_inflight or not held:
            only_inflight, call_id = True, self.draw_id(data, is_inflight)
        else:
            call_id = data.draw(st.sampled_from(held), label="id")
        expected = not only_inflight or self.in_state(call_id, "inflight") is not None
        assert self.store.bury(call_id, "buried by the state machine", only_inflight=only_inflight) is expected
        if expected:
            self.bury(call_id)

    @precondition(lambda self: self.any_call(is_dead))
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        call_id = self.draw_id(data, is_dead)
        call = self.in_state(call_id, "dead")
        assert self.store.requeue(call_id) == (0 if call is None else 1)
        if call is not None:
            call.state, call.s, call.d, call.why, call.soon = "delayed", "delayed", 0, False, True
            call.started = False
            self.may_decrease.add(call_id)

    # -- batches ---------------------------------------------------------------------------------

    def flushed(self, group: str, call_id: str, items: list[int]) -> None:
        bundle = self.env.bundle
        name = group_id(bundle.name, group)
        payload = f'{{"redisdelay":"batch","group":{name},"items":[{",".join(self.item_json(i) for i in items)}]}}'
        call = Call("delayed", "delayed", 0, payload.encode(), self.batch_meta(), soon=True, items=tuple(items))
        self.store_call(call_id, call)
        self.more_ids.append(call_id)

    @staticmethod
    def item_json(item: int) -> str:
        return json.dumps({"item": item})

    def batch_meta(self) -> dict[str, Any]:
        return {**self.env.bundle.call_limits(), "m": 2}

    @rule(group=st.sampled_from(GROUPS), max_wait=st.sampled_from([0, FAR]))
    def batch_add(self, group: str, max_wait: int) -> None:
        item = self.items_added
        self.items_added += 1
        call_id = self.fresh("batch")
        name = group_id(self.env.bundle.name, group)
        waiting, released = self.store.batch_add(
            name, self.item_json(item), BATCH_SIZE, max_wait, call_id, self.batch_meta()
        )
        pending = self.groups[group]
        pending.append(item)
        if self.group_due[group] is None:
            self.group_due[group] = max_wait == 0
        if len(pending) >= BATCH_SIZE:
            self.flushed(group, call_id, pending[:BATCH_SIZE])
            del pending[:BATCH_SIZE]
            self.group_due[group] = None if not pending else True
            assert (waiting, released) == (len(pending), call_id)
        else:
            assert (waiting, released) == (len(pending), None)

    @precondition(lambda self: any(self.groups.values()))
    @rule(group=st.sampled_from(GROUPS))
    def batch_flush(self, group: str) -> None:
        call_id = self.fresh("batch")
        name = group_id(self.env.bundle.name, group)
        took = self.store.batch_flush(name, BATCH_SIZE, call_id, self.batch_meta())
        pending = self.groups[group]
        if self.group_due[group]:
            items = pending[:BATCH_SIZE]
            del pending[:BATCH_SIZE]
            if items:
                self.flushed(group, call_id, items)
            self.group_due[group] = None if not pending else True
            assert took == len(items)
        else:
            assert took == 0

    # -- locks -----------------------------------------------------------------------------------

    @rule(
        data=st.data(),
        name=st.sampled_from(LOCKS),
        ttl=st.sampled_from([SOON, FAR]),
        with_call=st.booleans(),
        retry=st.sampled_from([SOON, FAR]),
    )
    def lock_take(self, data: st.DataObject, name: str, ttl: int, with_call: bool, retry: int) -> None:
        call_id = self.draw_id(data, is_inflight) if with_call else ""
        token = self.fresh("token")
        self.tokens[name].append(token)
        status, remaining = self.store.lock_take(name, token, ttl, call_id, retry)
        call = self.in_state(call_id, "inflight") if call_id else None
        value = token if call is None else f"{token}|{call.d}|{call_id}"  # a tracked call holds it as itself
        held = self.holders[name]
        _, held_delivery, holder = (held or "").split("|", 2) if (held or "").count("|") >= 2 else ("", "", "")
        gone = bool(holder) and self.gone(holder, held_delivery, call_id)
        if held is None or gone:
            assert (status, remaining) == ((2, 0) if gone else (1, 0))
            self.lock_takeovers += gone
            waiters = self.waiters[name]
            waiters.pop(call_id, None)
            self.holders[name] = value
            if waiters:  # the first in line now polls within the retry interval
                first = self.live(min(waiters, key=lambda waiter: (waiters[waiter], waiter.encode())))
                if first is not None and first.state == "delayed" and first.s == "deferred" and retry == SOON:
                    first.soon = True
            if ttl == SOON:  # wait for the lock to expire: then nobody holds it
                lock = self.keys.lock(name)
                deadline = time.monotonic() + WAIT
                while self.client.exists(lock):
                    assert time.monotonic() < deadline, "a lock taken for 1 ms did not expire"
                    time.sleep(0.0005)
                self.holders[name] = None
            return
        assert remaining > FAR // 2, "the lock held has its long expiry"
        if not call_id or holder == call_id:  # a copy of the holding delivery is not deferred
            assert status == 0
        elif call is None:
            assert status == -1
        else:
            assert status == 0
            call.state, call.s, call.d, call.w = "delayed", "deferred", max(call.d - 1, 0), call.w + 1
            call.x = False
            self.may_decrease.add(call_id)
            self.lock_deferrals += 1
            waiters = self.waiters[name]
            if call_id not in waiters:
                score = self.client.zscore(self.keys.lock_waiters(name), call_id)
                assert score is not None
                waiters[call_id] = score
            # The first in line tries again after the retry interval; the others when the (far) expiry comes.
            first = min(waiters, key=lambda waiter: (waiters[waiter], waiter.encode()))
            call.soon = retry == SOON and first == call_id

    def gone(self, holder: str, delivery: str, asking: str) -> bool:
        """Whether a lock's holding call has lost it: no longer in flight, past its deadline, or asking again in
        a later delivery."""
        call = self.in_state(holder, "inflight")
        return call is None or call.soon or (holder == asking and str(call.d) != delivery)

    @precondition(lambda self: any(self.tokens.values()))
    @rule(name=st.sampled_from(LOCKS), which=st.sampled_from(["holder", "holder", "stale", "random"]))
    def lock_release(self, name: str, which: str) -> None:
        holder = self.holders[name]
        if which == "holder" and holder is not None:
            token = holder.split("|", 1)[0]
        elif which == "stale" and self.tokens[name]:
            token = self.tokens[name][0]
        else:
            token = self.fresh("token")
        released = holder is not None and holder.split("|", 1)[0] == token
        assert self.store.lock_release(name, token) is released
        if not released:
            return
        self.holders[name] = None
        waiters = self.waiters[name]
        for first in sorted(waiters, key=lambda call_id: (waiters[call_id], call_id.encode())):
            call = self.live(first)
            if call is not None and call.state == "delayed" and call.s == "deferred":
                call.soon = True
                break
            if call is not None and call.state == "inflight":
                break
            del waiters[first]  # gone, or no longer waiting for this lock

    # -- the checks ------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        keys = self.keys
        pipe = self.client.pipeline(transaction=True)
        for key in (keys.delayed, keys.inflight, keys.dead):
            pipe.zrange(key, 0, -1, withscores=True)
        pipe.hgetall(keys.payloads)
        pipe.hgetall(keys.meta)
        pipe.hgetall(keys.index)
        pipe.zrange(keys.batches, 0, -1, withscores=True)
        pipe.hgetall(keys.counters)
        for group in GROUPS:
            pipe.lrange(keys.batch_items(group_id(self.env.bundle.name, group)), 0, -1)
        for name in LOCKS:
            pipe.get(keys.lock(name))
            pipe.pttl(keys.lock(name))
            pipe.zrange(keys.lock_waiters(name), 0, -1, withscores=True)
        pipe.zcard(keys.wake)
        pipe.time()
        out: list[Any] = pipe.execute()
        delayed, inflight, dead, payloads, meta, index, batches, counters = out[:8]
        rest = out[8:]
        group_items = {group: rest.pop(0) for group in GROUPS}
        locks: dict[str, tuple[str | None, int]] = {}
        waiters: dict[str, dict[str, float]] = {}
        for name in LOCKS:
            token, ttl, members = rest.pop(0), rest.pop(0), rest.pop(0)
            locks[name] = (None if token is None else text(token), int(ttl))
            waiters[name] = {text(member): score for member, score in members}
        wake = rest.pop(0)
        seconds, micros = rest.pop(0)

        def zset(members: list[tuple[bytes, float]]) -> dict[str, float]:
            return {text(member): score for member, score in members}

        in_flight = zset(inflight)

        def as_it_stands(call_id: str, stored: dict[str, Any]) -> dict[str, Any]:
            # A first delivery's metadata stays as parked: in flight, delayed with none delivered means
            # queued, delivery 1 (README, the life of a call).
            if call_id in in_flight and stored.get("s") == "delayed" and not stored.get("d"):
                return {**stored, "s": "queued", "d": 1}
            return stored

        return Snapshot(
            now=int(seconds) * 1000 + int(micros) // 1000,
            sets={"delayed": zset(delayed), "inflight": in_flight, "dead": zset(dead)},
            payloads={text(k): v for k, v in payloads.items()},
            meta={text(k): as_it_stands(text(k), json.loads(v)) for k, v in meta.items()},
            index={text(k): text(v) for k, v in index.items()},
            batches=zset(batches),
            counters={text(k): int(v) for k, v in counters.items()},
            group_items=group_items,
            locks=locks,
            waiters=waiters,
            wake=int(wake),
        )

    def settled_snapshot(self) -> Snapshot:
        """A snapshot taken once every "soon" due time and deadline has passed by the Redis clock."""
        snap = self.snapshot()
        soon = [
            snap.sets[call.state][call_id]
            for call_id, call in self.calls.items()
            if call.state in ("delayed", "inflight") and call.soon and call_id in snap.sets[call.state]
        ]
        if soon and max(soon) > snap.now:
            self.wait_until(max(soon))
            snap = self.snapshot()
        # The next step's scripts run in a later millisecond than every score written so far, so the
        # order of due calls never depends on two steps falling in the same millisecond.
        self.wait_until(snap.now + 1)
        return snap

    def wait_until(self, ms: float) -> None:
        deadline = time.monotonic() + WAIT
        while self.redis_ms() < ms:
            assert time.monotonic() < deadline, "the Redis clock did not advance"
            time.sleep(0.0002)

    @invariant()
    def store_matches_the_model(self) -> None:
        snap = self.settled_snapshot()
        live = {call_id: call for call_id, call in self.calls.items() if call.live}

        # Each id is in at most one set, the one the model says; acknowledged/cancelled ids are gone.
        for state in LIVE:
            expected = {call_id for call_id, call in live.items() if call.state == state}
            assert set(snap.sets[state]) == expected, f"{state}: {sorted(snap.sets[state])} != {sorted(expected)}"
        in_sets = [call_id for state in LIVE for call_id in snap.sets[state]]
        assert len(in_sets) == len(set(in_sets)), "an id is in two sets"

        # No payload without an id in a set, no id in a set without a payload (but for dead entries
        # buried without one), and the payload never changes while the call is stored.
        assert set(snap.meta) == set(live)
        assert set(snap.payloads) == set(live)
        for call_id, call in live.items():
            assert snap.payloads.get(call_id) == call.payload, call_id
            meta = dict(snap.meta[call_id])
            assert ("why" in meta) is call.why, (call_id, meta)
            meta.pop("why", None)
            assert ("x" in meta) is call.x, (call_id, meta)
            meta.pop("x", None)
            assert ("st" in meta) is call.started, (call_id, meta)
            meta.pop("st", None)
            assert meta == call.expected_meta(), (call_id, meta, call)

        # Due times and deadlines: soon ones have passed, far ones are far.
        for state in ("delayed", "inflight"):
            for call_id, score in snap.sets[state].items():
                if live[call_id].soon:
                    assert score <= snap.now, (call_id, state, score, snap.now)
                else:
                    assert score > snap.now + LATER, (call_id, state, score, snap.now)

        # Delivery counts never decrease, except on requeue, unclaim and lock deferral.
        for call_id, meta in snap.meta.items():
            if "d" not in meta:
                continue
            generation, d = self.incarnation[call_id], int(meta["d"])
            before = self.seen_d.get(call_id)
            if before is not None and before[0] == generation and d < before[1]:
                assert call_id in self.may_decrease, f"deliveries of {call_id} went from {before[1]} to {d}"
            self.seen_d[call_id] = (generation, d)
        self.may_decrease.clear()

        # Unique/debounce keys.
        assert snap.index == self.index

        # Batches: every item added is in exactly one place, pending in its group or in one batch call.
        where: dict[int, list[str]] = {}
        for group, raws in snap.group_items.items():
            items = [json.loads(raw)["item"] for raw in raws]
            assert items == self.groups[group], (group, items, self.groups[group])
            for item in items:
                where.setdefault(item, []).append(f"group {group}")
        for call_id, payload in snap.payloads.items():
            if payload.startswith(b'{"redisdelay":"batch"'):
                for item in json.loads(payload)["items"]:
                    where.setdefault(item["item"], []).append(call_id)
        duplicated = {item: places for item, places in where.items() if len(places) > 1}
        assert not duplicated, f"items in more than one place: {duplicated}"
        assert set(where) | self.items_gone == set(range(self.items_added)), "an item was lost"
        assert not set(where) & self.items_gone
        pending_groups = {
            group_id(self.env.bundle.name, g): due for g, due in self.group_due.items() if due is not None
        }
        assert set(snap.batches) == set(pending_groups)
        for name, due in pending_groups.items():
            assert (snap.batches[name] <= snap.now) is due, (name, snap.batches[name], snap.now)
        assert snap.counters.get("batch_items", 0) == sum(len(items) for items in self.groups.values())

        # Locks: at most one holder, the one the model names; waiters as the model has them.
        for name in LOCKS:
            token, ttl = snap.locks[name]
            assert token == self.holders[name], (name, token, self.holders[name])
            if token is not None:
                assert ttl > FAR // 2
            assert snap.waiters[name] == self.waiters[name]
        assert snap.counters.get("lock_deferrals", 0) == self.lock_deferrals
        assert snap.counters.get("lock_takeovers", 0) == self.lock_takeovers
        assert snap.wake <= 16, "precise releasers need at most 16 wake-up markers"

        # The read side agrees.
        stats = self.store.stats()
        counts = {state: sum(1 for call in live.values() if call.state == state) for state in LIVE}
        assert {state: stats[state] for state in LIVE} == counts
        assert stats["due"] == sum(1 for call in live.values() if call.state == "delayed" and call.soon)
        assert stats["inflight_expired"] == sum(1 for call in live.values() if call.state == "inflight" and call.soon)
        assert stats["batch_groups"] == len(pending_groups)
        ids = self.op_ids()
        self.checks += 1
        call_id = ids[self.checks % len(ids)]  # one id a step, in turn
        found, model = self.store.find(call_id), live.get(call_id)
        assert (found.state if found else None) == (model.state if model else None), call_id
        if found is not None and model is not None:
            assert (found.score_ms, found.envelope) == (snap.sets[model.state][call_id], model.payload)
        assert [entry.id for entry in self.store.entries("dead", 1000)] == sorted(
            snap.sets["dead"], key=lambda call_id: (snap.sets["dead"][call_id], call_id.encode())
        )


@pytest.fixture
def env(make_app: MakeApp) -> Iterator[Env]:
    app, rd = make_app()

    @rd.delayed(name="sm.echo")
    def echo(value: Any = None) -> Any:
        return value

    @rd.batched(name="sm.bundle", size=BATCH_SIZE, max_wait=60)
    def bundle(key: str, items: list[Any]) -> int:
        return len(items)

    assert rd.fast_release, "the session's Redis is both broker and store: the fast path is on"
    yield Env(rd, echo, bundle, app.conf.task_default_queue, rd.broker_layout.list_keys(rd.app))
    rd.client.close()


@pytest.mark.timeout(600)  # 150 derandomized examples of 50 steps: about 60 s alone, past 180 s on a loaded CI
def test_call_store_state_machine(env: Env) -> None:
    class OnThisApp(StoreMachine):
        pass

    OnThisApp.env = env
    run_state_machine_as_test(OnThisApp, settings=MACHINE_SETTINGS)


# -- what the machine found ------------------------------------------------------------------------


def test_bury_of_a_call_the_store_no_longer_holds_makes_no_dead_letter(rd: RedisDelay) -> None:
    """A releaser buries a claimed call whose publish failed; if the claim timed out meanwhile and another
    delivery ran and was acknowledged, that late bury must not bring the finished call back as a dead letter."""
    store = rd.store
    store.park("finished", b'{"opaque": "envelope"}', {"m": 3}, countdown_ms=0)
    assert [call.id for call in store.claim(10, FAR)] == ["finished"]
    assert store.ack("finished") is True
    assert store.bury("finished", "cannot publish: late") is False
    assert rd.find("finished") is None
    assert rd.dead_letters() == []
