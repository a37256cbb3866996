"""The outbox: the starts and acknowledgements of one process, written in batches by a thread of its own.

Each run of a parked call writes its start (``task_prerun``) and its acknowledgement (``task_postrun``, or the
worker's main process for a run it ended itself or a message it discarded). Written in the run, each would
be a round trip of the pool process per call. Instead the handler puts the entry in its process's outbox and
returns at once; the outbox's thread writes what has gathered in one script per shard and worker
(``store/lua/track.lua``, at most 1,000 entries a script), in the order the entries came. A start and an
acknowledgement of the same call written together are written as the acknowledgement alone.

The bound: the thread writes as soon as the first entry comes (after :data:`WINDOW_SECONDS`, to gather the
entries of the runs that end meanwhile), and entries that come during a write go in the next one, so an
entry reaches Redis within the window and two round trips of its run's start or end. When Redis cannot be
reached, a batch is tried again after 0.2 s and 1 s, then dropped with an error: those calls stay in
flight and run again once their lease or deadline passes (at-least-once, as with Celery's ``acks_late``).
A process that ends warmly (a pool process's exit, the worker's stop) writes what it holds first; one
killed loses at most the entries of its last window, whose calls run again the same way.

Each process has its own outbox: a forked pool process starts with an empty one, and starts its own thread
when it first needs it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import RedisDelayError
from .calls import LARGEST_STEP, OUTCOMES

if TYPE_CHECKING:
    from .calls import CallStore
    from .depot import Depot

logger = logging.getLogger(__name__)

#: How long the thread gathers entries after the first one before it writes (seconds).
WINDOW_SECONDS = 0.002
#: Waits before the second and third attempt of a batch: long enough to outlast a Redis restart or a
#: dropped connection (the chaos runs saw acks fail inside 0.2 s restarts), short for a worker.
BACKOFF_SECONDS = (0.2, 1.0)
START = "start"
#: A start whose run, cut short with its worker, is dead-lettered rather than run again (worker/contract.py).
START_ONCE = "start-once"
STARTS = (START, START_ONCE)


_OUTBOXES: weakref.WeakSet[Outbox] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for outbox in list(_OUTBOXES):
        outbox._fresh()


def _at_exit() -> None:
    for outbox in list(_OUTBOXES):
        outbox.flush()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)


@dataclass
class Script:
    """The entries of one track script, and the worker its starts name."""

    worker: str
    entries: list[tuple[str, str]]


class Outbox:
    """One process's starts and acknowledgements, waiting to be written."""

    def __init__(self, depot: Depot, sleep: Callable[[float], None] | None = None) -> None:
        self.depot = depot
        # time.sleep looked up when it is called: under eventlet or gevent, the patched one.
        self.sleep: Callable[[float], None] = sleep or (lambda seconds: time.sleep(seconds))
        self._fresh()
        _OUTBOXES.add(self)

    def _fresh(self) -> None:
        """An empty outbox and no thread: at creation, and in a forked child (the parent's thread and the
        entries it copied are the parent's)."""
        self._entries: list[tuple[str, str, str]] = []  # (op, call id, worker)
        self._lock = threading.Lock()  # guards the entries
        self._writing = threading.Lock()  # one write at a time, so entries reach Redis in order
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, call_id: str, worker: str, once: bool = False) -> None:
        """A run of ``call_id`` started on ``worker`` (its hostname); ``once``: if it is cut short with its worker,
        the call is dead-lettered rather than run again."""
        self._put(START_ONCE if once else START, call_id, worker)

    def ack(self, call_id: str, outcome: str = "acked") -> None:
        """``call_id`` is finished as Celery sees it; ``outcome`` is counted (see ``CallStore.ack``)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
        self._put(outcome, call_id, "")

    def _put(self, op: str, call_id: str, worker: str) -> None:
        with self._lock:
            self._entries.append((op, call_id, worker))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="redisdelay-outbox", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self.sleep(WINDOW_SECONDS)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # a bug must not stop the thread: the next entries are written all the same
                logger.exception("redisdelay: the outbox failed to write a batch; its calls run again")

    def flush(self) -> None:
        """Write every entry gathered so far, in the calling thread (after a write in progress)."""
        with self._writing:
            with self._lock:
                entries, self._entries = self._entries, []
            if entries:
                self._write(entries)

    def _write(self, entries: Sequence[tuple[str, str, str]]) -> None:
        settings = self.depot.settings
        run_ms, lease_ms = round(settings.visibility_timeout * 1000), round(settings.lease * 1000)
        acked_later: set[str] = set()
        kept: list[tuple[str, str, str]] = []
        for op, call_id, worker in reversed(entries):  # a start followed by its ack: the ack says it all
            if op not in STARTS:
                acked_later.add(call_id)
            elif call_id in acked_later:
                continue
            kept.append((op, call_id, worker))
        # Per shard, scripts of at most LARGEST_STEP entries in order; a start names its worker, so a start of
        # another worker (a process hosting two, rare) begins a script of its own.
        shards: dict[str, tuple[CallStore, list[Script]]] = {}
        for op, call_id, worker in reversed(kept):
            store = self.depot.shards.home(call_id)
            scripts = shards.setdefault(store.keys.tag, (store, []))[1]
            other_worker = op in STARTS and bool(scripts) and scripts[-1].worker not in ("", worker)
            if not scripts or len(scripts[-1].entries) >= LARGEST_STEP or other_worker:
                scripts.append(Script("", []))
            if op in STARTS:
                scripts[-1].worker = worker
            scripts[-1].entries.append((op, call_id))
        for store, scripts in shards.values():
            for script in scripts:
                missed = set(self._track(store, script.entries, run_ms, lease_ms, script.worker))
                # Calls their home does not know: looked for on the other shards (retired ones included), one by
                # one, as ``ShardSet.first`` does for a single call.
                for entry in [entry for entry in script.entries if entry[1] in missed]:
                    for other in self.depot.shards.search(entry[1]):
                        if other is not store and not self._track(other, [entry], run_ms, lease_ms, script.worker):
                            break

    def _track(
        self, store: CallStore, entries: Sequence[tuple[str, str]], run_ms: int, lease_ms: int, worker: str
    ) -> list[str]:
        """One script of entries, tried again after each backoff; after the last failure its entries are dropped
        (their calls run again once their deadlines pass) and none is reported missed."""
        for attempt, pause in enumerate((*BACKOFF_SECONDS, None), start=1):
            try:
                return store.track(entries, run_ms, lease_ms, worker)
            except RedisDelayError as exc:
                if pause is None:
                    logger.error(
                        "redisdelay: could not write the starts and acknowledgements of %d call(s) after %d "
                        "attempts; the calls not acknowledged will run again: %s",
                        len(entries),
                        attempt,
                        exc,
                    )
                else:
                    self.sleep(pause)
        return []
