"""The call store: parked calls in Redis and every state change of their life, one script each.

The life of a call::

    park ──> delayed ──claim──> in flight (claimed) ──confirm──> in flight (queued)
               ^  ^                  │ unclaim                       │ start (a worker runs it)
               │  └──────────────────┘                               v
               │                                          in flight (running) ──ack──> gone
               └───── sweep (deadline passed) <─── in flight ──sweep, too many deliveries──> dead
                                                                         dead ──requeue──> delayed
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import redis
from redis.cluster import RedisCluster

from ..errors import NotReplicatedError, StoreUnavailableError
from . import pauses
from .keys import Keyspace
from .limits import Gate
from .meta import CallMeta, Limits, decode_meta, gated_meta, meta_json
from .scripts import Scripts

STATES = ("delayed", "inflight", "dead")
#: The lists an operator reads: the states, the due calls held by their limits and the calls set aside on a pause
#: (delayed calls too, waiting in their gates or on their pause: :meth:`CallStore.find` says "delayed", with the
#: phase "limited" or "paused"; ``rd.paused()`` counts the paused ones per target).
LISTS = ("delayed", "limited", "paused", "inflight", "dead")

#: ``park_keyed`` statuses.
STORED, KEPT, CONFLICT = 1, 0, -1
#: What :meth:`CallStore.send` did: pushed onto its list, in flight; or parked due now (not a broker message).
SENT, PARKED_NOW = 1, 2
#: How a tracked call can end (``ack``), each counted in the ``counters`` hash: run by a worker, or
#: discarded unrun by a worker because it was revoked or had expired.
OUTCOMES = ("acked", "revoked", "expired")
#: A start's op in :meth:`CallStore.track`, and its letter in track.lua.
STARTS = {"start": "s", "start-once": "S"}


class Cancelled(NamedTuple):
    """A call dropped from the delay set, with the payload it held. ``record``: it is not yet recorded revoked
    (cancelled now, or by a cancel whose caller never recorded it); else ``payload`` is empty."""

    id: str
    payload: bytes
    record: bool = True


#: How long a store remembers a cancel (ms): a cancel sent again within it is answered as the first was.
CANCEL_MEMORY_MS = 10 * 60 * 1000
#: How long a store keeps what a drain took and has not handed back (ms): the next drain hands it out first.
DRAIN_MEMORY_MS = 30 * 24 * 3600 * 1000


@dataclass(frozen=True)
class Claimed:
    """A call taken for publishing: its id, its envelope, which delivery this is, and the broker list its
    metadata names (a call stored as a broker message; ``""`` otherwise)."""

    id: str
    envelope: bytes
    deliveries: int
    list_key: str = field(default="", compare=False)


@dataclass(frozen=True)
class Entry:
    """A stored call as seen by an operator: where it is, when, and its metadata."""

    id: str
    state: str
    score_ms: float
    meta: CallMeta
    envelope: bytes | None
    queue: str | None = field(default=None, compare=False)  # where it goes, when a listing worked it out


@contextmanager
def redis_errors(action: str) -> Iterator[None]:
    """Turn redis-py's errors into :class:`StoreUnavailableError` naming what failed."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise StoreUnavailableError(f"celery-redisdelay could not {action}: Redis is unreachable ({exc})") from exc
    except redis.RedisError as exc:
        raise StoreUnavailableError(f"celery-redisdelay could not {action}: Redis refused it ({exc})") from exc


def server_ms(client: Any, key: str) -> int:
    """The clock of the server holding ``key``, in ms: the clock the scripts use for that key's shard."""
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        seconds, micros = client.time(target_nodes=node)
    else:
        seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def paused_member(target: str, due_ms: int, call_id: str) -> bytes:
    """The member of the paused set of a call set aside on ``target`` (target NUL due NUL id, see lib/pauses.lua)."""
    return f"{target}\0{due_ms:015d}\0{call_id}".encode()


def pause_note(meta: CallMeta) -> tuple[str, int] | None:
    """Where a call set aside on a pause waits, as its metadata notes it (``pz``, ``pd``: its target and due time,
    see ``set_aside`` in lib/pauses.lua), or None."""
    fields: dict[str, Any] = dict(meta)
    target, due = fields.get("pz"), fields.get("pd")
    if isinstance(target, str) and isinstance(due, (int, float)) and not isinstance(due, bool):
        return target, int(due)
    return None


def gated_entry(member: bytes) -> tuple[str, float]:
    """The id and due time of a call waiting in its gate, from its member of the gated set (gate NUL due NUL
    id, see lib/pauses.lua); a member not written so is listed as it is, due at 0, rather than hidden."""
    parts = member.split(b"\0", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return text(parts[2]), float(parts[1])
    return member.decode("utf-8", "replace"), 0.0


def paused_entry(member: bytes) -> tuple[str, float, str]:
    """The id, due time and target of a call set aside on a pause, from its member of the paused set (target NUL
    due NUL id, see lib/pauses.lua); a member not written so is listed as it is, due at 0, rather than hidden."""
    parts = member.split(b"\0", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return text(parts[2]), float(parts[1]), text(parts[0])
    return member.decode("utf-8", "replace"), 0.0, ""


class Released(NamedTuple):
    """What one release script did: the calls it claimed for the generic path, the due ids it examined and the
    calls it pushed; and, for a precise releaser, the server's time then (ms), when the earliest call left is due
    (None: none left) and whether a batch group is due."""

    claimed: list[Claimed]
    examined: int
    pushed: int
    now_ms: int
    next_due_ms: int | None
    batch_due: bool


class BrokerCopy(NamedTuple):
    """The broker's copy of a message the store adopts, where the broker is the store's Redis: ``where`` is
    ``"list"`` (``keys``: the queue list; ``copy``: the message as it is in the list) or ``"unacked"``
    (``keys``: kombu's unacked hash and its index; ``copy``: the delivery tag)."""

    where: str
    keys: tuple[str, ...]
    copy: bytes | str


class CallStore:
    """Python face of the Lua scripts; every method is one round trip."""

    def __init__(self, client: redis.Redis, keys: Keyspace, wait_replicas: int = 0, wait_ms: int = 1000) -> None:
        self.client = client
        self.keys = keys
        self.wait_replicas = wait_replicas
        self.wait_ms = wait_ms
        self._scripts = Scripts(client, [key.encode() for key in keys.store_keys])

    def _run(
        self,
        name: str,
        args: Sequence[Any],
        action: str,
        extra_keys: Sequence[str] = (),
        *,
        replicated: bool = False,
    ) -> Any:
        """Run a store script; with ``replicated`` (parks), wait for ``wait_replicas`` replicas to have it."""
        with redis_errors(action):
            try:
                return self._call(name, extra_keys, args, action, replicated)
            except redis.ResponseError as exc:
                if "READONLY" not in str(exc) or not hasattr(self.client, "connection_pool"):
                    raise
                # A failover made our server a replica. Redis 6.2 reports that inside a script as a
                # script error, so redis-py keeps the connection: drop the pool's connections (a
                # Sentinel pool then asks for the new master) and try once more. A replica refuses
                # the first write, so the failed attempt changed nothing.
                self.client.connection_pool.disconnect()
                return self._call(name, extra_keys, args, action, replicated)

    def _call(self, name: str, keys: Sequence[str], args: Sequence[Any], action: str, replicated: bool) -> Any:
        if not (replicated and self.wait_replicas):
            return self._scripts.run(name, keys, args)
        # WAIT counts the replicas that have this connection's writes: script and WAIT share a pipeline.
        pipe = self.client.pipeline(transaction=False)
        self._scripts.pipelined(name, keys, args, pipe)
        pipe.wait(self.wait_replicas, self.wait_ms)
        result, confirmed = pipe.execute()
        if int(confirmed) < self.wait_replicas:
            raise NotReplicatedError(
                f"celery-redisdelay could not {action} durably: {confirmed} of {self.wait_replicas} replicas "
                f"confirmed it within {self.wait_ms} ms (redisdelay_wait_replicas). It is stored on the master, "
                "and a failover now could lose it"
            )
        return result

    def park(
        self,
        call_id: str,
        envelope: bytes,
        meta: Limits | CallMeta,
        *,
        countdown_ms: int | None = None,
        due_ms: int | None = None,
    ) -> int:
        """Store a call; due ``countdown_ms`` from now by the Redis clock, or at ``due_ms``."""
        return self.park_keyed(call_id, envelope, meta, countdown_ms=countdown_ms, due_ms=due_ms)[1]

    def send(self, call_id: str, message: bytes, meta: str, list_key: str, queue_timeout_ms: int) -> int:
        """Store a call due now and push its broker message (its first delivery) onto ``list_key`` in one step, in
        flight with its queue deadline (``queue_timeout_ms`` unless its metadata has its own): :data:`SENT`. A
        payload that is not such a message is parked due now instead: :data:`PARKED_NOW`."""
        status, _ = self._run(
            "send", [call_id, message, meta, queue_timeout_ms], f"send call {call_id}", [list_key], replicated=True
        )
        return int(status)

    def park_keyed(
        self,
        call_id: str,
        envelope: bytes,
        meta: Limits | CallMeta | str,
        *,
        countdown_ms: int | None = None,
        due_ms: int | None = None,
        mode: str = "",
        key: str = "",
        gate: Gate | None = None,
    ) -> tuple[int, int, str]:
        """Park a call, optionally under a unique or debounce key (``mode``): (status, due, id).

        Status :data:`STORED`: stored under ``call_id``. :data:`KEPT` (unique): the call parked under
        ``key`` stays, nothing was stored, its id is returned. :data:`CONFLICT` (debounce): ``key`` is
        held by the returned id (or by none, when ``call_id`` was used before): park again with that id.
        ``meta`` is the call's limits, or their stored form already (:func:`meta_json`, with the key).
        ``gate`` holds the limits the call is under, if any (:mod:`~celery_redisdelay.store.limits`).
        """
        when = due_args(countdown_ms, due_ms)
        stored_meta = meta if isinstance(meta, str) else meta_json(meta, key if mode else None)
        declared: list[str] = []
        if gate is not None:
            stored_meta = gated_meta(stored_meta, gate.gate)
            declared = [part for pair in gate.declared for part in pair]
        status, due, holder = self._run(
            "park",
            [call_id, envelope, stored_meta, *when, mode, key, *declared],
            f"park call {call_id}",
            replicated=True,
        )
        return int(status), int(due), text(holder)

    def adopt(self, call_id: str, payload: bytes, meta: str, due_ms: int, broker_copy: BrokerCopy | None = None) -> int:
        """Take a call that waited in the broker into the store, due at ``due_ms``, unless its id is known:
        :data:`STORED`, :data:`KEPT` (known; nothing stored) or :data:`CONFLICT` (``broker_copy`` was gone).
        ``broker_copy``, where the broker is this store's Redis: the copy removed in the same script."""
        where, keys, copy = broker_copy or ("", (), b"")
        status = self._run(
            "adopt", [call_id, payload, meta, due_ms, where, copy], f"adopt call {call_id}", keys, replicated=True
        )
        return int(status)

    def park_many(self, flat: Sequence[Any], meta: str, when: tuple[str, int]) -> int:
        """Store calls given as (id, envelope, ...) with one stored metadata (:func:`meta_json`) and one due
        time (``when`` from :func:`due_args`); at most a thousand."""
        return int(self._run("park_many", [*when, meta, *flat], f"park {len(flat) // 2} calls", replicated=True))

    def holder(self, key: str) -> str | None:
        """The id of the parked call holding a unique/debounce key (a hint: it may change at once)."""
        with redis_errors("look up a unique key"):
            call_id = self.client.hget(self.keys.index, key)
            if call_id is None or self.client.zscore(self.keys.delayed, call_id) is None:
                return None
        return text(call_id)

    def reschedule(self, call_id: str, *, countdown_ms: int | None = None, due_ms: int | None = None) -> int | None:
        """Move a parked call to a new due time; the new due time, or None when it is not parked."""
        due, moved = self.reschedule_many([call_id], countdown_ms=countdown_ms, due_ms=due_ms)
        return due if moved else None

    def claim(self, limit: int, claim_timeout_ms: int) -> list[Claimed]:
        """Take up to ``limit`` due calls for publishing."""
        return self.claim_batch(limit, claim_timeout_ms)[0]

    def claim_batch(self, limit: int, claim_timeout_ms: int) -> tuple[list[Claimed], int]:
        """Like :meth:`claim`, also returning how many due ids the script examined (claimed or buried)."""
        examined, *flat = self._run("claim", [limit, claim_timeout_ms], "claim due calls")
        calls = _claimed(flat)
        return calls, int(examined)

    def release(self, limit: int, claim_timeout_ms: int, queue_timeout_ms: int, lists: Sequence[str]) -> Released:
        """The fast path: push due calls stored as broker messages for ``lists`` straight onto them (see
        :class:`Released`)."""
        examined, pushed, now, next_due, batch_due, *flat = self._run(
            "release", [limit, claim_timeout_ms, queue_timeout_ms], "release due calls", lists
        )
        upcoming = int(float(next_due)) if next_due not in (b"", "", None) else None
        return Released(_claimed(flat), int(examined), int(pushed), int(now), upcoming, bool(int(batch_due)))

    def confirm(self, call_ids: Sequence[str], queue_timeout_ms: int) -> int:
        if not call_ids:
            return 0
        return int(self._run("confirm", [queue_timeout_ms, *call_ids], "confirm published calls"))

    def unclaim(self, call_ids: Sequence[str]) -> int:
        if not call_ids:
            return 0
        return int(self._run("unclaim", list(call_ids), "give back unpublished calls"))

    def start(self, call_id: str, run_timeout_ms: int, lease_ms: int = 0, worker: str = "") -> int:
        """Mark a call started by ``worker``, under a lease of ``lease_ms`` (0: its run timeout alone):
        1 tracked, 2 taken back from the delay set (the sweep had put it back), 0 unknown."""
        return int(self._run("start", [call_id, run_timeout_ms, lease_ms, worker], f"mark call {call_id} started"))

    def touch(self, call_id: str, timeout_ms: int) -> bool:
        return bool(self._run("touch", [call_id, timeout_ms], f"extend the deadline of call {call_id}"))

    def ack(self, call_id: str, outcome: str = "acked") -> bool:
        """Forget a finished call, counting how it ended (one of :data:`OUTCOMES`); False when not tracked."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
        return bool(self._run("ack", [call_id, outcome], f"acknowledge call {call_id}"))

    def current(
        self, call_id: str, delivery: int, worker: str = "", retries: int | None = None, *, by_broker: bool = False
    ) -> bool:
        """Whether delivery number ``delivery`` of a call, received again by ``worker``, is its current one (see
        ``delivery.lua``): False when a later delivery was made, another worker holds the call under a live
        lease, the message's ``retries`` header is not the stored message's (an earlier attempt's copy), or the
        call no longer waits for this one. ``by_broker``: an AMQP broker redelivered it itself (the holder's channel
        closed): another worker's lease does not make it stale, and the call leaves that worker."""
        if delivery < 1:
            raise ValueError(f"a delivery number is 1 or more, not {delivery!r}")
        attempt = "" if retries is None else retries
        flag = "1" if by_broker else ""
        return bool(
            self._run("delivery", [call_id, delivery, worker, attempt, flag], f"check the delivery of call {call_id}")
        )

    def track(
        self, entries: Sequence[tuple[str, str]], run_timeout_ms: int, lease_ms: int = 0, worker: str = ""
    ) -> list[str]:
        """Write a worker process's starts and acknowledgements in one script, in order: ``entries`` are
        (op, id), op one of :data:`STARTS` or the outcome of an acknowledgement (one of :data:`OUTCOMES`); a start
        is :meth:`start` with ``run_timeout_ms``, ``lease_ms`` and ``worker``, and ``"start-once"`` one whose run,
        if cut short with its worker, is dead-lettered instead of run again (``worker/contract.py``). 1 to 1,000
        entries. The ids of the entries that found no call here."""
        ids = _step([call_id for _, call_id in entries])
        ops: list[str] = []
        for op, call_id in entries:
            if op not in STARTS and op not in OUTCOMES:
                raise ValueError(f"an entry is one of {', '.join((*STARTS, *OUTCOMES))}, not {op!r}")
            ops += [STARTS.get(op, op), call_id]
        action = f"write the starts and acknowledgements of {_which(ids)}"
        return _texts(self._run("track", [run_timeout_ms, lease_ms, worker, *ops], action))

    def sweep(
        self,
        limit: int,
        max_deliveries: int,
        unacked: Sequence[str] = (),
        lease_ms: int | None = None,
        lists: Sequence[str] = (),
        queue_timeout_ms: int | None = None,
    ) -> tuple[int, int]:
        """Deliver again the calls past their in-flight deadline (dead-letter those out of deliveries). With
        ``unacked`` (kombu's unacked hash and index, where the broker is this Redis), the deliveries their
        workers held leave kombu's hash, and a call a worker popped more than ``lease_ms`` ago but never held
        (it died first) is delivered again too; with ``lists`` too (the queue lists the release pushes onto)
        and ``queue_timeout_ms`` (the default), so is a call pushed a lease ago that is in neither its list
        nor kombu's hash (its worker died before kombu noted it). (calls put back, calls dead-lettered)."""
        args: list[int] = [limit, max_deliveries]
        keys = list(unacked)
        if lease_ms is not None:
            args.append(lease_ms)
            if unacked and lists and queue_timeout_ms is not None:
                args.append(queue_timeout_ms)
                keys += lists
        requeued, buried = self._run("sweep", args, "sweep timed-out calls", keys)
        return int(requeued), int(buried)

    def lease(self, worker: str, lease_ms: int, held: Sequence[tuple[str, str]], total: int) -> list[str]:
        """Hold ``held`` calls (id, kombu delivery tag; 1 to 1,000) for ``worker`` for ``lease_ms`` from now,
        taking those no other worker holds; ``total``: the calls the worker holds here in all. The ids it
        could not hold (unknown, finished, held by another worker)."""
        return self._leases("hold", worker, lease_ms, held, total)

    def give_back(self, worker: str, lease_ms: int, held: Sequence[tuple[str, str]]) -> list[str]:
        """``worker`` gives back the calls it holds that have not started (their messages go back to the
        broker's queue): each is queued again with its queue timeout. The ids it did not hold."""
        return self._leases("give", worker, lease_ms, held, 0)

    def put_back(self, worker: str, held: Sequence[tuple[str, str]], *, rejected: bool = False) -> list[str]:
        """``worker`` puts back calls whose messages kombu does not keep (``redisdelay_skip_unacked``): each goes
        back to the delay set due now, and the next release delivers it again. ``rejected``: their runs were
        rejected with requeue, so a start of these deliveries written later is a stale one (see lease.lua). The
        ids it could not put back (another worker holds them, or they were delivered again since)."""
        return self._leases("reject" if rejected else "requeue", worker, 0, held, -1)

    def _leases(self, op: str, worker: str, lease_ms: int, held: Sequence[tuple[str, str]], total: int) -> list[str]:
        ids = _step([call_id for call_id, _ in held])
        pairs = [value for call in held for value in call]
        doing = {"hold": "renew the leases of", "give": "give back", "requeue": "put back", "reject": "put back"}[op]
        action = f"{doing} {_which(ids)}"
        return _texts(self._run("lease", [worker, lease_ms, op, total, *pairs], action, [self.keys.workers]))

    def bury(self, call_id: str, reason: str, *, only_inflight: bool = False) -> bool:
        """Dead-letter a call with ``reason``; with ``only_inflight``, only if it is in flight now."""
        flag = "1" if only_inflight else "0"
        return bool(self._run("bury", [call_id, reason, flag], f"dead-letter call {call_id}"))

    def cancel(self, call_id: str) -> Cancelled | None:
        """Drop a parked call: what it held, or None when it was not parked here (nor cancelled here in the last
        :data:`CANCEL_MEMORY_MS`)."""
        dropped = self.cancel_many([call_id])
        return dropped[0] if dropped else None

    def requeue(self, call_id: str) -> int:
        """Requeue a dead-lettered call: 1 requeued, 0 not dead-lettered here, -1 no payload (it stays dead)."""
        requeued, left = self.requeue_many([call_id])
        return 1 if requeued else -1 if left else 0

    # -- many calls at once (the operator's bulk actions; at most LARGEST_STEP ids per call) ------------

    def cancel_many(self, call_ids: Sequence[str], *, take_over: bool = True) -> list[Cancelled]:
        """Drop the calls still parked here (1 to 1,000 ids): each dropped call with its payload, and each
        call cancelled here in the last :data:`CANCEL_MEMORY_MS` (a cancel sent again after its reply was
        lost is answered so), to record if its caller has not and ``take_over``. Once recorded revoked, tell
        :meth:`cancel_done`."""
        flat = self._run(
            "cancel",
            [CANCEL_MEMORY_MS, "1" if take_over else "0", *_step(call_ids)],
            f"cancel {_which(call_ids)}",
            [self.keys.cancelled, self.keys.unrecorded],
        )
        return [Cancelled(text(flat[i]), flat[i + 1], flat[i + 2] in (b"1", "1")) for i in range(0, len(flat), 3)]

    def cancel_done(self, call_ids: Sequence[str]) -> None:
        """The cancelled calls ``call_ids`` are recorded revoked: a cancel sent again leaves them be."""
        self._run("cancel_done", _step(call_ids), f"note {_which(call_ids)} recorded revoked", [self.keys.unrecorded])

    # -- the way out: calls handed back to Celery's own path (operations/drain.py) -------------------------------

    def drain_take(self, call_ids: Sequence[str]) -> list[tuple[str, bytes]]:
        """Take the calls still parked here (1 to 1,000 ids) out of the store, as a cancel does, each with its
        payload, which stays in :attr:`Keyspace.undrained` until :meth:`drain_done`. A call another drain took
        in the last :data:`DRAIN_MEMORY_MS` and did not finish comes with its payload too."""
        flat = self._run(
            "cancel",
            [DRAIN_MEMORY_MS, "1", *_step(call_ids)],
            f"drain {_which(call_ids)}",
            [self.keys.drained, self.keys.undrained],
        )
        return [(text(flat[i]), flat[i + 1]) for i in range(0, len(flat), 3) if flat[i + 2] in (b"1", "1")]

    def drain_done(self, call_ids: Sequence[str]) -> None:
        """The drained calls ``call_ids`` are in the broker: forget their payloads."""
        self._run("cancel_done", _step(call_ids), f"note {_which(call_ids)} handed back", [self.keys.undrained])

    def undrained(self, count: int) -> list[tuple[str, bytes]]:
        """Up to ``count`` calls a drain took and did not see the broker take (it died between the two)."""
        with redis_errors("read the calls an earlier drain left"):
            found: Any = self.client.hscan(self.keys.undrained, 0, count=count)[1]
        return [(text(key), value) for key, value in list(found.items())[:count]]

    def reschedule_many(
        self, call_ids: Sequence[str], *, countdown_ms: int | None = None, due_ms: int | None = None
    ) -> tuple[int, list[str]]:
        """Move the calls parked here to one due time: (that due time, the ids moved)."""
        due, *moved = self._run(
            "reschedule_many",
            [*due_args(countdown_ms, due_ms), *_step(call_ids)],
            f"reschedule {_which(call_ids)}",
        )
        return int(due), _texts(moved)

    def requeue_many(self, call_ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """Requeue the calls dead-lettered here: (ids requeued, ids left dead for want of a payload)."""
        requeued, left = self._run("requeue_many", _step(call_ids), f"requeue {_which(call_ids)}")
        return _texts(requeued), _texts(left)

    def purge_many(self, call_ids: Sequence[str]) -> list[str]:
        """Delete the calls dead-lettered here for good; the ids deleted."""
        return _texts(self._run("purge_many", _step(call_ids), f"purge {_which(call_ids)}"))

    # -- batches ----------------------------------------------------------------------------------

    def batch_add(
        self, group: str, item: str, size: int, max_wait_ms: int, call_id: str, meta: Limits | CallMeta
    ) -> tuple[int, str | None]:
        """Add an item to a group: (items now waiting, id of the call this add released or None). ``call_id``
        is the add's own too: the same add again (its reply lost) adds nothing and answers as the first did."""
        waiting, released = self._run(
            "batch_add",
            [group, item, size, max_wait_ms, call_id, meta_json(meta)],
            f"add an item to batch group {group}",
            [self.keys.batch_items(group), self.keys.batch_adds(group)],
            replicated=True,
        )
        return int(waiting), text(released) or None

    def due_groups(self, limit: int) -> list[str]:
        """Batch groups whose first item has waited their max wait, by the Redis clock."""
        with redis_errors("list due batch groups"):
            now_ms = server_ms(self.client, self.keys.batches)
            groups: Any = self.client.zrangebyscore(self.keys.batches, "-inf", now_ms, start=0, num=limit)
        return [text(group) for group in groups]

    def batch_flush(self, group: str, size: int, call_id: str, meta: Limits | CallMeta) -> int:
        """Flush a due group into one call; how many items it took (0: not due or flushed already)."""
        return int(
            self._run(
                "batch_flush",
                [group, size, call_id, meta_json(meta)],
                f"flush batch group {group}",
                [self.keys.batch_items(group)],
            )
        )

    # -- locks ----------------------------------------------------------------------------------

    def lock_take(
        self, name: str, token: str, ttl_ms: int, call_id: str = "", retry_ms: int = 0, delivery: int = 0
    ) -> tuple[int, int]:
        """Take a lock, or defer ``call_id`` behind it: (1 taken | 2 taken over from a holder whose run is gone |
        0 busy | -1 busy and call untracked | -2 ``delivery`` (0: not known) is older than the call's current
        one, ms left)."""
        status, remaining = self._run(
            "lock_take",
            [token, ttl_ms, call_id, retry_ms, delivery],
            f"take lock {name}",
            [self.keys.lock(name), self.keys.lock_waiters(name)],
        )
        return int(status), int(remaining)

    def lock_release(self, name: str, token: str) -> bool:
        """Release a lock held by ``token`` and wake its first waiter; False when the token lost it."""
        return bool(
            self._run(
                "lock_release",
                [token],
                f"release lock {name}",
                [self.keys.lock(name), self.keys.lock_waiters(name), self.keys.lock_wake(name)],
            )
        )

    def lock_extend(self, name: str, token: str, ttl_ms: int) -> bool:
        with redis_errors(f"extend lock {name}"):
            return bool(self._scripts["lock_extend"](keys=[self.keys.lock(name)], args=[token, ttl_ms]))

    def lock_wait(self, name: str, timeout: float) -> None:
        """Block up to ``timeout`` seconds for a release of the lock (no polling)."""
        with redis_errors(f"wait for lock {name}"):
            self.client.blpop([self.keys.lock_wake(name)], timeout=timeout)

    # -- reading ----------------------------------------------------------------------------------

    def last_release(self) -> tuple[float, float | None]:
        """The server's time and when a releaser last ran here (s since the epoch; None: never)."""
        with redis_errors("read when a releaser last ran"):
            now_ms = server_ms(self.client, self.keys.history)  # a cluster pipeline refuses TIME
            released_at = self.client.hget(self.keys.history, "released_at")
        return now_ms / 1000, None if released_at is None else int(released_at) / 1000

    def stats(self) -> dict[str, int]:
        """Counts per state, how many delayed calls are already due (overdue), and batch groups and items.
        Delayed calls include those due and waiting on their limits (``limited``, counted in ``due``) and those set
        aside on a pause (``paused``, not counted in ``due``: no releaser is behind with them)."""
        with redis_errors("read the store's counts"):
            pipe = self.client.pipeline(transaction=False)
            pipe.zcard(self.keys.delayed)
            pipe.zcard(self.keys.inflight)
            pipe.zcard(self.keys.dead)
            pipe.zcard(self.keys.batches)
            pipe.hget(self.keys.counters, "batch_items")
            pipe.zcard(self.keys.gated)
            pipe.zcard(self.keys.paused)
            delayed, inflight, dead, groups, items, limited, paused = pipe.execute()
            now_ms = server_ms(self.client, self.keys.delayed)
            overdue = self.client.zcount(self.keys.delayed, "-inf", now_ms)
            expired = self.client.zcount(self.keys.inflight, "-inf", now_ms)
        return {
            "delayed": delayed + limited + paused,
            "limited": limited,
            "paused": paused,
            "inflight": inflight,
            "dead": dead,
            "due": overdue + limited,
            "inflight_expired": expired,
            "batch_groups": groups,
            "batch_items": int(items or 0),
        }

    def find(self, call_id: str) -> Entry | None:
        """Where a call is now, or None when the store does not hold it."""
        with redis_errors(f"look up call {call_id}"):
            pipe = self.client.pipeline(transaction=False)
            for key in (self.keys.delayed, self.keys.inflight, self.keys.dead):
                pipe.zscore(key, call_id)
            pipe.hget(self.keys.meta, call_id)
            pipe.hget(self.keys.payloads, call_id)
            *scores, meta_raw, envelope = pipe.execute()
        for state, score in zip(STATES, scores, strict=True):
            if score is not None:
                return Entry(call_id, state, score, decode_meta(meta_raw, state), envelope)
        meta = decode_meta(meta_raw)
        if meta.get("s") == "limited" and "lw" in meta:  # due, waiting in its gate for its limits: still parked
            return Entry(call_id, "delayed", float(meta["lw"]), meta, envelope)
        noted = pause_note(meta)
        if noted is not None:  # set aside on a pause: still parked, if its member says so
            target, due_ms = noted
            with redis_errors(f"look up call {call_id}"):
                waits = self.client.zscore(self.keys.paused, paused_member(target, due_ms, call_id)) is not None
            if waits:
                return Entry(call_id, "delayed", float(due_ms), cast(CallMeta, {**meta, "s": "paused"}), envelope)
        return None

    def entries(self, state: str, limit: int = 100, offset: int = 0) -> list[Entry]:
        """A page of calls in one state, oldest score first (see :meth:`read`)."""
        return self.read(state, offset, limit)[0]

    def read(
        self, state: str, offset: int, count: int, *, newest_first: bool = False, payloads: str = "none"
    ) -> tuple[list[Entry], int]:
        """Up to ``count`` calls in ``state`` (one of :data:`LISTS`) from ``offset`` on (by score, oldest or newest
        first) with their metadata, and how many calls the state holds. Payloads: ``"none"``, ``"all"``, or
        ``"unrouted"`` (those of calls whose metadata names no broker list, for the paginator's queue filter).

        The calls held by their limits (``"limited"``) come by gate (the limit key), then by due time in each; the
        calls set aside on a pause (``"paused"``) by target, then by due time, each in the phase "paused" with its
        target and due time noted (``pz``, ``pd``) as :meth:`find` gives it."""
        if state not in LISTS:
            raise ValueError(f"unknown state {state!r}; expected one of {', '.join(LISTS)}")
        targets: list[str] = []
        with redis_errors(f"list {state} calls"):
            pipe = self.client.pipeline(transaction=False)
            if state in ("limited", "paused"):  # lex-ordered: the due time is in the member
                key = self.keys.gated if state == "limited" else self.keys.paused
                pipe.zrange(key, offset, offset + count - 1, desc=newest_first)
                pipe.zcard(key)
                lexed, size = pipe.execute()
                if state == "limited":
                    members = [gated_entry(member) for member in lexed]
                else:
                    aside = [paused_entry(member) for member in lexed]
                    members = [(call_id, due) for call_id, due, _ in aside]
                    targets = [target for _, _, target in aside]
            else:
                key = getattr(self.keys, state)
                pipe.zrange(key, offset, offset + count - 1, desc=newest_first, withscores=True)
                pipe.zcard(key)
                members, size = pipe.execute()
            ids = [text(member) for member, _ in members]
            found: Any = self.client.hmget(self.keys.meta, ids) if ids else []
            metas = [decode_meta(raw, state) for raw in found]
            for i, target in enumerate(targets):
                metas[i] = cast(CallMeta, {**metas[i], "s": "paused", "pz": target, "pd": int(members[i][1])})
            wanted = [
                i for i, meta in enumerate(metas) if payloads == "all" or (payloads != "none" and not meta.get("l"))
            ]
            raws: Any = self.client.hmget(self.keys.payloads, [ids[i] for i in wanted]) if wanted else []
        stored: list[bytes | None] = [None] * len(ids)
        for i, raw in zip(wanted, raws, strict=True):
            stored[i] = raw
        entries = [
            Entry(call_id, state, score, meta, raw)
            for call_id, (_, score), meta, raw in zip(ids, members, metas, stored, strict=True)
        ]
        return entries, int(size)

    def requeue_dead(self, step: int, passed: int) -> tuple[int, int, list[str]]:
        """Requeue up to ``step`` dead calls, past the first ``passed`` (which have no payload): (requeued,
        entries looked at, ids left dead for want of a payload)."""
        requeued, looked_at, *left = self._run("requeue_dead", [step, passed], "requeue dead-lettered calls")
        return int(requeued), int(looked_at), _texts(left)

    def purge_dead(self, step: int, bound: str) -> int:
        """Delete up to ``step`` of the oldest dead calls dead-lettered at or before ``bound`` (ms or ``+inf``)."""
        return int(self._run("purge_dead", [step, bound], "purge dead-lettered calls"))

    # -- pauses (see store/pauses.py and lua/pause.lua) -----------------------------------------------

    def _pause_script(self, args: Sequence[Any], action: str) -> Any:
        """Run ``pause.lua`` with the store's keys (registered on the first use)."""
        script = self.__dict__.get("_pause")
        if script is None:
            script = self.__dict__["_pause"] = self.client.register_script(pauses.pause_source())
        with redis_errors(action):
            return script(keys=self.keys.store_keys, args=list(args))

    def pause(
        self, kind: str, name: str, duration_ms: int | None, reason: str, lists: Sequence[str] = ()
    ) -> tuple[int, int | None]:
        """Pause a task or a queue (``kind``) here; a queue's ``lists`` are the broker lists its calls go to. A
        target paused already keeps its start. (since, until) in ms, by this server's clock; until None: until
        resumed."""
        target = pauses.target_of(kind, name)
        duration = "" if duration_ms is None else duration_ms
        since, until = self._pause_script(["pause", target, kind, name, duration, reason, *lists], f"pause {target}")
        return int(since), (int(until) if until not in (b"", "", None) else None)

    def resume(self, kind: str, name: str) -> bool:
        """End the pause of a task or a queue here: its calls go out with the next releases. Whether it was paused."""
        target = pauses.target_of(kind, name)
        return bool(self._pause_script(["resume", target], f"resume {target}"))

    def hold_paused(self, call_id: str, worker: str = "", delivery: int = 0) -> int:
        """A worker received delivery number ``delivery`` (0: not known) of a call whose target is paused: the call
        leaves flight for its pause (1), unless it is not in flight here, another worker holds it or that delivery
        is not its current one (0), or its target is no longer paused (-1)."""
        return int(self._pause_script(["hold", call_id, worker, delivery], f"hold paused call {call_id}"))

    def pause_records(self) -> tuple[int, dict[Any, Any]]:
        """This server's time (ms) and the pauses hash as it is (see :func:`pauses.active_pauses`): one round trip."""
        with redis_errors("read the pauses"):
            if isinstance(self.client, RedisCluster):  # TIME goes to the key's node
                found: Any = self.client.hgetall(self.keys.pauses)
                return server_ms(self.client, self.keys.pauses), found
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(self.keys.pauses)
            pipe.time()
            records, (seconds, micros) = pipe.execute()
        return int(seconds) * 1000 + int(micros) // 1000, records

    def paused_count(self, target: str) -> int:
        """How many calls wait on the pause of ``target`` here."""
        with redis_errors(f"count the calls waiting on {target}"):
            prefix = target.encode()
            return int(self.client.zlexcount(self.keys.paused, b"[" + prefix + b"\0", b"(" + prefix + b"\1"))

    def validate_consume(self, keys: Sequence[str], number: int, fail_every: int) -> bool:
        """One delivery of a validation message (``keys`` are the run's): whether it is recorded as processed."""
        return bool(self._scripts["validate_consume"](keys=list(keys), args=[number, fail_every]))


#: The most ids one bulk script call takes (scripts block Redis while they run).
LARGEST_STEP = 1000


def _which(call_ids: Sequence[str]) -> str:
    """The calls an action names in its error: ``call <id>`` for one."""
    return f"call {call_ids[0]}" if len(call_ids) == 1 else f"{len(call_ids)} calls"


def _step(call_ids: Sequence[str]) -> list[str]:
    if not 1 <= len(call_ids) <= LARGEST_STEP:
        raise ValueError(f"a bulk script takes 1 to {LARGEST_STEP} ids, not {len(call_ids)}")
    return list(call_ids)


def _texts(values: Sequence[bytes | str]) -> list[str]:
    return [text(value) for value in values]


def _claimed(flat: Sequence[Any]) -> list[Claimed]:
    """The calls of a claim or release reply: (id, payload, deliveries, list) each."""
    return [Claimed(text(flat[i]), flat[i + 1], int(flat[i + 2]), text(flat[i + 3])) for i in range(0, len(flat), 4)]


def due_args(countdown_ms: int | None, due_ms: int | None) -> tuple[str, int]:
    """The (mode, ms) arguments of the scripts that schedule: ``in`` a countdown, or ``at`` a due time."""
    if countdown_ms is not None:
        return "in", countdown_ms
    if due_ms is not None:
        return "at", due_ms
    raise ValueError("give countdown_ms or due_ms")
