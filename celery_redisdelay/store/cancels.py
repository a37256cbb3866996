"""Cancels and drains: parked calls taken out of the delay set with their payloads, both by ``cancel.lua``, which
remembers each for a while so that the same request sent again (its reply lost) is answered as the first was."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .base import StoreBase, redis_errors, step_ids, text, which


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


class Cancels(StoreBase):
    """The store's methods that take parked calls out: a cancel, and a drain, which hands them back to Celery's own
    path (``operations/drain.py``)."""

    def cancel(self, call_id: str) -> Cancelled | None:
        """Drop a parked call: what it held, or None when it was not parked here (nor cancelled here in the last
        :data:`CANCEL_MEMORY_MS`)."""
        dropped = self.cancel_many([call_id])
        return dropped[0] if dropped else None

    def cancel_many(self, call_ids: Sequence[str], *, take_over: bool = True) -> list[Cancelled]:
        """Drop the calls still parked here (1 to 1,000 ids): each dropped call with its payload, and each
        call cancelled here in the last :data:`CANCEL_MEMORY_MS` (a cancel sent again after its reply was
        lost is answered so), to record if its caller has not and ``take_over``. Once recorded revoked, tell
        :meth:`cancel_done`."""
        flat = self._run(
            "cancel",
            [CANCEL_MEMORY_MS, "1" if take_over else "0", *step_ids(call_ids)],
            f"cancel {which(call_ids)}",
            [self.keys.cancelled, self.keys.unrecorded],
        )
        return [Cancelled(text(flat[i]), flat[i + 1], flat[i + 2] in (b"1", "1")) for i in range(0, len(flat), 3)]

    def cancel_done(self, call_ids: Sequence[str]) -> None:
        """The cancelled calls ``call_ids`` are recorded revoked: a cancel sent again leaves them be."""
        self._run("cancel_done", step_ids(call_ids), f"note {which(call_ids)} recorded revoked", [self.keys.unrecorded])

    # -- the way out: calls handed back to Celery's own path (operations/drain.py) -------------------------------

    def drain_take(self, call_ids: Sequence[str]) -> list[tuple[str, bytes]]:
        """Take the calls still parked here (1 to 1,000 ids) out of the store, as a cancel does, each with its
        payload, which stays in :attr:`Keyspace.undrained` until :meth:`drain_done`. A call another drain took
        in the last :data:`DRAIN_MEMORY_MS` and did not finish comes with its payload too."""
        flat = self._run(
            "cancel",
            [DRAIN_MEMORY_MS, "1", *step_ids(call_ids)],
            f"drain {which(call_ids)}",
            [self.keys.drained, self.keys.undrained],
        )
        return [(text(flat[i]), flat[i + 1]) for i in range(0, len(flat), 3) if flat[i + 2] in (b"1", "1")]

    def drain_done(self, call_ids: Sequence[str]) -> None:
        """The drained calls ``call_ids`` are in the broker: forget their payloads."""
        self._run("cancel_done", step_ids(call_ids), f"note {which(call_ids)} handed back", [self.keys.undrained])

    def undrained(self, count: int) -> list[tuple[str, bytes]]:
        """Up to ``count`` calls a drain took and did not see the broker take (it died between the two)."""
        with redis_errors("read the calls an earlier drain left"):
            found: Any = self.client.hscan(self.keys.undrained, 0, count=count)[1]
        return [(text(key), value) for key, value in list(found.items())[:count]]
