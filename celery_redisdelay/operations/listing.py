"""Pages of calls over all shards: the one paginator behind ``redisdelay list``, the dashboard's lists and
the bulk actions on everything matching a filter.

Every read is bounded: a shard is read a chunk at a time, only when the entries already read from it
are used up, and a page resumes from a cursor of per-shard offsets. Offsets count from the oldest score
(or, newest first, from the newest). With a filter (task, queue, a search in the arguments) reading goes
on past the calls that do not match, but stops after ``scan`` entries and says so. Only per-key
commands and non-transactional pipelines are used, so all of it works on a Redis Cluster.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import total_ordering
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from ..errors import RedisDelayError
from ..store.calls import LISTS as LISTS  # the lists of calls, for the command line and the dashboard
from ..store.calls import CallStore, Entry, pause_note, redis_errors
from ..store.meta import CallMeta, named
from .payloads import arguments_text, queue_of

if TYPE_CHECKING:
    from ..store.depot import Depot

#: What the score of each state means.
SCORE_MEANING = {"delayed": "due", "limited": "due", "paused": "due", "inflight": "deadline", "dead": "dead since"}
#: The orders a page can be read in: by score, oldest or newest first.
ORDERS = ("oldest", "newest")
#: With a filter, entries are read this many at a time per shard (or ``limit``, if larger; never more
#: than ``scan``): fewer round trips for the calls the filter passes over.
FILTER_CHUNK = 500


def server_ms(depot: Depot, store: CallStore | None = None) -> int:
    """The clock of the Redis server holding a shard (the first by default), in ms since the epoch: the
    clock the shard's scores were set by."""
    store = store or depot.store
    with redis_errors("read the Redis clock"):
        return store.registries.delayed.server_ms()


def iso(ms: float) -> str:
    """A score as an ISO 8601 time in UTC, to the ms (``2025-01-31T12:00:00.250Z``)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def check_state(state: str) -> None:
    """Refuse a state that names no list of calls (:data:`~celery_redisdelay.store.calls.LISTS`)."""
    if state not in LISTS:
        raise RedisDelayError(f"unknown state {state!r}; expected one of {', '.join(LISTS)}")


def list_size(depot: Depot, state: str) -> int:
    """How many calls one list (:data:`~celery_redisdelay.store.calls.LISTS`) holds over all shards: a ZCARD each."""
    check_state(state)
    total = 0
    for store in depot.shards.all():
        with redis_errors(f"count {state} calls"):
            total += store.registries.list_of(state).size()
    return total


@dataclass(frozen=True)
class Filter:
    """Which calls a page keeps: of one task (its registered name), routed to one queue, and whose
    arguments contain ``search`` (any case, in args and kwargs as JSON: :func:`payloads.arguments_text`)."""

    task: str | None = None
    queue: str | None = None
    search: str | None = None

    @property
    def active(self) -> bool:
        return bool(self.task or self.queue or self.search)

    def matches(self, depot: Depot, entry: Entry) -> bool:
        if self.task and entry.meta.get("t") != self.task:
            return False
        if self.queue and entry.queue != self.queue:
            return False
        if self.search:
            found = arguments_text(depot, entry.envelope)
            return found is not None and self.search.casefold() in found.casefold()
        return True

    def describe(self) -> str:
        parts = [f"task {self.task}" if self.task else "", f"queue {self.queue}" if self.queue else ""]
        parts.append(f"arguments containing {self.search!r}" if self.search else "")
        return ", ".join(part for part in parts if part) or "no filter"


# -- cursors ----------------------------------------------------------------------------------------


def parse_cursor(cursor: str | None, shards: int) -> list[int]:
    """The per-shard offsets of a cursor (``"12.0.7"``, one per store of ``depot.shards.all()``); all zero
    without one."""
    if not cursor:
        return [0] * shards
    try:
        offsets = [int(part) for part in cursor.split(".")]
    except ValueError:
        offsets = []
    if not offsets or any(offset < 0 for offset in offsets):
        raise RedisDelayError(f"cursor {cursor!r} is not one that list printed (offsets joined by dots, like 12.0.7)")
    if len(offsets) != shards:
        raise RedisDelayError(
            f"cursor {cursor!r} has {len(offsets)} offsets but there are {shards} shards to read now; "
            "start again without --cursor"
        )
    return offsets


def format_cursor(offsets: list[int]) -> str:
    return ".".join(str(offset) for offset in offsets)


# -- reading --------------------------------------------------------------------------------------


@total_ordering
class Descending:
    """A text that sorts the other way round: the pause of a call, when the paused calls are read newest first."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Descending) and self.text == other.text

    def __lt__(self, other: Descending) -> bool:
        return self.text > other.text


class Scanner:
    """The entries of one state over several shards, merged by score as they are read.

    A shard is read ``chunk`` entries at a time (with their metadata and queue), and only once the
    entries already read from it are used up. ``offsets`` count the entries consumed per shard: the
    cursor of what :meth:`next` has not returned yet. Payloads are read for every entry with
    ``payloads="all"`` (the argument search needs them), else only for entries whose metadata does not
    name their queue. The paused calls merge by pause, then score: the order of each shard's paused set.
    """

    def __init__(
        self,
        depot: Depot,
        stores: list[CallStore],
        state: str,
        offsets: list[int],
        *,
        newest_first: bool = False,
        chunk: int = 50,
        payloads: str = "unrouted",
    ) -> None:
        self.depot, self.stores, self.state = depot, stores, state
        self.offsets = list(offsets)
        self.newest_first, self.chunk, self.payloads = newest_first, chunk, payloads
        self.reset()

    def reset(self) -> None:
        """Forget what was read ahead, so the next read starts at ``offsets`` (after changing the sets)."""
        self._buffers: list[deque[Entry]] = [deque() for _ in self.stores]
        self._heads: list[tuple[tuple[Any, float], str, int]] = []  # (order, id, shard) of each buffer's first entry
        self._unread = list(range(len(self.stores)))  # shards with an empty buffer that may hold more
        self._sizes = [0] * len(self.stores)

    @property
    def exhausted(self) -> bool:
        return not self._heads and not self._unread

    def next(self) -> tuple[int, Entry] | None:
        """The next entry in order, with the index of its shard; None at the end."""
        for shard in self._unread:
            entries, self._sizes[shard] = self._read(shard)
            if entries:
                self._buffers[shard].extend(entries)
                self._push(shard)
        self._unread = []
        if not self._heads:
            return None
        _, _, shard = heapq.heappop(self._heads)
        entry = self._buffers[shard].popleft()
        self.offsets[shard] += 1
        if self._buffers[shard]:
            self._push(shard)
        elif self.offsets[shard] < self._sizes[shard]:
            self._unread.append(shard)
        return shard, entry

    def _push(self, shard: int) -> None:
        first = self._buffers[shard][0]
        heapq.heappush(self._heads, (self._order(first), first.id, shard))

    def _order(self, entry: Entry) -> tuple[Any, float]:
        """Where an entry sorts among the shards' (before its id): by score, a paused call by its pause first."""
        group = (paused_on(entry.meta) or "") if self.state == "paused" else ""
        if self.newest_first:
            return Descending(group), -entry.score_ms
        return group, entry.score_ms

    def _read(self, shard: int) -> tuple[list[Entry], int]:
        """Up to ``chunk`` entries of one shard from its offset on, with the queue each goes to, and the set's size."""
        check_state(self.state)  # a clear error for a state that is not one
        entries, size = self.stores[shard].read(
            self.state, self.offsets[shard], self.chunk, newest_first=self.newest_first, payloads=self.payloads
        )
        return [replace(entry, queue=queue_of(self.depot, entry.meta, entry.envelope)) for entry in entries], size


@dataclass(frozen=True)
class Page:
    """A page of calls in one state, by score over all shards, and where the next one starts.

    ``next_cursor`` is None on the last page. ``scanned`` entries were read past to fill it: with a
    filter, ``scan_stopped`` says the page ended at the ``scan`` bound before it was full.
    """

    state: str
    calls: list[Entry]
    now_ms: int
    next_cursor: str | None
    scanned: int
    scan_stopped: bool = False
    order: str = "oldest"

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "order": self.order,
            "calls": [entry_dict(entry, self.now_ms) for entry in self.calls],
            "next_cursor": self.next_cursor,
            "scanned": self.scanned,
            "scan_stopped": self.scan_stopped,
            "now_ms": self.now_ms,
        }


def entry_dict(entry: Entry, now_ms: int) -> dict[str, Any]:
    """One listed call as plain data: its score as ms, ISO time and seconds from now (negative: past)."""
    meta = entry.meta
    fields = named(meta)
    return {
        "id": entry.id,
        "state": entry.state,
        "task": fields["task"],
        "queue": entry.queue,
        "score_ms": int(entry.score_ms),
        "time": iso(entry.score_ms),
        "seconds_from_now": (entry.score_ms - now_ms) / 1000,
        "deliveries": fields["deliveries"],
        "max_deliveries": fields["max_deliveries"],
        "phase": fields["phase"],
        "worker": fields["worker"],
        "why": fields["why"],
        "limits": limits_of(meta),
        "paused_on": paused_on(meta),
    }


def paused_on(meta: CallMeta) -> str | None:
    """The pause a call set aside waits on, as the store names it (``task:<name>`` or ``queue:<name>``), or None."""
    noted = pause_note(meta)
    return None if noted is None else noted[0]


def limits_of(meta: CallMeta) -> list[str]:
    """The limits a call is under, each as its name and the key its arguments gave (``task:sync account:7``)."""
    gate = meta.get("lg")
    if not isinstance(gate, str):
        return []
    return [" ".join(part for part in line.split("\t", 1) if part) for line in gate.split("\n") if line]


def scanner_for(
    depot: Depot, state: str, cursor: str | None, found: Filter, *, newest_first: bool, chunk: int
) -> Scanner:
    """A scanner of ``state`` over every shard from ``cursor`` on, reading what ``found`` needs."""
    stores = depot.shards.all()
    check_state(state)
    offsets = parse_cursor(cursor, len(stores))
    payloads = "all" if found.search else "unrouted"
    return Scanner(depot, stores, state, offsets, newest_first=newest_first, chunk=chunk, payloads=payloads)


@dataclass(frozen=True)
class PageRequest:
    """Which page of a list to read: up to ``limit`` calls from ``cursor`` on, of those of ``task``, routed to
    ``queue`` and whose arguments contain ``search`` (:class:`Filter`; an empty one filters on nothing), oldest first
    or with ``newest_first`` newest first, reading past at most ``scan`` entries with a filter."""

    limit: int = 50
    cursor: str | None = None
    task: str | None = None
    queue: str | None = None
    search: str | None = None
    newest_first: bool = False
    scan: int = 10_000

    @property
    def matching(self) -> Filter:
        """The filter the page keeps its calls by."""
        return Filter(self.task or None, self.queue or None, self.search or None)

    def check(self) -> None:
        """Refuse a page that could hold no call, or read no entry."""
        if self.limit < 1 or self.scan < 1:
            raise RedisDelayError(f"limit and scan must be at least 1, not {self.limit} and {self.scan}")

    def chunk(self, found: Filter) -> int:
        """How many entries to read at a time per shard: ``limit``, or with a filter more (up to ``scan``), since
        reading goes on past the calls it passes over."""
        return max(self.limit, min(self.scan, FILTER_CHUNK)) if found.active else self.limit


class PageOptions(TypedDict, total=False):
    """The keywords :func:`page` takes: the fields of :class:`PageRequest`."""

    limit: int
    cursor: str | None
    task: str | None
    queue: str | None
    search: str | None
    newest_first: bool
    scan: int


def page(depot: Depot, state: str, **options: Unpack[PageOptions]) -> Page:
    """A page of up to ``limit`` calls in ``state``, by score (then id) over all shards, from ``cursor`` on;
    oldest first, or with ``newest_first`` newest first (its cursors count from the newest). The keywords are
    those of :class:`PageRequest`, with its defaults.

    The shards' entries are merged as they are read, ``limit`` at a time per shard: without a filter each
    shard is read once per page. With ``task``, ``queue`` or ``search``, only the calls that match are
    kept and reading goes on past the others, but stops once ``scan`` entries were read; the next cursor
    resumes there. Offsets move as calls come and go, so a page of a set that changes meanwhile may skip
    or repeat a call.
    """
    request = PageRequest(**options)
    request.check()
    found = request.matching
    scanner = scanner_for(
        depot, state, request.cursor, found, newest_first=request.newest_first, chunk=request.chunk(found)
    )
    now = server_ms(depot)
    calls, scanned = _fill(depot, scanner, found, request)
    more = not scanner.exhausted
    return Page(
        state,
        calls,
        now,
        format_cursor(scanner.offsets) if more else None,
        scanned,
        scan_stopped=found.active and more and len(calls) < request.limit,
        order=ORDERS[request.newest_first],
    )


def _fill(depot: Depot, scanner: Scanner, found: Filter, request: PageRequest) -> tuple[list[Entry], int]:
    """The calls of one page, read from ``scanner`` until it holds ``limit`` of them (with a filter, until ``scan``
    entries were read), without their payloads; and how many entries were read."""
    calls: list[Entry] = []
    scanned = 0
    while len(calls) < request.limit and (not found.active or scanned < request.scan):
        step = scanner.next()
        if step is None:
            break
        scanned += 1
        if found.matches(depot, step[1]):
            calls.append(replace(step[1], envelope=None))
    return calls, scanned
