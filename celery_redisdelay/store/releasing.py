"""Release: due calls out of the delay set and into flight (``{tag}:inflight``), claimed for publishing through
kombu or pushed straight onto the broker's lists by the script, and given back when a publish fails."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .base import StoreBase, text


@dataclass(frozen=True)
class Claimed:
    """A call taken for publishing: its id, its envelope, which delivery this is, and the broker list its
    metadata names (a call stored as a broker message; ``""`` otherwise)."""

    id: str
    envelope: bytes
    deliveries: int
    list_key: str = field(default="", compare=False)


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


def _claims(calls: Sequence[str | Claimed]) -> list[str | int]:
    """Each call as (id, delivery) for confirm.lua and unclaim.lua: a :class:`Claimed` names the delivery its claim
    made, so that a releaser whose claim ran out (the call swept and claimed again by another) leaves the new claim
    alone; a bare id (0) acts on whichever claim the call is under."""
    flat: list[str | int] = []
    for call in calls:
        flat.extend((call.id, call.deliveries) if isinstance(call, Claimed) else (call, 0))
    return flat


def _claimed(flat: Sequence[Any]) -> list[Claimed]:
    """The calls of a claim or release reply: (id, payload, deliveries, list) each."""
    return [Claimed(text(flat[i]), flat[i + 1], int(flat[i + 2]), text(flat[i + 3])) for i in range(0, len(flat), 4)]


class Releasing(StoreBase):
    """The store's methods that release due calls: claim, push, confirm, give back."""

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

    def confirm(self, calls: Sequence[str | Claimed], queue_timeout_ms: int, longest_ms: int = 0) -> int:
        """The broker has the claimed ``calls`` (ids, or the :class:`Claimed` themselves: then only while under that
        claim): each waits in its queue up to its queue timeout (its own, else ``queue_timeout_ms``), and no longer
        than ``longest_ms`` when given (a publish in doubt). How many were confirmed."""
        if not calls:
            return 0
        return int(self._run("confirm", [queue_timeout_ms, longest_ms, *_claims(calls)], "confirm published calls"))

    def unclaim(self, calls: Sequence[str | Claimed]) -> int:
        """Give back claimed ``calls`` that were not published (ids, or the :class:`Claimed` themselves: then only
        while under that claim), due at once, their delivery not counted. How many went back."""
        if not calls:
            return 0
        return int(self._run("unclaim", _claims(calls), "give back unpublished calls"))
