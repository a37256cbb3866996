"""Dead letters: calls set aside in ``{tag}:dead`` (id -> when) rather than run again, requeued into the delay set
or purged for good, one at a time or a step of many (at most ``LARGEST_STEP`` ids a script)."""

from __future__ import annotations

from collections.abc import Sequence

from .base import StoreBase, step_ids, texts, which


class DeadLetters(StoreBase):
    """The store's methods that dead-letter calls, requeue them and purge them."""

    def bury(self, call_id: str, reason: str, *, only_inflight: bool = False) -> bool:
        """Dead-letter a call with ``reason``; with ``only_inflight``, only if it is in flight now."""
        flag = "1" if only_inflight else "0"
        return bool(self._run("bury", [call_id, reason, flag], f"dead-letter call {call_id}"))

    def requeue(self, call_id: str) -> int:
        """Requeue a dead-lettered call: 1 requeued, 0 not dead-lettered here, -1 no payload (it stays dead)."""
        requeued, left = self.requeue_many([call_id])
        return 1 if requeued else -1 if left else 0

    def requeue_many(self, call_ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """Requeue the calls dead-lettered here: (ids requeued, ids left dead for want of a payload)."""
        requeued, left = self._run("requeue_many", step_ids(call_ids), f"requeue {which(call_ids)}")
        return texts(requeued), texts(left)

    def purge_many(self, call_ids: Sequence[str]) -> list[str]:
        """Delete the calls dead-lettered here for good; the ids deleted."""
        return texts(self._run("purge_many", step_ids(call_ids), f"purge {which(call_ids)}"))

    def requeue_dead(self, step: int, passed: int) -> tuple[int, int, list[str]]:
        """Requeue up to ``step`` dead calls, past the first ``passed`` (which have no payload): (requeued,
        entries looked at, ids left dead for want of a payload)."""
        requeued, looked_at, *left = self._run("requeue_dead", [step, passed], "requeue dead-lettered calls")
        return int(requeued), int(looked_at), texts(left)

    def purge_dead(self, step: int, bound: str) -> int:
        """Delete up to ``step`` of the oldest dead calls dead-lettered at or before ``bound`` (ms or ``+inf``)."""
        return int(self._run("purge_dead", [step, bound], "purge dead-lettered calls"))
