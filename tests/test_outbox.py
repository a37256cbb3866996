"""The outbox against a real redis-server: a process's starts and acknowledgements written by its thread in one
script per batch, in order, a start and its acknowledgement as one; entries Redis refuses are held, in order, and
written once it is back (issue 51: an outage of a few seconds no longer loses acknowledgements); ``flush()`` tries
three times; past its cap the outbox drops the oldest starts first; a forked child starts empty; a call another
shard holds is found there. (Runs on real workers: ``tests/test_pools.py``, ``tests/test_e2e.py``.)"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from celery import Celery

from celery_redisdelay import RedisDelay
from celery_redisdelay.store.calls import CallStore
from celery_redisdelay.store.outbox import WINDOW_SECONDS, Outbox
from celery_redisdelay.testing import RedisServer, wait_for
from tests.test_leases import ENVELOPE, LONG_MS, in_flight
from tests.test_store import entry

WAIT = 10.0
#: How long the store is down in the outage test: past the 0.2 s and 1 s backoffs after which the outbox dropped
#: a batch before issue 51.
OUTAGE_SECONDS = 3.0
LOGGER = "celery_redisdelay.store.outbox"
MakeApp = Callable[..., tuple[Celery, RedisDelay]]
Attempts = list[tuple[list[tuple[str, str]], bool]]


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


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> Attempts:
    """Every track script sent, and whether the store took it."""
    sent: Attempts = []
    track = CallStore.track

    def spy(store: CallStore, entries: Sequence[tuple[str, str]], *args: Any, **kwargs: Any) -> list[str]:
        try:
            missed = track(store, entries, *args, **kwargs)
        except Exception:
            sent.append((list(entries), False))
            raise
        sent.append((list(entries), True))
        return missed

    monkeypatch.setattr(CallStore, "track", spy)
    return sent


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A redis-server of the test's own, to stop and start again; durable, so its calls outlive the outage."""
    server = RedisServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"]).start()
    yield server
    server.stop()


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


def test_a_start_written_now_takes_the_gathered_entries_with_it_in_one_script(
    rd: RedisDelay, scripts: list[list[tuple[str, str]]]
) -> None:
    """An early-ack task's start is written before its body runs (worker/contract.py); the acknowledgement of the
    process's last run, still gathering, goes in the same script, ahead of it, not in a script of its own."""
    for call_id in ("last", "next"):
        in_flight(rd, call_id)
    gate = Gate()
    outbox = Outbox(rd.depot, sleep=gate)
    outbox.ack("last")
    assert outbox.start_now("next", "w1@host") is True
    assert scripts == [[("acked", "last"), ("start-once", "next")]]
    assert rd.find("last") is None
    assert entry(rd, "next").meta["s"] == "running" and entry(rd, "next").meta["h"] == "w1@host"
    gate.open()
    outbox.flush()
    assert len(scripts) == 1, "the thread finds nothing left to write"


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


def test_acks_made_while_the_store_is_down_reach_it_once_it_is_back(
    make_app: MakeApp, own_server: RedisServer, attempts: Attempts, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 51: the store down for 3 s, past the backoffs after which the outbox dropped a batch (its calls,
    finished, ran again once their lease ended). Now the entries wait, in order, until the store takes them."""
    _, rd = make_app(redisdelay_url=f"{own_server.url}/0")
    for call_id in ("running", "short", "done", "revoked"):
        in_flight(rd, call_id)
    outbox = Outbox(rd.depot)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        own_server.terminate()
        down = time.monotonic()
        outbox.start("running", "w1")
        outbox.start("short", "w1")
        outbox.ack("short")
        outbox.ack("done")
        outbox.ack("revoked", "revoked")
        refused = lambda: sum(not taken for _, taken in attempts)  # noqa: E731
        wait_for(lambda: refused() >= 3, WAIT, "three attempts refused (after which the batch used to be dropped)")
        wait_for(lambda: time.monotonic() - down >= OUTAGE_SECONDS, WAIT, "the outage to last")
        own_server.start()
        wait_for(lambda: [rd.find(c) for c in ("short", "done", "revoked")] == [None] * 3, WAIT, "every ack written")
        # The thread notes the write and logs the outage's end after the script has run: wait for that too.
        logged = lambda: [record.getMessage() for record in caplog.records if record.name == LOGGER]  # noqa: E731
        wait_for(lambda: len(logged()) >= 2, WAIT, "the outbox to log that the outage ended")
    assert entry(rd, "running").meta["s"] == "running", "the start without its ack is written too"
    assert attempts[-1] == ([("start", "running"), ("acked", "short"), ("acked", "done"), ("revoked", "revoked")], True)
    assert (counted(rd, rd.store, "acked"), counted(rd, rd.store, "revoked")) == (2, 1)
    assert (outbox.held, outbox.dropped_starts, outbox.dropped_acks) == (0, 0, 0)
    messages = logged()
    assert len(messages) == 2, messages
    assert "the outbox holds them and tries again until it takes them" in messages[0]
    assert "wrote the 4 start(s) and acknowledgement(s) it held, the store refusing them for" in messages[1]


def test_flush_tries_three_times_then_leaves_the_entries_to_the_thread(
    make_app: MakeApp, own_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """What a warm stop does on a dead store: three attempts, 0.2 s and 1 s apart, then it goes on; the entries
    stay, and the thread writes them once the store is back."""
    _, rd = make_app(redisdelay_url=f"{own_server.url}/0")
    in_flight(rd, "late")
    pauses: list[float] = []
    gate = Gate()  # the thread's window lasts until the store is back: only flush() writes before

    def sleep(seconds: float) -> None:
        gate(seconds) if seconds == WINDOW_SECONDS else pauses.append(seconds)

    outbox = Outbox(rd.depot, sleep=sleep)
    own_server.terminate()
    outbox.ack("late")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        outbox.flush()
    assert pauses == [0.2, 1.0]
    assert "could not write 1 start(s) and acknowledgement(s) in 3 attempts; the outbox keeps trying" in caplog.text
    assert (outbox.held, outbox.dropped_acks) == (1, 0), "held, not dropped"
    own_server.start()
    gate.open()
    # The thread notes the write (held back to 0) after the script has run: wait for both.
    wait_for(lambda: rd.find("late") is None and outbox.held == 0, WAIT, "the thread to write the ack flush() left")
    assert pauses == [0.2, 1.0], "the thread's first attempt wrote it"


def test_past_its_cap_the_outbox_drops_the_oldest_starts_then_the_oldest_acks(
    rd: RedisDelay, caplog: pytest.LogCaptureFixture
) -> None:
    acks = [f"a{n}" for n in range(1, 10)]
    for call_id in ("s1", "p1", "s2", *acks):
        in_flight(rd, call_id)
    gate = Gate()  # the thread's window lasts until open(): the entries gather past the cap meanwhile
    outbox = Outbox(rd.depot, sleep=gate, cap=10)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        outbox.start("s1", "w1")
        outbox.start("p1", "w1")
        outbox.ack("p1")
        outbox.start("s2", "w1")
        for call_id in acks[:7]:
            outbox.ack(call_id)  # the 11th entry: room for a tenth of the cap, down to 9
        assert (outbox.dropped_starts, outbox.dropped_acks) == (1, 0), "p1's start merged into its ack, s1's dropped"
        outbox.ack("a8")
        outbox.ack("a9")  # the 11th again: s2's start goes, the only one left, then the oldest ack, p1's
        assert (outbox.dropped_starts, outbox.dropped_acks) == (2, 1)
    for acks_dropped in (0, 1):
        assert f"1 start(s) (their calls are not shown running) and {acks_dropped} acknowledgement" in caplog.text
    gate.open()
    wait_for(lambda: all(rd.find(call_id) is None for call_id in acks), WAIT, "the acks kept to be written")
    assert entry(rd, "p1").state == "inflight", "its ack dropped: it runs again once its lease ends"
    assert [entry(rd, call_id).meta["s"] for call_id in ("s1", "s2")] == ["queued"] * 2, "their starts dropped"


def test_bad_entries_are_refused_before_anything_is_sent(rd: RedisDelay) -> None:
    in_flight(rd, "kept")
    with pytest.raises(ValueError, match=r"one of .*acked, revoked, expired, not 'done'"):
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
    assert outbox.dropped_acks == 1, "a batch lost to a bug is counted"
