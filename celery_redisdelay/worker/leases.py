"""Leases: a worker's main process holds every parked call it has received, reserved or running.

Without a lease, a call's in-flight deadline is its queue timeout while it waits in a worker (two hours
by default) and its run timeout once started (an hour): a worker that dies costs its calls that long.
With one, the worker's main process (the one that consumes messages, under every pool) takes each call
it receives (``task_received``) in batches of up to :data:`TAKE_BATCH` calls gathered for at most
:data:`TAKE_WINDOW_SECONDS`, and renews all the calls it holds in one script per shard every
``redisdelay_lease_renewal`` seconds (up to 1,000 calls a script). A call whose lease runs out
(``redisdelay_lease``, 30 s by default: the worker was killed, its host is gone, it lost Redis for longer
than that) is past its deadline, and the sweep delivers it again. A run on a live worker is renewed for as
long as it lasts, unless the task has its own timeout (``timeout=``), which stays a hard end.

A call is held while Celery's worker state knows its request (reserved, scheduled or running) and for one
renewal period after it was received; when it finishes, its acknowledgement removes it from the store and
its next renewal finds nothing. When the worker stops warmly, the calls it holds that have not started
are given back: kombu puts their messages back in the queue, and another worker takes them.

When Redis cannot be reached for a renewal, the worker logs it once per outage, keeps running its calls,
and renews when Redis is back; a call whose lease ran out meanwhile may run twice.

The thread renews on its own, so it would also renew for a worker whose consumer no longer turns: its event
loop stuck in a callback, say. Such a worker starts nothing more, and the calls it received and has not started
would wait on it for as long as it lives. So the loop notes each turn (a timer of the worker's event loop,
every :data:`TURN_SECONDS`), and when it has not turned for a whole lease, while no run holds the main thread
(the solo pool runs its calls there), the renewals leave out the calls not started: their leases run out and
the sweep delivers them to another worker. The running ones are still renewed. Should the loop turn again, the
worker may start such a call too (it ran elsewhere meanwhile: at-least-once). Pools without an event loop
(eventlet, gevent) are not watched.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import RedisDelayError
from ..store.calls import LARGEST_STEP
from .running import known_ids, running_requests
from .unacked import store_delivery

if TYPE_CHECKING:
    from ..store.depot import Depot

logger = logging.getLogger(__name__)

#: A batch of takes is written when this many calls were received ...
TAKE_BATCH = 100
#: ... or this long after the first of them.
TAKE_WINDOW_SECONDS = 0.005
#: How often the worker's event loop notes that it turns (seconds).
TURN_SECONDS = 1.0


@dataclass
class Held:
    """A call the worker holds: kombu's delivery tag of the delivery, when it was received, and whether its take
    reached Redis (a renewal does not take a call no worker has taken: lease.lua)."""

    tag: str
    received: float
    taken: bool = False


class Leases:
    """The calls one worker holds, and the thread that takes and renews their leases."""

    def __init__(
        self,
        depot: Depot,
        worker: str,
        owns: Callable[[Any], bool] = lambda request: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.depot = depot
        self.worker = worker
        self.owns = owns  # whether a request is of a task whose calls may be parked
        self.lease_ms = round(depot.settings.lease * 1000)
        self.renewal = depot.settings.lease_renewal
        self.clock = clock
        self.held: dict[str, Held] = {}
        self._new: list[str] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._stopped = threading.Event()
        self._outage = False
        self.turned: float | None = None  # the event loop's last turn; None: not watched (yet)
        self._runs_in_loop = 0  # runs holding the loop's thread (the solo pool's)
        self._loop: tuple[int, int] | None = None  # the process and thread of the event loop
        self._stalled = False

    # -- the consumer's side (the main thread) ------------------------------------------------------------

    def received(self, call_id: str, tag: str) -> None:
        """A call's message reached this worker: hold it."""
        if self._closing.is_set():
            return
        with self._lock:
            self.held[call_id] = Held(tag, self.clock())
            self._new.append(call_id)
            if len(self._new) == 1 or len(self._new) >= TAKE_BATCH:
                self._wake.set()

    def loop_turns(self) -> None:
        """The worker's event loop turned (a timer of the loop calls it, in the loop's thread)."""
        self._loop = (os.getpid(), threading.get_ident())
        self.turned = self.clock()

    def run_in_loop(self, started: bool) -> None:
        """A run started (or ended), in any thread or process: counted when it is in the event loop's thread,
        which waits for it and is not stuck meanwhile (the solo pool's runs)."""
        if (os.getpid(), threading.get_ident()) != self._loop:
            return
        with self._lock:
            self._runs_in_loop += 1 if started else -1
        if not started:
            self.turned = self.clock()

    def loop_stuck(self) -> bool:
        """Whether the event loop has not turned for a whole lease while no run holds it."""
        turned = self.turned
        return turned is not None and self._runs_in_loop <= 0 and self.clock() - turned > self.lease_ms / 1000

    # -- the thread ---------------------------------------------------------------------------------------

    def run(self) -> None:
        """Take new calls as they come and renew every held one each renewal period, until :meth:`stop`."""
        due = self.clock() + self.renewal
        while not self._stopped.is_set():
            self._wake.wait(max(0.0, due - self.clock()))
            if self._stopped.is_set():
                break
            if self._wake.is_set():
                self._wake.clear()
                self._stopped.wait(TAKE_WINDOW_SECONDS)  # a window to gather the calls received with it
                self.take_new()
            if self.clock() >= due:
                self.renew()
                due = self.clock() + self.renewal
                if self._closing.is_set() and not self.held:
                    break

    def take_new(self) -> None:
        """Lease the calls received since the last take."""
        with self._lock:
            new, self._new = self._new, []
            calls = [(call_id, self.held[call_id].tag) for call_id in new if call_id in self.held]
        self._take(calls)

    def _take(self, calls: list[tuple[str, str]]) -> None:
        """Take ``calls``, and note them taken if the takes reached Redis."""
        if calls and self._hold(calls, renewal=False):
            with self._lock:
                for call_id, _ in calls:
                    if call_id in self.held:
                        self.held[call_id].taken = True

    def renew(self) -> None:
        """Renew every call still held; forget the ones Celery no longer knows."""
        with self._lock:
            self._new.clear()  # renewed now with the rest
            self._forget_finished()
            if self._closing.is_set():  # a call given back that a pool process started after all
                for request in running_requests():
                    if request.id not in self.held and self.owns(request):
                        self.held[request.id] = Held(delivery_tag(request), self.clock())
            calls = [(call_id, held.tag) for call_id, held in self.held.items()]
            untaken = [(call_id, held.tag) for call_id, held in self.held.items() if not held.taken]
        calls = self._while_stuck(calls)
        self._take([call for call in untaken if call in calls])  # takes that did not reach Redis, taken again first
        self._hold(calls, renewal=True)

    def _while_stuck(self, calls: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """``calls``, less the ones not started while the event loop is stuck (see the module's doc). Not on a warm
        stop: the calls not started were given back, and the loop may stop turning while the runs end."""
        if self._closing.is_set() or not self.loop_stuck():
            if self._stalled:
                self._stalled = False
                logger.warning("redisdelay: the worker's event loop turns again; its calls are renewed again")
            return calls
        running = running_ids()
        kept = [call for call in calls if call[0] in running]
        if len(kept) < len(calls) and not self._stalled:  # a stall that holds nothing back (a reconnection) is not told
            self._stalled = True
            logger.warning(
                "redisdelay: the worker's event loop has not turned for %.0f s; the %d call(s) it received and "
                "has not started are no longer renewed, so that another worker runs them. The loop is at:\n%s",
                self.clock() - (self.turned or 0.0),
                len(calls) - len(kept),
                self._where_the_loop_is(),
            )
        return kept

    def _where_the_loop_is(self) -> str:
        """The stack of the event loop's thread, for the log."""
        frame = sys._current_frames().get(self._loop[1]) if self._loop else None
        return "".join(traceback.format_stack(frame)) if frame is not None else "(not found)"

    def _forget_finished(self) -> None:
        """Forget the calls received more than a renewal period ago of which Celery no longer has a request."""
        grace = self.clock() - self.renewal
        known = known_ids()
        if known is None:
            return  # not read this time: forgotten at the next renewal
        for call_id in [call_id for call_id, held in self.held.items() if held.received < grace]:
            if call_id not in known:
                del self.held[call_id]

    def _hold(self, calls: Sequence[tuple[str, str]], renewal: bool) -> bool:
        """Write the leases of ``calls``, per shard and in steps; whether every write reached Redis. A renewal
        also says how many calls the worker holds on each shard (a take leaves that to the next renewal)."""
        by_store = self.depot.shards.by_home(calls)
        if renewal:  # a shard whose calls all finished hears that this worker holds none there
            for store in self.depot.shards.all():
                by_store.setdefault(store.keys.tag, (store, []))
        ok = True
        for store, held in by_store.values():
            try:
                total = len(held) if renewal else -1
                if not held:
                    store.lease(self.worker, self.lease_ms, [("", "")], total)
                for start in range(0, len(held), LARGEST_STEP):
                    store.lease(self.worker, self.lease_ms, held[start : start + LARGEST_STEP], total)
            except RedisDelayError as exc:
                ok = False
                if not self._outage:
                    self._outage = True
                    logger.warning(
                        "redisdelay: could not renew the leases of %d call(s); the worker keeps running them and "
                        "renews when Redis answers (a call whose lease runs out meanwhile may run twice): %s",
                        len(held),
                        exc,
                    )
        if ok and self._outage and renewal:
            self._outage = False
            logger.warning("redisdelay: Redis answers again; the leases of %d call(s) are renewed", len(calls))
        return ok

    # -- stopping -------------------------------------------------------------------------------------------

    def close(self, running: Iterable[str]) -> None:
        """The worker stops warmly: give back the calls that have not started (``running``: those that have),
        and keep renewing the running ones until they end."""
        self._closing.set()
        still = set(running)
        with self._lock:
            given = [(call_id, held.tag) for call_id, held in self.held.items() if call_id not in still]
            for call_id, _ in given:
                del self.held[call_id]
        # Where kombu keeps no copy of the store's deliveries (redisdelay_skip_unacked), the channel's close puts
        # them back through the store once the worker no longer fetches (worker/unacked.py): putting them back
        # now would let this worker's last fetch take them again. kombu puts back the others.
        skip = self.depot.skipping_unacked
        for store, calls in self.depot.shards.by_home(given).values():
            kept = [call for call in calls if not (skip and store_delivery(*call))]
            for start in range(0, len(kept), LARGEST_STEP):
                try:
                    store.give_back(self.worker, self.lease_ms, kept[start : start + LARGEST_STEP])
                except RedisDelayError as exc:
                    logger.warning("redisdelay: could not give back %d call(s); they run again: %s", len(kept), exc)
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()


def running_ids() -> set[str]:
    """The ids of the requests this worker is running."""
    return {request.id for request in running_requests()}


def delivery_tag(request: Any) -> str:
    """kombu's delivery tag of a request's message, or ``""``."""
    message = getattr(request, "message", None) or getattr(request, "_message", None)
    tag = getattr(message, "delivery_tag", None)
    return str(tag) if tag is not None else ""
