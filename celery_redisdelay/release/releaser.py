"""Releasing due calls to the broker, and sweeping calls whose deadline passed.

Each step is one bounded script call; the loops here repeat them until nothing is left or the time
budget is spent (the next tick carries on). A bad entry is dead-lettered and the loop goes on; a
broker that refuses a publish gives the unpublished calls back and ends the loop with the error.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amqp.exceptions import MessageNacked
from celery.utils import uuid
from celery.utils.time import maybe_iso8601, maybe_make_aware
from kombu.exceptions import OperationalError
from kombu.utils import json

from ..errors import RedisDelayError
from ..message import wire
from ..message.envelope import Envelope, EnvelopeError
from ..message.marks import DELIVERY_HEADER, PARKED_HEADER, RELEASED_HEADER
from ..message.stored import BatchCall, decode_stored
from ..producer.batch import BatchedTask
from ..producer.task import DelayedTask
from ..store.base import RedisError
from ..store.broker_lists import push
from ..store.meta import CallMeta, Limits
from .confirms import CallRefused, ConfirmingPublisher, refusal

if TYPE_CHECKING:
    from celery import Celery

    from ..settings import Settings
    from ..store.calls import CallStore, Claimed, Released
    from ..store.depot import Depot

#: ``app.send_task`` as Celery has it (not as the extension puts it over the app, parking delayed calls).
SendTask = Callable[..., Any]

logger = logging.getLogger(__name__)

#: How long one tick may keep releasing before it leaves the rest to the next tick.
TICK_BUDGET_SECONDS = 10.0
#: Most items one flush takes from a group whose task this app does not know.
UNKNOWN_GROUP_SIZE = 1000


@dataclass
class TickReport:
    """What one tick did."""

    released: int = 0
    requeued: int = 0
    dead: int = 0
    batches: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"released": self.released, "requeued": self.requeued, "dead": self.dead, "batches": self.batches}


def publish(app: Celery, producer: Any, envelope: Envelope) -> None:
    """Publish a parked message to the broker as Celery itself would have (``send_task_message``)."""
    queues = app.amqp.queues
    declare = [queues[name] for name in envelope.queues]
    properties = dict(envelope.properties)
    if properties.get("expiration") is not None and envelope.headers.get("expires"):
        # A TTL relative to now, from the absolute expiry, as Celery's send_task computes it: the one
        # computed at the call is stale by now (and a broker such as RabbitMQ acts on it).
        left = (maybe_make_aware(maybe_iso8601(envelope.headers["expires"])) - app.now()).total_seconds()
        properties["expiration"] = max(0.0, left)
    producer.publish(
        envelope.body,
        exchange=envelope.exchange,
        routing_key=envelope.routing_key,
        content_type=envelope.content_type,
        content_encoding=envelope.content_encoding,
        headers=envelope.headers,
        declare=declare,
        delivery_mode=envelope.delivery_mode,
        retry=envelope.retry,
        retry_policy=envelope.retry_policy,
        **properties,
    )


def publish_batch(app: Celery, send_task: SendTask, producer: Any, call_id: str, batch: BatchCall) -> None:
    """Publish a flushed batch as the call ``task(key, items)``, as Celery would, routed like the task's
    other calls."""
    task = app.tasks.get(batch.task)
    if not isinstance(task, BatchedTask):
        raise EnvelopeError(
            f"batched task {batch.task!r} is not registered in this app; import its module in the worker that "
            "runs the tick, then requeue the call"
        )
    send_task(
        batch.task,
        args=(batch.key, batch.items),
        task_id=call_id,
        producer=producer,
        headers={PARKED_HEADER: 1},
        **task.routing_options,
    )


def publish_call(
    app: Celery,
    send_task: SendTask,
    producer: Any,
    call_id: str,
    payload: bytes,
    deliveries: int = 1,
    released_ms: int | None = None,
) -> None:
    """Publish one stored call: an envelope as it is, a flushed batch as the task's message (through
    ``send_task``, Celery's own), with the headers that say it was parked, which delivery it is and when it was
    released (``released_ms``, the store's clock; see :mod:`..message.marks`). A later delivery also carries
    ``redelivered`` and ``x-delivery-count`` (the deliveries before it) in its headers; kombu writes
    ``delivery_info`` itself on this path."""
    stored = decode_stored(payload)
    if isinstance(stored, BatchCall):
        publish_batch(app, send_task, producer, call_id, stored)
        return
    if stored.headers.get("id", call_id) != call_id:
        raise EnvelopeError(f"the stored message is call {stored.headers['id']}'s, not this call's")
    marks: dict[str, Any] = {PARKED_HEADER: 1, DELIVERY_HEADER: deliveries}  # the worker tracks the run
    if released_ms is not None:
        marks[RELEASED_HEADER] = released_ms
    if deliveries > 1:
        marks.update({"redelivered": True, "x-delivery-count": deliveries - 1})
    stored = dataclasses.replace(stored, headers={**marks, **stored.headers})
    publish(app, producer, stored)


def broker_errors(producer: Any) -> tuple[type[BaseException], ...]:
    """Errors that mean the broker or Redis failed, not the entry being published: they stop the batch."""
    connection = producer.connection
    return (
        OperationalError,
        OSError,
        RedisError,
        RedisDelayError,
        *connection.connection_errors,
        *connection.channel_errors,
    )


@dataclass(frozen=True)
class BrokerRoute:
    """How a releaser's calls reach the broker, as its app's broker and store have it.

    ``lists``: the broker's queue lists stored messages may go to (None: every call goes through kombu);
    ``in_script``: the release script pushes them itself (the broker is the store's server); ``unacked``: kombu's
    unacked hash and index, where the broker is the store's Redis; ``confirms``: whether releases wait for the
    broker's confirm (an AMQP broker: see :mod:`.confirms`).
    """

    lists: list[str] | None = None
    in_script: bool = True
    unacked: tuple[str, str] | tuple[()] = ()
    confirms: bool = False

    @classmethod
    def of(cls, depot: Depot) -> BrokerRoute:
        """The route of ``depot``'s app: its broker's lists where parked calls are stored as broker messages, pushed
        by the release script itself (with kombu's unacked keys) where the broker is the store's Redis."""
        lists = depot.broker_layout.list_keys(depot.app) if depot.wire_format else None
        return cls(
            lists,
            in_script=depot.fast_release,
            unacked=depot.broker_layout.unacked_keys() if depot.fast_release else (),
            confirms=depot.amqp_broker,
        )


class Releaser:
    """Moves due calls from one shard's store to the broker, by ``route``. ``send_task`` is Celery's own (a flushed
    batch is published through it)."""

    def __init__(
        self,
        app: Celery,
        store: CallStore,
        settings: Settings,
        route: BrokerRoute | None = None,
        new_id: Callable[[], str] = uuid,
        send_task: SendTask | None = None,
    ) -> None:
        route = route or BrokerRoute()
        self.app = app
        self.store = store
        self.settings = settings
        self.send_task: SendTask = send_task or app.send_task
        # The broker's queue lists stored messages may go to (None: every call goes through kombu);
        # ``in_script``: the release script pushes them itself (the broker is the store's server).
        self.lists = route.lists
        self.in_script = route.in_script and route.lists is not None
        self._wire_lists = frozenset(route.lists or ())
        #: What the last release script said (the fast path): when to look again, whether a batch group is due.
        self.last_release: Released | None = None
        self.new_id = new_id  # ids of flushed batches: they must belong to this store's shard
        #: kombu's unacked hash and index, where the broker is the store's Redis: a swept call's held delivery
        #: leaves them, so kombu does not restore it too, and a call popped by a worker that died before it
        #: held the call is swept a lease later (sweep.lua).
        self.unacked = route.unacked
        #: Whether releases wait for the broker's confirm (an AMQP broker: see :mod:`.confirms`).
        self.confirms = route.confirms and route.lists is None

    # Each step is one bounded script call and says whether more may be left.

    def sweep_step(self, report: TickReport) -> bool:
        batch = self.settings.release_batch
        lease_ms = round(self.settings.lease * 1000)
        lists = self.lists if self.in_script and self.lists is not None else []
        queue_ms = round(self.settings.queue_timeout * 1000)
        requeued, dead = self.store.sweep(batch, self.settings.max_deliveries, self.unacked, lease_ms, lists, queue_ms)
        report.requeued += requeued
        report.dead += dead
        return requeued + dead >= batch

    def release_step(self, report: TickReport) -> bool:
        batch = self.settings.release_batch
        claim_ms = round(self.settings.claim_timeout * 1000)
        # One script either way: it pushes what it can onto the broker's lists where the broker is the store's
        # Redis, and claims the rest for publishing here; calls under limits wait in it on every path.
        queue_ms = round(self.settings.queue_timeout * 1000)
        lists = self.lists if self.in_script and self.lists is not None else []
        # The claims end claim_timeout after the script ran: after this moment, so never sooner than this says.
        claim_ends = time.monotonic() + self.settings.claim_timeout
        self.last_release = self.store.release(batch, claim_ms, queue_ms, lists)
        claimed, examined, pushed = self.last_release[:3]
        report.released += pushed
        report.dead += examined - pushed - len(claimed)  # due ids without payload, buried by the script
        if claimed:
            report.released += self._publish_batch(claimed, report, claim_ends)
        return examined >= batch

    def flush_step(self, report: TickReport) -> bool:
        """Turn batch groups whose first item has waited their max wait into calls, due now."""
        batch = self.settings.release_batch
        groups = self.store.due_groups(batch)
        for group in groups:
            size, meta = self._group_limits(group)
            if self.store.batch_flush(group, size, self.new_id(), meta):
                report.batches += 1
        return len(groups) >= batch

    def sweep(self, report: TickReport, deadline: float) -> None:
        while time.monotonic() < deadline and self.sweep_step(report):
            pass

    def release(self, report: TickReport, deadline: float) -> None:
        while time.monotonic() < deadline and self.release_step(report):
            pass

    def flush_batches(self, report: TickReport, deadline: float) -> None:
        while time.monotonic() < deadline and self.flush_step(report):
            pass

    def _pushable(self, call: Claimed) -> bytes | None:
        """The broker message of a call stored in the broker's format, for one of the app's lists."""
        if call.list_key not in self._wire_lists:
            return None
        return wire.message_for(call.id, call.envelope, call.deliveries)

    def _push(self, producer: Any, calls: list[tuple[Claimed, bytes]]) -> tuple[list[str], Exception | None]:
        """LPUSH stored broker messages onto their lists, one pipeline for the lot (the wire path).

        Returns the ids pushed and the first refusal (say, the broker out of memory part-way through).
        """
        with producer.channel.conn_or_acquire() as client:
            # kombu's own connection pool (its TLS and Sentinel settings), but not its client: with
            # global_keyprefix that one prefixes every key, and the list names here are whole already.
            replies = push(client.connection_pool, [(call.list_key, message) for call, message in calls])
        refusals = [reply for reply in replies if isinstance(reply, Exception)]
        pushed = [call.id for (call, _), reply in zip(calls, replies, strict=True) if not isinstance(reply, Exception)]
        return pushed, refusals[0] if refusals else None

    def _publish_batch(self, claimed: list[Claimed], report: TickReport, claim_ends: float) -> int:
        """Publish claimed calls: through kombu one by one, then those stored as broker messages in one
        pipeline. A bad entry is dead-lettered; a broker failure gives back what was not published, and so does a
        claim that runs short (:meth:`_time_left`)."""
        pushable = [(call, message) for call in claimed if (message := self._pushable(call)) is not None]
        pushed_ids = {call.id for call, _ in pushable}
        through_kombu = [call for call in claimed if call.id not in pushed_ids]
        published: list[str] = []
        doubtful: list[str] = []  # published, the broker failing before it confirmed
        handled: set[str] = set()  # published or dead-lettered
        try:
            if through_kombu and self.confirms:
                self._publish_confirmed(through_kombu, report, published, handled, doubtful, claim_ends)
                through_kombu = []
            with self.app.producer_or_acquire() as producer:
                fatal = broker_errors(producer)
                for call in through_kombu:
                    if self._time_left(claim_ends) <= 0:
                        break
                    if self._publish_or_bury(producer, fatal, call, report):
                        published.append(call.id)
                    handled.add(call.id)
                if pushable and self._time_left(claim_ends) > 0:
                    try:
                        pushed, refusal = self._push(producer, pushable)
                    except RedisError as exc:
                        raise OperationalError(f"cannot push to the broker: {exc}") from exc
                    published.extend(pushed)
                    handled.update(pushed)
                    if refusal is not None:
                        raise OperationalError(f"the broker refused a push: {refusal}") from refusal
        except Exception:
            # The broker (or Redis) failed: what was not published goes back now rather than after the
            # claim timeout. If Redis itself is gone, the sweep returns it later.
            self._give_back(claimed, handled)
            raise
        finally:
            self._confirm(claimed, published, doubtful)
        if len(handled) < len(claimed):
            short = self._give_back(claimed, handled)
            logger.warning("redisdelay: %d calls given back: their claim ran short (a slow broker?)", short)
        return len(published) + len(doubtful)

    def _time_left(self, claim_ends: float) -> float:
        """How long a publish may still wait for the broker before the claim it publishes ends, keeping a quarter of
        the claim timeout for recording the outcome. A claim that ran out puts the call back for another releaser,
        which delivers it again while this one's copy may still be in the broker (a first delivery is not checked
        against the store: both would run). So no call is published whose claim could run out before then."""
        return claim_ends - time.monotonic() - self.settings.claim_timeout / 4

    def _give_back(self, claimed: list[Claimed], handled: set[str]) -> int:
        """Give back the claimed calls not in ``handled`` (under their own claims only); how many there were."""
        pending = [call for call in claimed if call.id not in handled]
        try:
            self.store.unclaim(pending)
        except Exception:  # noqa: BLE001 - the caller's error, if any, is the one to report
            logger.warning("redisdelay: could not give back %d unpublished calls", len(pending))
        return len(pending)

    def _confirm(self, claimed: list[Claimed], published: list[str], doubtful: list[str]) -> None:
        """The calls published wait in the broker up to the queue timeout; those in doubt up to a lease: should the
        broker have lost one (a restart), it is delivered again within a lease, while one the broker kept is held by
        the worker that received it by then, under its own lease, and the sweep leaves it alone. Each under its own
        claim: one that ran out, claimed again by another releaser since, is the other's to confirm."""
        queue_timeout_ms = round(self.settings.queue_timeout * 1000)
        if published:
            chosen = set(published)
            self.store.confirm([call for call in claimed if call.id in chosen], queue_timeout_ms)
        if doubtful:
            chosen = set(doubtful)
            in_doubt = [call for call in claimed if call.id in chosen]
            self.store.confirm(in_doubt, queue_timeout_ms, longest_ms=round(self.settings.lease * 1000))

    def _publish_confirmed(
        self,
        calls: list[Claimed],
        report: TickReport,
        published: list[str],
        handled: set[str],
        doubtful: list[str],
        claim_ends: float,
    ) -> None:
        """Publish ``calls`` to an AMQP broker, each confirmed by it (:mod:`.confirms`). A call it refuses, or a bad
        entry, is dead-lettered and the others go on; a broker failure is raised. A call whose outcome the failure
        left unknown (the broker may have taken it) goes in ``doubtful``: it counts as published, with a lease's
        deadline rather than the queue timeout, so that should the broker have lost it (a restart), the sweep
        delivers it again within a lease, as a later delivery; sent again now as the same delivery, both copies
        could run. Each waits for its confirm no longer than its claim allows (:meth:`_time_left`); the calls whose
        claim runs short are left unhandled, for the caller to give back."""
        with ConfirmingPublisher(self.app, self.settings.claim_timeout / 2) as publisher:
            fatal = broker_errors(publisher.producer)
            for call in calls:
                left = self._time_left(claim_ends)
                if left <= 0:
                    return  # the rest go back (_publish_batch)
                publisher.producer.confirm_timeout = min(self.settings.claim_timeout / 2, left)
                try:
                    publish_call(
                        self.app,
                        self.send_task,
                        publisher.producer,
                        call.id,
                        call.envelope,
                        call.deliveries,
                        self._released_ms(),
                    )
                    publisher.check(call.id)
                except MessageNacked as exc:  # the broker says it did not take it: a failure, the call goes back
                    raise OperationalError(f"the broker did not take call {call.id} (nack)") from exc
                except Exception as exc:
                    reason = str(exc) if isinstance(exc, (CallRefused, EnvelopeError)) else refusal(exc)
                    if reason is None and isinstance(exc, fatal):
                        doubtful.append(call.id)  # the outcome is unknown (see above)
                        logger.warning(
                            "redisdelay: call %s (delivery %d) was published but not confirmed (%r): it counts as"
                            " delivered, and is delivered again after a lease if the broker lost it",
                            call.id,
                            call.deliveries,
                            exc,
                        )
                        handled.add(call.id)
                        raise
                    if not isinstance(exc, (CallRefused, EnvelopeError)):
                        publisher.renew()  # the refusal closed the channel (or left it in doubt)
                    reason = reason or f"cannot publish: {exc!r}"
                    logger.error("redisdelay: dead-lettering call %s: %s", call.id, reason)
                    if self.store.bury(call.id, reason, only_inflight=True):
                        report.dead += 1
                else:
                    published.append(call.id)
                handled.add(call.id)

    def _publish_or_bury(
        self, producer: Any, fatal: tuple[type[BaseException], ...], call: Claimed, report: TickReport
    ) -> bool:
        """Publish ``call`` through kombu; whether it was. A bad entry is dead-lettered (one bad entry must not stop
        the others); a broker failure is raised."""
        try:
            publish_call(
                self.app, self.send_task, producer, call.id, call.envelope, call.deliveries, self._released_ms()
            )
            return True
        except fatal:
            raise
        except Exception as exc:  # noqa: BLE001 - the entry's, or the pooled producer's: tried afresh to tell
            failure = exc if isinstance(exc, EnvelopeError) else self._publish_afresh(call)
        if failure is None:
            return True
        reason = str(failure) if isinstance(failure, EnvelopeError) else f"cannot publish: {failure!r}"
        logger.error("redisdelay: dead-lettering call %s: %s", call.id, reason)
        if self.store.bury(call.id, reason, only_inflight=True):
            report.dead += 1
        return False

    def _publish_afresh(self, call: Claimed) -> Exception | None:
        """Publish ``call`` once more on a connection of its own, after an error that may be the pooled producer's, not
        the call's: a kombu channel left broken by a lost connection (in a worker, whose consumer reconnects meanwhile)
        raises an ``AttributeError`` from inside kombu. None if it was published; else the error, the call's. A broker
        failure on the fresh connection is raised, as on the pooled one."""
        with self.app.connection_for_write() as connection:
            producer = self.app.amqp.Producer(connection)
            try:
                publish_call(
                    self.app, self.send_task, producer, call.id, call.envelope, call.deliveries, self._released_ms()
                )
            except broker_errors(producer):
                raise
            except Exception as exc:  # noqa: BLE001 - the call's own error: the caller dead-letters it
                return exc
        return None

    def _released_ms(self) -> int | None:
        """When the calls being published were released: the store's clock as the release script read it."""
        return self.last_release.now_ms if self.last_release is not None else None

    def _group_limits(self, group: str) -> tuple[int, Limits | CallMeta]:
        """The size and call limits of a group's task; defaults when this app does not know the task
        (the flushed call is then dead-lettered at release, saying so, with its items kept)."""
        try:
            name = json.loads(group)[0]
        except (ValueError, TypeError, KeyError, IndexError):
            name = None
        task = self.app.tasks.get(name) if isinstance(name, str) else None
        if isinstance(task, BatchedTask):
            return task.batch_size, task.call_limits()
        if isinstance(task, DelayedTask):
            return UNKNOWN_GROUP_SIZE, task.call_limits()
        return UNKNOWN_GROUP_SIZE, CallMeta(t=name if isinstance(name, str) else "?")

    def tick(self, budget: float = TICK_BUDGET_SECONDS) -> TickReport:
        """Sweep, flush due batch groups, then release, within ``budget`` seconds."""
        return tick_all([self], budget)


class Releasers:
    """A :class:`Releaser` for each shard of ``depot``, made once per shard (and again when the shards
    change). ``send_task`` is Celery's own, for flushed batches."""

    def __init__(self, depot: Depot, send_task: SendTask) -> None:
        self.depot = depot
        self.send_task = send_task
        self._made: dict[str, Releaser] = {}

    def of(self, store: CallStore) -> Releaser:
        """The releaser of one shard."""
        made = self._made.get(store.tag)
        if made is None or made.store is not store:
            depot = self.depot
            route = BrokerRoute.of(depot)
            made = Releaser(
                depot.app,
                store,
                depot.settings,
                route,
                new_id=lambda: depot.shards.new_id(store),
                send_task=self.send_task,
            )
            self._made[store.tag] = made
        return made

    def every(self) -> list[Releaser]:
        """A releaser for every shard, retired ones included."""
        return [self.of(store) for store in self.depot.shards.all()]

    def __iter__(self) -> Iterator[Releaser]:
        return iter(self.every())

    def tick(self, shards: Sequence[int] | None = None) -> TickReport:
        """Sweep timed-out calls and release due ones (the body of the ``redisdelay.tick`` task): on every
        shard, retired ones included, or on the configured shards of these indexes only."""
        chosen = self.every() if shards is None else [self.of(store) for store in self.depot.shards.pick(shards)]
        return tick_all(chosen)


def tick_all(releasers: Sequence[Releaser], budget: float = TICK_BUDGET_SECONDS) -> TickReport:
    """Sweep, flush due batch groups, then release, over every shard in turns, within ``budget`` seconds.

    A shard that fails (its Redis node is down) is left out of the rest of the tick; the others carry
    on, and the first error is raised at the end, so the tick still shows as failed.
    """
    report = TickReport()
    deadline = time.monotonic() + budget
    failed: list[Exception] = []
    pending = list(releasers)
    for step in (Releaser.sweep_step, Releaser.flush_step, Releaser.release_step):
        active = list(pending)
        while active and time.monotonic() < deadline:
            still = []
            for releaser in active:
                try:
                    if step(releaser, report):
                        still.append(releaser)
                except Exception as exc:  # raised below, after the other shards had their turn
                    if len(releasers) == 1:
                        raise
                    logger.error("redisdelay: shard %s failed: %r", releaser.store.tag, exc)
                    failed.append(exc)
                    pending.remove(releaser)
            active = still
    if failed:
        raise failed[0]
    return report
