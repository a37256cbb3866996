"""Reading the store as an operator does: its counts, where one call is, pages of the calls in one list, and when a
releaser last ran. Reads only, each a pipeline or two; nothing here changes a call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from .base import StoreBase, redis_errors, server_ms, text
from .census import census
from .forks import cached_property
from .meta import CallMeta, decode_meta
from .pauses import pause_note, paused_member
from .registries import Registries

STATES = ("delayed", "inflight", "dead")
#: The lists an operator reads: the states, the due calls held by their limits and the calls set aside on a pause
#: (delayed calls too, waiting in their gates or on their pause: :meth:`CallStore.find` says "delayed", with the
#: phase "limited" or "paused"; ``rd.paused()`` counts the paused ones per target).
LISTS = ("delayed", "limited", "paused", "inflight", "dead")


@dataclass(frozen=True)
class Entry:
    """A stored call as seen by an operator: where it is, when, and its metadata."""

    id: str
    state: str
    score_ms: float
    meta: CallMeta
    envelope: bytes | None
    queue: str | None = field(default=None, compare=False)  # where it goes, when a listing worked it out


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


class Reading(StoreBase):
    """The store's reads: counts, a call, a page of calls, the last release."""

    @cached_property
    def registries(self) -> Registries:
        """The store's structures, one registry each, for the reads above the store (:mod:`.registries`)."""
        return Registries(self.client, self.keys)

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
            counted = census(self.registries, server_ms(self.client, self.keys.delayed))
        return {
            "delayed": counted.parked,
            "limited": counted.limited,
            "paused": counted.paused,
            "inflight": counted.inflight,
            "dead": counted.dead,
            "due": counted.due,
            "inflight_expired": counted.expired,
            "batch_groups": counted.batch_groups,
            "batch_items": counted.batch_items,
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
