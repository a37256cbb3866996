"""The steps the extension adds to every worker of an app: leases on the calls it holds (and the worker's heartbeat
for the probe), a precise releaser thread, durable revokes, parking the eta messages the worker receives, and
(``redisdelay_skip_unacked``) kombu's unacked bookkeeping left out for the calls the store released.

``RedisDelay(app)`` adds them to ``app.steps["worker"]`` (the last to ``app.steps["consumer"]``) by name; each
finds the app's extension when the worker starts and hands the layers below it what they need.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from celery import bootsteps, signals
from celery.utils.functional import maybe_list

from . import patching
from .extension import RedisDelay
from .message.marks import received_from_store
from .release.precise import PreciseReleasers
from .worker.broker_loss import guard as guard_broker_loss
from .worker.contract import check_tasks
from .worker.leases import TURN_SECONDS, Leases, delivery_tag, running_ids
from .worker.pausing import PausedCalls
from .worker.probe import Heartbeat, ProbedLeases
from .worker.received import ReceivedParking
from .worker.stale import StaleDeliveries
from .worker.tracking import drop_revoked, parks_calls_of
from .worker.unacked import install as skip_unacked

logger = logging.getLogger(__name__)

#: The attribute of the worker (Celery's ``WorkController``) that holds its leases, for its consumer's steps.
LEASES = "redisdelay_leases"


def name_worker(worker: Any) -> str:
    """Give the app's depot in this process the worker's hostname, the one name its leases, its stale-delivery
    checks and its runs' starts use; called as the worker's steps are made, before its pool starts."""
    depot = RedisDelay.of(worker.app).depot
    depot.worker_name = name = str(worker.hostname or "")
    return name


class LeaseStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """The worker's main process holds the calls it receives under leases (:mod:`celery_redisdelay.worker.leases`),
    taken and renewed in batches by a thread. On a warm stop the calls not started are given back; the thread
    renews the running ones until they end. Another thread writes the worker's heartbeat for the probe
    (:mod:`celery_redisdelay.worker.probe`)."""

    label = "redisdelay leases"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        name_worker(worker)
        self.leases: Leases | None = None
        self.thread: threading.Thread | None = None
        self.heartbeat: Heartbeat | None = None

    def start(self, worker: Any) -> None:
        depot = RedisDelay.of(worker.app).depot

        def owns(request: Any) -> bool:
            return parks_calls_of(depot, getattr(request, "task", None))

        leases = self.leases = ProbedLeases(depot, name_worker(worker), owns)

        def on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
            # The mark first: a call never parked (most, in redisdelay_all_tasks mode) has nothing to hold.
            if request is None or not received_from_store(request):
                return
            if getattr(sender, "app", None) is depot.app and owns(request):
                leases.received(request.id, delivery_tag(request))

        signals.task_received.connect(on_received, weak=False, dispatch_uid=f"redisdelay-leases-{id(self)}")
        self.watch_the_loop(worker, leases)
        self.thread = threading.Thread(target=leases.run, name="redisdelay-leases", daemon=True)
        self.thread.start()
        self.heartbeat = Heartbeat(depot, name_worker(worker), leases, worker)
        threading.Thread(target=self.heartbeat.run, name="redisdelay-probe", daemon=True).start()

    def watch_the_loop(self, worker: Any, leases: Leases) -> None:
        """Note the runs that hold the thread of the worker's event loop, for the leases to tell a stuck loop
        (see :mod:`celery_redisdelay.worker.leases`); :class:`LoopTurnStep` notes its turns."""
        setattr(worker, LEASES, leases)
        uid = f"redisdelay-loop-{id(self)}"
        signals.task_prerun.connect(lambda **_: leases.run_in_loop(True), weak=False, dispatch_uid=uid)
        signals.task_postrun.connect(lambda **_: leases.run_in_loop(False), weak=False, dispatch_uid=uid)

    def stop(self, worker: Any) -> None:
        signals.task_received.disconnect(dispatch_uid=f"redisdelay-leases-{id(self)}")
        signals.task_prerun.disconnect(dispatch_uid=f"redisdelay-loop-{id(self)}")
        signals.task_postrun.disconnect(dispatch_uid=f"redisdelay-loop-{id(self)}")
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.leases is not None:
            self.leases.close(running_ids())

    terminate = stop  # a cold stop too: kombu puts the messages of the calls not started back in the queue


class LoopTurnStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """The worker's event loop notes each turn for the leases (:meth:`Leases.loop_turns`), by a timer entry made
    each time the consumer starts: Celery before 5.7 clears the loop's timer when a connection is lost. Pools
    without an event loop (eventlet, gevent) are not watched."""

    label = "redisdelay loop turns"

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.entry: Any = None

    def start(self, consumer: Any) -> None:
        leases: Leases | None = getattr(consumer.controller, LEASES, None)
        hub = getattr(consumer, "hub", None)
        if leases is None or hub is None:
            return
        self.stop(consumer)
        leases.loop_turns()
        self.entry = hub.call_repeatedly(TURN_SECONDS, leases.loop_turns)

    def stop(self, consumer: Any) -> None:
        if self.entry is not None:
            self.entry.cancel()
            self.entry = None


class PreciseReleaseStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """Runs a precise releaser (:mod:`celery_redisdelay.release.precise`) in a thread of each worker, unless
    ``redisdelay_precise_release`` is False: it releases calls as they fall due (at a tick's pace by default, as each
    falls due with True) and sweeps those whose lease ran out, so that an app keeps its calls' contract with no beat
    running."""

    label = "redisdelay releaser"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.releaser: PreciseReleasers | None = None
        self.thread: threading.Thread | None = None

    def start(self, worker: Any) -> None:
        rd = RedisDelay.of(worker.app)
        if not rd.settings.workers_release:
            return
        precise = rd.settings.precise_release is True  # None: a tick's pace, see release/precise.py
        self.releaser = PreciseReleasers(
            rd.releasers, longest_sleep=1.0 if precise else rd.settings.tick_interval, chase=precise
        )
        self.thread = threading.Thread(target=self.releaser.run, name="redisdelay-releaser", daemon=True)
        self.thread.start()

    def stop(self, worker: Any) -> None:
        if self.releaser is not None and self.thread is not None:
            self.releaser.stop()
            self.thread.join(self.releaser.longest_sleep + 5)

    # A cold stop too (Celery's in-process test worker stops that way): a releaser left running would release
    # calls for a worker that is gone.
    terminate = stop


def make_revokes_durable() -> None:
    """Wrap the worker's ``revoke`` remote-control command (once per process): after Celery's own
    handling, calls of an app with celery-redisdelay that are still parked are dropped for good (Celery
    keeps revoked ids in worker memory only, for three hours, and a parked call may wait longer).

    Celery looks its control commands up in the registry ``Panel.data`` when a broadcast arrives; the
    wrapper stays there for the life of the worker process and defers to Celery's handler first.
    """
    from celery.worker.control import Panel

    if patching.applied(Panel.data, "revoke", items=True):
        return
    original = Panel.data["revoke"]

    def revoke(state: Any, task_id: Any, *args: Any, **kwargs: Any) -> Any:
        reply = original(state, task_id, *args, **kwargs)
        rd = RedisDelay.registered(getattr(state, "app", None))
        if rd is not None:
            ids = [str(one) for one in maybe_list(task_id) or []]
            try:
                dropped = drop_revoked(rd.depot, ids)
            except Exception as exc:  # noqa: BLE001 - the worker's revoke has happened; the release discards it
                logger.warning("redisdelay: could not drop revoked calls %s from the delay set: %r", ids, exc)
            else:
                if dropped:
                    logger.info("redisdelay: dropped %d revoked parked call(s): %s", dropped, ", ".join(ids))
        return reply

    revoke.__doc__ = original.__doc__
    patching.apply("revoke", Panel.data, {"revoke": revoke}, items=True)


class DurableRevokeStep(bootsteps.Step):  # type: ignore[misc]  # Celery is untyped
    """A worker step that makes ``revoke`` durable for parked calls (see :func:`make_revokes_durable`)."""

    label = "redisdelay revokes"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        make_revokes_durable()


class MessageHandlerStep(bootsteps.Step):  # type: ignore[misc]  # Celery is untyped
    """Steps ahead of each task's message handler in the worker's main process, put on before its consumer makes
    the handlers, in this order (:mod:`celery_redisdelay.patching`), the last one looking first:

    1. with ``redisdelay_park_received`` (or ``redisdelay_all_tasks``), the eta messages the worker receives for the
       app's tasks are parked instead of held (:mod:`celery_redisdelay.worker.received`);
    2. a redelivered message of a parked call that is not the call's current delivery is dropped
       (:mod:`celery_redisdelay.worker.stale`);
    3. the calls of paused tasks and queues are held back in the store (:mod:`celery_redisdelay.worker.pausing`),
       before anything else looks at them.

    One step puts on all three: as three steps, Celery's blueprint made them in no fixed order."""

    label = "redisdelay message handlers"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        rd = RedisDelay.of(worker.app)
        depot, tasks = rd.depot, worker.app.tasks
        if rd.settings.park_received:
            count = ReceivedParking(depot, rd.rules_of).install(tasks)
            logger.info("redisdelay: eta messages of %d task(s) are parked when received", count)
        owns = functools.partial(parks_calls_of, depot)
        StaleDeliveries(depot, owns, name_worker(worker)).install(tasks)
        PausedCalls(depot, rd.rules_of, owns, name_worker(worker)).install(tasks)


class ContractStep(bootsteps.Step):  # type: ignore[misc]  # Celery is untyped
    """A task's bad ``redisdelay_worker_lost`` (:mod:`celery_redisdelay.worker.contract`) stops the worker at start,
    naming the task and the allowed values."""

    label = "redisdelay contracts"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        depot = RedisDelay.of(worker.app).depot
        owns = functools.partial(parks_calls_of, depot)
        check_tasks([task for task in list(worker.app.tasks.values()) if owns(task)], depot.settings.worker_lost)


class SkipUnackedStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """Unless ``redisdelay_skip_unacked`` is False, the worker's task channel leaves kombu's unacked bookkeeping
    out for the calls the store released (:mod:`celery_redisdelay.worker.unacked`). A step of the consumer: its
    channel is made again on each connection, and set up again with it. Only where the broker is the store's
    Redis: there the sweep finds a call its worker popped and died with before its lease was taken. Elsewhere
    kombu keeps its bookkeeping, with a warning where the setting is True.

    Whatever the setting, the channel first gets the guard that keeps a lost broker connection from ending the
    worker (:mod:`celery_redisdelay.worker.broker_loss`), under the bookkeeping's own restore: this step is the
    one that sets up each new task channel."""

    label = "redisdelay skip unacked"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, consumer: Any) -> None:
        depot = RedisDelay.of(consumer.app).depot
        channel = getattr(getattr(consumer, "task_consumer", None), "channel", None)
        if channel is not None:
            guard_broker_loss(channel)
        wanted = depot.settings.skip_unacked
        if wanted is False:
            return
        if depot.fast_release and channel is not None and skip_unacked(channel, depot):
            depot.skipping_unacked = True
        elif wanted:
            logger.warning(
                "redisdelay: redisdelay_skip_unacked is True, but the broker is not the store's Redis through "
                "kombu's Redis transport; kombu keeps its bookkeeping"
            )
