"""The outbox against a real redis-server: a process's starts and acknowledgements written by its thread in one
script per batch, in order, a start and its acknowledgement as one; a batch Redis refuses is tried again, then
dropped with an error; a forked child starts empty; a call another shard holds is found there. (Runs on real
workers: ``tests/test_pools.py``, ``tests/test_e2e.py``.)"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from celery import Celery

from celery_redisdelay import RedisDelay
from celery_redisdelay.store.calls import CallStore
from celery_redisdelay.store.outbox import WINDOW_SECONDS, Outbox
from celery_redisdelay.testing import free_port, wait_for
from tests.test_leases import ENVELOPE, LONG_MS, in_flight
from tests.test_store import entry

WAIT = 10.0
MakeApp = Callable[..., tuple[Celery, RedisDelay]]


class Gate:
    """The outbox thread's sleep: the first window lasts until :meth:`open` (the entries gather meanwhile)."""

    def __init__(self) -> None:
        self.opened = threading.Event()

    def __call__(self, seconds: float) -> None:
        if seconds == WINDOW_SECONDS:
            self.opened.wait(WAIT)

    def open(self) -> None:
        self.opened.set()


@pytest.fixture
def scripts(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[str, str]]]:
    """The entries of every track script, as they are sent."""
    sent: list[list[tuple[str, str]]] = []
    track = CallStore.track

    def spy(store: CallStore, entries: Sequence[tuple[str, str]], *args: Any, **kwargs: Any) -> list[str]:
        sent.append(list(entries))
        return track(store, entries, *args, **kwargs)

    monkeypatch.setattr(CallStore, "track", spy)
    return sent


def counted(rd: RedisDelay, store: CallStore, name: str) -> int:
    """A running total of a store (its counters hash)."""
    return int(rd.depot.client.hget(store.keys.counters, name) or 0)


def test_a_start_and_an_ack_reach_redis_from_the_thread(rd: RedisDelay) -> None:
    in_flight(rd, "run")
    outbox = Outbox(rd.depot)
    outbox.start("run", "w1@host")
    wait_for(lambda: entry(rd, "run").meta.get("s") == "running", WAIT, "the start to be written")
    assert entry(rd, "run").meta["h"] == "w1@host", "the start holds the call for its worker"
    outbox.ack("run")
    wait_for(lambda: rd.find("run") is None, WAIT, "the acknowledgement to be written")
    assert counted(rd, rd.store, "acked") == 1


def test_entries_gathered_together_are_one_script_in_order(
    rd: RedisDelay, scripts: list[list[tuple[str, str]]]
) -> None:
    for call_id in ("a", "b", "c"):
        in_flight(rd, call_id)
    gate = Gate()
    outbox = Outbox(rd.depot, sleep=gate)
    outbox.start("a", "w1")
    outbox.start("b", "w1")
    outbox.ack("a")  # a run that ended within the window: its start is not written
    outbox.ack("c", "revoked")
    assert scripts == [], "nothing is written while the window lasts"
    gate.open()
    wait_for(lambda: rd.find("a") is None and rd.find("c") is None, WAIT, "the batch to be written")
    assert scripts == [[("start", "b"), ("acked", "a"), ("revoked", "c")]]
    assert entry(rd, "b").meta["s"] == "running"
    assert (counted(rd, rd.store, "acked"), counted(rd, rd.store, "revoked")) == (1, 1)


def test_a_start_after_its_ack_is_written_and_finds_nothing(rd: RedisDelay) -> None:
    in_flight(rd, "again")
    outbox = Outbox(rd.depot, sleep=lambda _: None)
    outbox.ack("again")
    outbox.start("again", "w1")  # a later delivery's start: written after the ack, it tracks nothing
    outbox.flush()
    assert rd.find("again") is None


def test_flush_writes_at_once_in_the_calling_thread(rd: RedisDelay, scripts: list[list[tuple[str, str]]]) -> None:
    in_flight(rd, "now")
    gate = Gate()
    outbox = Outbox(rd.depot, sleep=gate)
    outbox.ack("now")
    outbox.flush()  # a process that ends, or a touch(): it does not wait for the thread's window
    assert rd.find("now") is None and scripts == [[("acked", "now")]]
    gate.open()


def test_a_batch_redis_refuses_is_tried_again_then_dropped_with_an_error(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    _, rd = make_app(redisdelay_url=f"redis://127.0.0.1:{free_port()}/0")
    pauses: list[float] = []
    gate = Gate()  # the thread's window lasts the whole test: only flush() writes

    def sleep(seconds: float) -> None:
        gate(seconds) if seconds == WINDOW_SECONDS else pauses.append(seconds)

    outbox = Outbox(rd.depot, sleep=sleep)
    outbox.ack("lost")
    with caplog.at_level(logging.ERROR, logger="celery_redisdelay.store.outbox"):
        outbox.flush()
    assert pauses == [0.2, 1.0]
    assert "could not write the starts and acknowledgements of 1 call(s) after 3 attempts" in caplog.text
    outbox.flush()
    assert pauses == [0.2, 1.0], "dropped: not tried again"
    gate.open()


def test_bad_entries_are_refused_before_anything_is_sent(rd: RedisDelay) -> None:
    in_flight(rd, "kept")
    with pytest.raises(ValueError, match="'start' or one of acked, revoked, expired, not 'done'"):
        rd.store.track([("acked", "kept"), ("done", "kept")], LONG_MS)
    with pytest.raises(ValueError, match="1 to 1000 ids, not 0"):
        rd.store.track([], LONG_MS)
    with pytest.raises(ValueError, match="outcome must be one of acked, revoked, expired, not 'done'"):
        Outbox(rd.depot).ack("kept", "done")
    assert entry(rd, "kept").state == "inflight"


def test_a_forked_child_starts_with_an_empty_outbox_and_a_thread_of_its_own(rd: RedisDelay) -> None:
    in_flight(rd, "parent's")
    in_flight(rd, "child's")
    gate = Gate()
    outbox = Outbox(rd.depot, sleep=gate)
    outbox.ack("parent's")  # gathered in the parent, its thread waiting on the gate
    pid = os.fork()
    if pid == 0:  # the child: only this thread exists, and the parent's entries are not its own
        code = 1
        try:
            outbox.ack("child's")
            gate.open()  # the child's copy of the gate: its own thread's window ends
            wait_for(lambda: rd.find("child's") is None, WAIT, "the child's thread to write")
            code = 0 if rd.find("parent's") is not None else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child wrote its own entry, not the parent's"
    gate.open()
    wait_for(lambda: rd.find("parent's") is None, WAIT, "the parent's thread to write")


def test_a_call_another_shard_holds_is_found_there(make_app: MakeApp) -> None:
    _, rd = make_app(redisdelay_shards=2)
    stores = rd.depot.shards.stores
    call_id = next(f"moved-{n}" for n in range(100) if rd.depot.shards.home(f"moved-{n}") is stores[0])
    stores[1].park(call_id, ENVELOPE, {"r": LONG_MS, "q": LONG_MS}, countdown_ms=0)  # parked under another count
    assert [claimed.id for claimed in stores[1].claim(10, LONG_MS)] == [call_id]
    assert stores[1].confirm([call_id], LONG_MS) == 1
    outbox = Outbox(rd.depot, sleep=lambda _: None)
    outbox.ack(call_id)
    outbox.flush()
    assert rd.find(call_id) is None and counted(rd, stores[1], "acked") == 1


def test_the_thread_outlives_a_batch_that_failed_for_any_reason(
    rd: RedisDelay, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    in_flight(rd, "after")
    track = CallStore.track
    failures: list[str] = []

    def first_fails(store: CallStore, entries: Sequence[tuple[str, str]], *args: Any, **kwargs: Any) -> list[str]:
        if not failures:
            failures.append(entries[0][1])
            raise RuntimeError("a bug")
        return track(store, entries, *args, **kwargs)

    monkeypatch.setattr(CallStore, "track", first_fails)
    outbox = Outbox(rd.depot)
    with caplog.at_level(logging.ERROR, logger="celery_redisdelay.store.outbox"):
        outbox.ack("before")
        wait_for(lambda: failures == ["before"], WAIT, "the first batch to fail")
        outbox.ack("after")
        wait_for(lambda: rd.find("after") is None, WAIT, "the next batch to be written")
    assert "the outbox failed to write a batch" in caplog.text
