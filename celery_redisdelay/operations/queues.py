"""Queue latency: per queue, the calls ready in the broker's lists and how long the oldest has waited there, and
the store's own part (calls in flight, paused, held by limits; how late releases are). For ``rd.queues()``, the
exporter, ``status``, the dashboard and its JSON endpoint for autoscalers (KEDA's ``metrics-api`` scaler).

**Ready.** kombu's Redis transport keeps a queue in one list per priority step (``queue``, ``queue\\x06\\x163``,
... under ``global_keyprefix``): it ``LPUSH``-es a message and ``BRPOP``-s the next, so each list's next and
oldest message is at index -1 (a message kombu restores is ``RPUSH``-ed there too: it goes next). Per queue, each
list costs one ``LLEN`` and one ``LRANGE key -1 -1``, in one pipeline for all queues: bounded, whatever the backlog.
A broker that is not a Redis (RabbitMQ) gives no ``ready`` here (None).

**When a call became ready** (``oldest_ready_seconds`` counts from it), read from the oldest message of each list,
the first that applies:

1. its ``x-redisdelay-released`` header (:data:`~celery_redisdelay.message.marks.RELEASED_HEADER`): a call the
   releaser published through kombu carries the time of its release;
2. a call the release script pushed as stored (the fast path) carries no such header: its bytes were written at
   park time. The store knows: its in-flight deadline is its release plus its queue timeout (``"q"``), as long as
   its metadata says it waits in the queue (phase ``queued``);
3. Celery's ``eta`` header (``x-redisdelay-eta`` for a parked call the store no longer knows): the call was due
   then, and could not start earlier;
4. nothing else: a message Celery sent itself carries no send time (Celery's task message has none), so a list
   whose oldest message is such a call gives no age.

Not the due time, nor Celery's eta, for a parked call: it waited in the store until its release (release lag,
reported on its own), which is not time in the queue. An empty queue's oldest age is 0; None means messages
wait and none says since when.

**The store's part** comes from the calls' metadata (the list a call goes to, ``"l"``, else its payload): the
in-flight calls (released and not finished: still in the list, or running), those set aside on a pause and those
held by their limits. Each set is read whole up to :data:`MOST_READ` entries per shard; a larger one in
:data:`SLICES` runs spread evenly over it, the counts scaled up to its size, and ``estimated`` says so.

**Release lag** (release time minus due time) is kept by the store per lateness bucket, for all queues together
(``releases.lua``), and per minute (``history``): p50 and p99 are over the last :data:`LAG_MINUTES` minutes, the
same for every queue.

The queues known are those tasks route to (``task_queues``, ``task_default_queue``, ``task_routes``, a task's
``queue``) and those seen in the store (a call's list, a paused queue).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..message.marks import ETA_HEADER, RELEASED_HEADER, delivered_from_store
from ..store.broker_lists import broker_lists
from ..store.calls import CallStore, redis_errors, text
from ..store.census import in_flight_with_meta, samples
from ..store.layout import LATENESS_BOUNDS_MS
from ..store.meta import CallMeta, decode_meta
from ..store.pauses import active_pauses
from ..store.registries import SLICES as SLICES  # runs a larger set's sample is read in, spread evenly over it
from .listing import server_ms
from .pausing import queue_lists
from .payloads import queue_of, queue_of_list

if TYPE_CHECKING:
    from celery import Celery

    from ..store.depot import Depot

#: Entries of each set (in flight, paused, held by limits) read per shard for the split by queue, at most.
MOST_READ = 1000
#: The window of the release lag's quantiles (minutes of the store's history).
LAG_MINUTES = 15
#: The list a call stored as a broker message goes to, in its metadata's text (a name without escapes).
_LIST_FIELD = re.compile(rb'[{,]"l":"([^"\\]*)"[,}]')
#: The figures of a queue, in the order tables show them.
FIELDS = (
    "ready",
    "oldest_ready_seconds",
    "in_flight",
    "paused",
    "held",
    "release_lag_p50_seconds",
    "release_lag_p99_seconds",
)


@dataclass
class QueueFigures:
    """One queue's figures (see the module's docstring)."""

    ready: int | None = None  # None: the broker is not a Redis
    oldest_ready_seconds: float | None = None  # 0 when nothing is ready; None when no ready message says since when
    in_flight: int = 0
    paused: int = 0
    held: int = 0
    release_lag_p50_seconds: float | None = None  # over all queues, the last LAG_MINUTES; None: nothing released
    release_lag_p99_seconds: float | None = None
    estimated: bool = False  # in_flight, paused, held scaled up from a sample of MOST_READ entries per shard and set

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Split:
    """The store's calls per queue and set, as read."""

    counts: dict[str, dict[str, float]] = field(default_factory=dict)  # queue -> set -> calls
    estimated: bool = False

    def add(self, queue: str, kind: str, calls: float) -> None:
        row = self.counts.setdefault(queue, {})
        row[kind] = row.get(kind, 0.0) + calls


def queues(depot: Depot, most_read: int = MOST_READ) -> dict[str, dict[str, Any]]:
    """Every known queue's figures, by name (``rd.queues()``)."""
    return {name: figures.as_dict() for name, figures in queue_figures(depot, most_read).items()}


def queue_figures(depot: Depot, most_read: int = MOST_READ) -> dict[str, QueueFigures]:
    """Every known queue's figures, by name, in name order."""
    now = server_ms(depot)
    split = store_split(depot, most_read)
    names = sorted(routed_queues(depot.app) | set(split.counts) | paused_queues(depot))
    ready = broker_ready(depot, names, now)
    p50, p99 = release_lag(depot)
    found = {}
    for name in names:
        counts = split.counts.get(name, {})
        count, oldest = ready.get(name, (0, 0.0)) if ready is not None else (None, None)
        found[name] = QueueFigures(
            ready=count,
            oldest_ready_seconds=oldest,
            in_flight=round(counts.get("inflight", 0)),
            paused=round(counts.get("paused", 0)),
            held=round(counts.get("gated", 0)),
            release_lag_p50_seconds=p50,
            release_lag_p99_seconds=p99,
            estimated=split.estimated,
        )
    return found


# -- which queues ---------------------------------------------------------------------------------------------


def routed_queues(app: Celery) -> set[str]:
    """The queues the app's tasks route to: ``task_queues`` (``app.amqp.queues``), ``task_default_queue``, the
    queues ``task_routes`` names in its mappings (a router function is not asked), and a task's own ``queue``
    option."""
    names = {str(app.conf.task_default_queue), *app.amqp.queues}
    routes = app.conf.task_routes
    for table in routes if isinstance(routes, list | tuple) else [routes]:
        if isinstance(table, dict):
            names.update(filter(None, (_queue_name(route) for route in table.values())))
    for task in app.tasks.values():  # Celery's own option, and a delayed task's (``@rd.delayed(queue=...)``)
        for route in (getattr(task, "queue", None), getattr(task, "routing_options", None)):
            names.update(filter(None, [_queue_name(route)]))
    return names


def _queue_name(route: Any) -> str | None:
    """The queue a route or a task's ``queue`` names: a name, a kombu ``Queue``, or a mapping with ``queue``."""
    if isinstance(route, dict):
        route = route.get("queue")
    if isinstance(route, str):
        return route or None
    name = getattr(route, "name", None)
    return name if isinstance(name, str) and name else None


def paused_queues(depot: Depot) -> set[str]:
    """The queues paused now, on any shard."""
    found: set[str] = set()
    for store in depot.shards.all():
        now_ms, records = store.pause_records()
        found.update(one.name for one in active_pauses(records, now_ms).values() if one.kind == "queue")
    return found


# -- the broker's lists ---------------------------------------------------------------------------------------


def broker_ready(depot: Depot, names: Sequence[str], now_ms: int) -> dict[str, tuple[int, float | None]] | None:
    """Per queue: the messages in its lists, and the age (s) of the oldest (see the module's docstring); None
    when the broker is not a Redis."""
    keys = [(name, key) for name in names for key in queue_lists(depot, name)]
    with broker_lists(depot) as lists:
        if not lists.redis:
            return None
        with redis_errors("read the broker's queue lists"):
            lengths = lists.lengths([key for _, key in keys])
            # The oldest message of the lists that hold any (most priority lists are empty): a second round trip
            # rather than an LRANGE for every list.
            held = [(name, key, size) for (name, key), size in zip(keys, lengths, strict=True) if _positive(size)]
            oldest = lists.oldest([key for _, key, _ in held])
    sizes: dict[str, int] = dict.fromkeys(names, 0)
    tails: list[tuple[str, Any]] = []
    for (name, _, size), tail in zip(held, oldest, strict=True):
        if isinstance(tail, list) and tail:  # else the list emptied meanwhile
            sizes[name] += size
            tails.append((name, tail[0]))
    since = ready_since(depot, [raw for _, raw in tails], now_ms)
    ages: dict[str, float | None] = {name: (0.0 if not sizes[name] else None) for name in names}
    for (name, _), ready_ms in zip(tails, since, strict=True):
        if ready_ms is not None:
            age = max(0.0, (now_ms - ready_ms) / 1000)
            known = ages[name]
            ages[name] = age if known is None else max(known, age)
    return {name: (sizes[name], ages[name]) for name in names}


def _positive(size: Any) -> bool:
    """Whether an LLEN reply counts messages (a key of another type answers with an error)."""
    return isinstance(size, int) and size > 0


def ready_since(depot: Depot, messages: Sequence[Any], now_ms: int) -> list[int | None]:
    """When each broker message became ready (ms by the store's clock), or None when it does not say."""
    parsed = [_message(raw) for raw in messages]
    wanted = [
        (index, headers["id"])
        for index, (headers, tag) in enumerate(parsed)
        if _released_header(headers) is None
        and isinstance(headers.get("id"), str)
        and delivered_from_store(headers["id"], tag, headers)
    ]
    stored = _in_flight_release(depot, [call_id for _, call_id in wanted])
    released = {index: stored.get(call_id) for index, call_id in wanted}
    found: list[int | None] = []
    for index, (headers, _) in enumerate(parsed):
        at = _released_header(headers)
        if at is None:
            at = released.get(index)
        if at is None:
            eta = _eta_ms(headers.get("eta") or headers.get(ETA_HEADER))
            at = None if eta is None else min(eta, now_ms)
        found.append(at)
    return found


def _message(raw: Any) -> tuple[dict[str, Any], Any]:
    """A kombu message's headers and delivery tag (empty when it is not one)."""
    try:
        message = json.loads(raw)
    except (ValueError, TypeError):
        return {}, None
    if not isinstance(message, dict):
        return {}, None
    headers, properties = message.get("headers"), message.get("properties")
    tag = properties.get("delivery_tag") if isinstance(properties, dict) else None
    return (headers if isinstance(headers, dict) else {}), tag


def _released_header(headers: dict[str, Any]) -> int | None:
    at = headers.get(RELEASED_HEADER)
    return at if isinstance(at, int) and not isinstance(at, bool) else None


def _eta_ms(value: Any) -> int | None:
    """An ISO 8601 eta in ms since the epoch; None when absent, unreadable or without a time zone (Celery writes
    one; a naive time is not guessed)."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return None if moment.tzinfo is None else round(moment.timestamp() * 1000)


def _in_flight_release(depot: Depot, call_ids: Sequence[str]) -> dict[str, int]:
    """When calls waiting in the queue were released (ms): their in-flight deadline minus their queue timeout."""
    by_store: dict[int, tuple[CallStore, list[str]]] = {}
    for call_id in call_ids:
        store = depot.shards.home(call_id)
        by_store.setdefault(id(store), (store, []))[1].append(call_id)
    default_ms = round(depot.settings.queue_timeout * 1000)
    found = {}
    for store, ids in by_store.values():
        with redis_errors("read the in-flight calls ready in the queues"):
            read = in_flight_with_meta(store.registries, ids)
        for call_id, (deadline, raw) in zip(ids, read, strict=True):
            meta = decode_meta(raw, "inflight")
            if deadline is not None and meta.get("s") == "queued":
                timeout = meta.get("q")
                found[call_id] = int(deadline) - (timeout if isinstance(timeout, int) else default_ms)
    return found


# -- the store's calls by queue -------------------------------------------------------------------------------


def store_split(depot: Depot, most_read: int = MOST_READ) -> _Split:
    """The calls in flight, paused and held by limits, per queue (see the module's docstring)."""
    split = _Split()
    for store in depot.shards.all():
        registries = store.registries
        sets = {"inflight": registries.inflight, "paused": registries.paused, "gated": registries.gated}
        with redis_errors("read the calls of each queue"):
            read = samples(list(sets.values()), most_read)
        for kind, (size, members) in zip(sets, read, strict=True):
            if not members:
                continue
            ids = list(dict.fromkeys(text(member).rsplit("\0", 1)[-1] for member in members))  # lex: the id is last
            split.estimated = split.estimated or size > len(ids)
            scale = size / len(ids)
            for queue in queues_of(depot, store, ids):
                if queue is not None:  # no list, no readable payload: counted in no queue
                    split.add(queue, kind, scale)
    return split


def queues_of(depot: Depot, store: CallStore, ids: list[str]) -> list[str | None]:
    """The queue each call goes to: from the list its metadata names, else (the kombu path) from its payload. The
    list is found in the metadata's text, as release.lua finds it; only a name JSON escapes is decoded."""
    with redis_errors("read the metadata of calls"):
        metas = store.registries.meta.raw(ids)
    found: list[str | None] = [None] * len(ids)
    by_list: dict[bytes, str] = {}
    unrouted: list[tuple[int, CallMeta]] = []
    for index, raw in enumerate(metas):
        named = _LIST_FIELD.search(raw) if isinstance(raw, bytes) else None
        if named is not None:
            key = named.group(1)
            if key not in by_list:
                by_list[key] = queue_of_list(depot, key.decode())
            found[index] = by_list[key]
            continue
        meta = decode_meta(raw)
        if isinstance(meta.get("l"), str):
            found[index] = queue_of(depot, meta, None)
        else:
            unrouted.append((index, meta))
    if unrouted:
        with redis_errors("read the payloads of calls"):
            payloads = store.registries.payloads.raw([ids[index] for index, _ in unrouted])
        for (index, meta), payload in zip(unrouted, payloads, strict=True):
            found[index] = queue_of(depot, meta, payload)
    return found


# -- release lag ----------------------------------------------------------------------------------------------


def release_lag(depot: Depot, minutes: int = LAG_MINUTES) -> tuple[float | None, float | None]:
    """The release lag's p50 and p99 (s) over the last ``minutes``, every shard and queue: from the lateness
    buckets the release counts per minute in each shard's ``history`` hash."""
    stores = depot.shards.all()
    current = server_ms(depot) // 60_000
    names = [f"late_le_{bound}" for bound in LATENESS_BOUNDS_MS] + ["late_le_inf"]
    fields = [f"{minute}:{name}" for minute in range(current - minutes + 1, current + 1) for name in names]
    counts = [0] * len(names)
    for store in stores:
        with redis_errors("read the release lateness"):
            values = store.registries.history.counts(fields)
        for index, value in enumerate(values):
            if value is not None:
                counts[index % len(names)] += value
    return bucket_quantile(0.5, counts), bucket_quantile(0.99, counts)


def bucket_quantile(quantile: float, counts: Sequence[int]) -> float | None:
    """A quantile (s) from calls per lateness bucket, as Prometheus's ``histogram_quantile`` computes it (see
    :func:`celery_redisdelay.operations.history.lateness_quantile`, which the history pages use)."""
    total = sum(counts)
    if not total:
        return None
    rank, cumulative = quantile * total, 0
    for index, count in enumerate(counts):
        if count and cumulative + count >= rank:
            if index == len(LATENESS_BOUNDS_MS):
                break
            lower = LATENESS_BOUNDS_MS[index - 1] if index else 0
            upper = LATENESS_BOUNDS_MS[index]
            return (lower + (upper - lower) * (rank - cumulative) / count) / 1000
        cumulative += count
    return LATENESS_BOUNDS_MS[-1] / 1000


__all__ = [
    "FIELDS",
    "LAG_MINUTES",
    "MOST_READ",
    "SLICES",
    "QueueFigures",
    "broker_ready",
    "bucket_quantile",
    "queue_figures",
    "queues",
    "ready_since",
    "release_lag",
    "routed_queues",
    "store_split",
]
