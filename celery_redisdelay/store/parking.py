"""Parking: calls into the delay set (``{tag}:delayed``, id -> due time) and moved in it, and the unique and
debounce keys that hold a parked call (``{tag}:index``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .base import StoreBase, redis_errors, step_ids, text, texts, which
from .limits import Gate
from .meta import CallMeta, Limits, gated_meta, meta_json

#: ``park_keyed`` statuses.
STORED, KEPT, CONFLICT = 1, 0, -1
#: What :meth:`CallStore.send` did: pushed onto its list, in flight; or parked due now (not a broker message).
SENT, PARKED_NOW = 1, 2


class BrokerCopy(NamedTuple):
    """The broker's copy of a message the store adopts, where the broker is the store's Redis: ``where`` is
    ``"list"`` (``keys``: the queue list; ``copy``: the message as it is in the list) or ``"unacked"``
    (``keys``: kombu's unacked hash and its index; ``copy``: the delivery tag)."""

    where: str
    keys: tuple[str, ...]
    copy: bytes | str


def due_args(countdown_ms: int | None, due_ms: int | None) -> tuple[str, int]:
    """The (mode, ms) arguments of the scripts that schedule: ``in`` a countdown, or ``at`` a due time."""
    if countdown_ms is not None:
        return "in", countdown_ms
    if due_ms is not None:
        return "at", due_ms
    raise ValueError("give countdown_ms or due_ms")


class Parking(StoreBase):
    """The store's methods that put calls in the delay set and move them there."""

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

    def reschedule_many(
        self, call_ids: Sequence[str], *, countdown_ms: int | None = None, due_ms: int | None = None
    ) -> tuple[int, list[str]]:
        """Move the calls parked here to one due time: (that due time, the ids moved)."""
        due, *moved = self._run(
            "reschedule_many",
            [*due_args(countdown_ms, due_ms), *step_ids(call_ids)],
            f"reschedule {which(call_ids)}",
        )
        return int(due), texts(moved)
