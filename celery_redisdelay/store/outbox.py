"""The outbox: the starts and acknowledgements of one process, written in batches by a thread of its own.

Each run of a parked call writes its start (``task_prerun``) and its acknowledgement (``task_postrun``, or the
worker's main process for a run it ended itself or a message it discarded). Written in the run, each would
be a round trip of the pool process per call. Instead the handler puts the entry in its process's outbox and
returns at once; the outbox's thread writes what has gathered in one script per shard and worker
(``store/lua/track.lua``, at most 1,000 entries a script), in the order the entries came. A start and an
acknowledgement of the same call written together are written as the acknowledgement alone.

The bound: the thread writes as soon as the first entry comes (after :data:`WINDOW_SECONDS`, to gather the
entries of the runs that end meanwhile), and entries that come during a write go in the next one, so an
entry reaches Redis within the window and two round trips of its run's start or end.

The guarantee: while its process lives, the outbox drops no acknowledgement because the store refused it
(unreachable, restarting, failing over). The entries of a script the store refuses, and those after it on the
same shard, stay in the outbox, in order and ahead of the entries that came since, and the thread tries them
again after 0.2 s, 1 s, then every 3 s (:data:`BACKOFF_SECONDS`) until the store takes them; they are still
written in order, a start followed by its acknowledgement as the acknowledgement alone. It logs a warning
when it starts holding entries back (how many) and another when it has written them all (after how long, how
many); :attr:`Outbox.held` says how many wait.

Two things bound that. Memory: an outbox holds at most :data:`MAX_WAITING` entries; past that it makes room
for a tenth of them, first by merging each start into the acknowledgement that follows it (nothing lost), then
by dropping the oldest starts (a lost start costs only the call's state until it ends), and only then the
oldest acknowledgements (those calls run again once their lease ends), each drop logged as an error and
counted (:attr:`Outbox.dropped_starts`, :attr:`Outbox.dropped_acks`). And the end of the process: one that
ends warmly (a pool process's exit, the worker's stop) writes what it holds first with :meth:`Outbox.flush`,
which tries :data:`FLUSH_ATTEMPTS` times, 0.2 s and 1 s apart, so a stop waits at most about 1.2 s and three
attempts (each bounded by the client's socket timeouts) for a store that does not answer; what is still held
then is lost, with an error, and so is what a killed process held: those calls stay in flight and run again
once their lease or deadline passes (at-least-once, as with Celery's ``acks_late``).

Each process has its own outbox: a forked pool process starts with an empty one, and starts its own thread
when it first needs it.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import RedisDelayError
from .calls import LARGEST_STEP, OUTCOMES

if TYPE_CHECKING:
    from .calls import CallStore
    from .depot import Depot

logger = logging.getLogger(__name__)

#: How long the thread gathers entries after the first one before it writes (seconds).
WINDOW_SECONDS = 0.002
#: The waits before each new attempt after a write the store refused, the last one repeated for as long as it
#: refuses: the first two outlast a Redis restart or a dropped connection (the chaos runs saw acks fail inside
#: 0.2 s restarts), the last keeps a long outage to one attempt every few seconds.
BACKOFF_SECONDS = (0.2, 1.0, 3.0)
#: How many times :meth:`Outbox.flush` tries, the first backoffs apart (about 1.2 s in all): a worker's warm stop
#: does not wait longer than that for a store that does not answer.
FLUSH_ATTEMPTS = 3
#: The most entries an outbox holds (what it gathers while the store refuses them); past it, it makes room for a
#: tenth of them.
MAX_WAITING = 100_000
START = "start"
#: A start whose run, cut short with its worker, is dead-lettered rather than run again (worker/contract.py).
START_ONCE = "start-once"
STARTS = (START, START_ONCE)

#: (op, call id, worker): op a start or the outcome of an acknowledgement; the worker of a start, else "".
Entry = tuple[str, str, str]


_OUTBOXES: weakref.WeakSet[Outbox] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for outbox in list(_OUTBOXES):
        outbox._fresh()


def _at_exit() -> None:
    for outbox in list(_OUTBOXES):
        outbox.flush()


@functools.cache
def _hook() -> None:
    """Hook the process's forks and exit, once, when the first outbox is made (not when the module is imported)."""
    os.register_at_fork(after_in_child=_after_fork_in_child)
    atexit.register(_at_exit)


def backoff(failures: int) -> float:
    """The wait before the next attempt after ``failures`` (1 or more) attempts in a row failed."""
    return BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS)) - 1]


def merged(entries: Sequence[Entry]) -> list[Entry]:
    """``entries`` in order, without the starts an acknowledgement of the same call follows: the ack says it all."""
    acked_later: set[str] = set()
    kept: list[Entry] = []
    for entry in reversed(entries):
        op, call_id, _ = entry
        if op in OUTCOMES:
            acked_later.add(call_id)
        elif call_id in acked_later:
            continue
        kept.append(entry)
    kept.reverse()
    return kept


def trimmed(entries: Sequence[Entry], limit: int) -> tuple[list[Entry], int, int]:
    """``entries`` cut to at most ``limit``: merged, then without their oldest starts, and only then without their
    oldest acknowledgements; (the entries kept, the starts dropped, the acknowledgements dropped)."""
    kept = merged(entries)
    starts = min(max(len(kept) - limit, 0), sum(op not in OUTCOMES for op, _, _ in kept))
    kept = without_oldest_starts(kept, starts)
    acks = max(len(kept) - limit, 0)  # when some must go still, only acknowledgements are left
    return kept[acks:], starts, acks


def without_oldest_starts(entries: Sequence[Entry], count: int) -> list[Entry]:
    """``entries`` in order, without their first ``count`` starts."""
    kept: list[Entry] = []
    for entry in entries:
        if count and entry[0] not in OUTCOMES:
            count -= 1
        else:
            kept.append(entry)
    return kept


@dataclass
class Script:
    """The entries of one track script, the worker its starts name, and where its entries are in the batch."""

    worker: str
    entries: list[tuple[str, str]] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)


class Outbox:
    """One process's starts and acknowledgements, waiting to be written."""

    def __init__(self, depot: Depot, sleep: Callable[[float], None] | None = None, cap: int = MAX_WAITING) -> None:
        self.depot = depot
        # time.sleep looked up when it is called: under eventlet or gevent, the patched one.
        self.sleep: Callable[[float], None] = sleep or (lambda seconds: time.sleep(seconds))
        self.cap = cap
        self._fresh()
        _OUTBOXES.add(self)
        _hook()

    def _fresh(self) -> None:
        """An empty outbox and no thread: at creation, and in a forked child (the parent's thread and the
        entries it copied are the parent's)."""
        self._entries: list[Entry] = []
        self._writing_now = 0  # entries taken by the write in progress
        self._refused_since: float | None = None  # when the store began refusing the writes (monotonic)
        self._lock = threading.Lock()  # guards the above
        self._writing = threading.Lock()  # one write at a time, so entries reach Redis in order
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        #: The starts and acknowledgements this process dropped: past :attr:`cap`, or in a write that failed
        #: for another reason than the store refusing it (a bug).
        self.dropped_starts = 0
        self.dropped_acks = 0

    @property
    def held(self) -> int:
        """How many entries wait because the store refused them (0 while it takes them)."""
        with self._lock:
            return 0 if self._refused_since is None else len(self._entries) + self._writing_now

    def start(self, call_id: str, worker: str, once: bool = False) -> None:
        """A run of ``call_id`` started on ``worker`` (its hostname); ``once``: if it is cut short with its worker,
        the call is dead-lettered rather than run again."""
        self._put(START_ONCE if once else START, call_id, worker)

    def start_now(self, call_id: str, worker: str) -> bool:
        """Write the start of a run that is not run again if cut short with its worker (``once``), in this thread,
        before its body runs, and with it the entries gathered so far, in order: the acknowledgement of the
        process's last run, usually, which the thread would otherwise write in a script of its own. True when the
        store took the start. False: the store refused it; the outbox holds it with the rest, and its thread
        writes it when the store takes it (a worker that dies meanwhile has the call run again). While the outbox
        holds entries the store refused, the start is written alone, so a run never waits for a backlog."""
        entry: Entry = (START_ONCE, call_id, worker)
        with self._writing:
            with self._lock:
                backlog = self._refused_since is not None
                entries, self._entries = ([], self._entries) if backlog else (self._entries, [])
                entries.append(entry)
                self._writing_now = len(entries)
            try:
                refused, error = self._write(entries)
            except Exception:
                self._dropped(entries)
                raise
            if backlog:  # the held entries are the thread's to write, first: the start waits behind them
                with self._lock:
                    self._writing_now = 0
                    if refused:
                        self._entries.append(entry)
                return not refused
            self._hold(refused, len(entries), error)
        return entry not in refused

    def ack(self, call_id: str, outcome: str = "acked") -> None:
        """``call_id`` is finished as Celery sees it; ``outcome`` is counted (see ``CallStore.ack``)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
        self._put(outcome, call_id, "")

    def _put(self, op: str, call_id: str, worker: str) -> None:
        with self._lock:
            self._entries.append((op, call_id, worker))
            if len(self._entries) > self.cap:
                self._make_room()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="redisdelay-outbox", daemon=True)
                self._thread.start()
        self._wake.set()

    def _make_room(self) -> None:
        """Past the cap (with the lock held): room for a tenth of it, so this runs once in many entries."""
        self._entries, starts, acks = trimmed(self._entries, self.cap - self.cap // 10)
        self.dropped_starts += starts
        self.dropped_acks += acks
        if starts or acks:
            logger.error(
                "redisdelay: the outbox holds more than %d starts and acknowledgements; dropped the oldest %d "
                "start(s) (their calls are not shown running) and %d acknowledgement(s) (their calls run again once "
                "their lease ends)",
                self.cap,
                starts,
                acks,
            )

    def _run(self) -> None:
        failures = 0
        while True:
            if failures:
                self.sleep(backoff(failures))
            else:
                self._wake.wait()
                self.sleep(WINDOW_SECONDS)
            self._wake.clear()
            try:
                failures = failures + 1 if self._attempt() else 0
            except Exception:  # a bug must not stop the thread: the next entries are written all the same
                failures = 0
                logger.exception("redisdelay: the outbox failed to write a batch; its calls run again")

    def flush(self) -> None:
        """Write every entry gathered so far, in the calling thread (after a write in progress). The store
        refusing them, it tries :data:`FLUSH_ATTEMPTS` times, then leaves them to the thread with an error."""
        for attempt in range(FLUSH_ATTEMPTS):
            if attempt:
                self.sleep(backoff(attempt))
            if not self._attempt():
                return
        logger.error(
            "redisdelay: could not write %d start(s) and acknowledgement(s) in %d attempts; the outbox keeps "
            "trying, but should this process end now, the calls not acknowledged will run again",
            self.held,
            FLUSH_ATTEMPTS,
        )

    def _attempt(self) -> bool:
        """Write everything gathered so far, once; True when the store refused some of it (kept, first)."""
        with self._writing:
            with self._lock:
                entries, self._entries = self._entries, []
                self._writing_now = len(entries)
            if not entries:
                return False
            try:
                refused, error = self._write(entries)
            except Exception:
                self._dropped(entries)
                raise
            self._hold(refused, len(entries), error)
            return bool(refused)

    def _dropped(self, entries: Sequence[Entry]) -> None:
        starts = sum(op not in OUTCOMES for op, _, _ in entries)
        with self._lock:
            self._writing_now = 0
            self.dropped_starts += starts
            self.dropped_acks += len(entries) - starts

    def _hold(self, refused: list[Entry], tried: int, error: RedisDelayError | None) -> None:
        """Put back the entries the store refused, ahead of those that came since; log an outage's start and end."""
        with self._lock:
            self._writing_now = 0
            self._entries[:0] = refused
            if len(self._entries) > self.cap:
                self._make_room()
            began, now = self._refused_since, time.monotonic()
            self._refused_since = (now if began is None else began) if refused else None
        if refused:
            self._wake.set()  # a flush() that gives up leaves them to the thread, which may be idle
        if refused and began is None:
            logger.warning(
                "redisdelay: the store refused %d start(s) and acknowledgement(s); the outbox holds them and tries "
                "again until it takes them (%d at most, then the oldest starts are dropped first): %s",
                len(refused),
                self.cap,
                error,
            )
        elif not refused and began is not None:
            logger.warning(
                "redisdelay: the outbox wrote the %d start(s) and acknowledgement(s) it held, the store refusing "
                "them for %.1f s",
                tried,
                now - began,
            )

    def _write(self, entries: Sequence[Entry]) -> tuple[list[Entry], RedisDelayError | None]:
        """Write ``entries``, each shard's scripts in order; (the entries of the script the store refused and those
        after it on its shard, in order; the error)."""
        kept = merged(entries)
        refused: list[int] = []
        error: RedisDelayError | None = None
        for store, scripts in self._scripts(kept).values():
            for n, script in enumerate(scripts):
                try:
                    self._track(store, script)
                except RedisDelayError as exc:
                    error = exc
                    refused += [index for later in scripts[n:] for index in later.indices]
                    break
        return [kept[index] for index in sorted(refused)], error

    def _scripts(self, entries: Sequence[Entry]) -> dict[str, tuple[CallStore, list[Script]]]:
        """Per shard, scripts of at most LARGEST_STEP entries in order; a start names its worker, so a start of
        another worker (a process hosting two, rare) begins a script of its own."""
        shards: dict[str, tuple[CallStore, list[Script]]] = {}
        for index, (op, call_id, worker) in enumerate(entries):
            store = self.depot.shards.home(call_id)
            scripts = shards.setdefault(store.keys.tag, (store, []))[1]
            start = op not in OUTCOMES
            other_worker = start and bool(scripts) and scripts[-1].worker not in ("", worker)
            if not scripts or len(scripts[-1].entries) >= LARGEST_STEP or other_worker:
                scripts.append(Script(""))
            if start:
                scripts[-1].worker = worker
            scripts[-1].entries.append((op, call_id))
            scripts[-1].indices.append(index)
        return shards

    def _track(self, store: CallStore, script: Script) -> None:
        """One script; then the calls their home does not know, looked for on the other shards (retired ones
        included), one by one, as ``ShardSet.first`` does for a single call. Raises what the store raises."""
        settings = self.depot.settings
        run_ms, lease_ms = round(settings.visibility_timeout * 1000), round(settings.lease * 1000)
        missed = set(store.track(script.entries, run_ms, lease_ms, script.worker))
        for entry in [entry for entry in script.entries if entry[1] in missed]:
            for other in self.depot.shards.search(entry[1]):
                if other is not store and not other.track([entry], run_ms, lease_ms, script.worker):
                    break
