"""Pauses as the store keeps them: a record per paused task or queue, and the calls waiting on it.

A pause lives in each shard (``{tag}:pauses``, target -> JSON record; ``{tag}:paused``, the calls set aside, see
``lua/lib/pauses.lua``). ``lua/pause.lua`` writes the records and holds the calls a worker received while
their target was paused; the release moves due calls of a paused target aside and brings them back when the pause
ends. This module builds that script (as :mod:`.scripts` builds the store's), runs it (:class:`Pausing`, the
store's pause methods) and reads records back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from .base import StoreBase, redis_errors
from .meta import CallMeta
from .registries import Pauses
from .scripts import compose

#: The kinds of target a pause names.
KINDS = ("task", "queue")


def target_of(kind: str, name: str) -> str:
    """The field of a pause in the pauses hash, and the prefix of its calls in the paused set."""
    return f"{kind}:{name}"


@cache
def pause_source() -> str:
    """``pause.lua`` with its header and libraries ahead of it, as every store script has them."""
    return compose(files(__package__).joinpath("lua", "pause.lua").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Pause:
    """One pause as a shard records it (times in ms, by the Redis clock)."""

    target: str
    kind: str
    name: str
    since_ms: int
    until_ms: int | None
    reason: str
    lists: tuple[str, ...] = ()
    resumed: bool = False

    def active(self, now_ms: int) -> bool:
        """Whether it still holds calls back: not resumed, and its until (if any) not passed."""
        return not self.resumed and (self.until_ms is None or self.until_ms > now_ms)


def decode_pause(target: bytes | str, raw: bytes | str) -> Pause:
    """A record of the pauses hash; a damaged one reads as resumed (it holds nothing back, as the scripts read it)."""
    field = target.decode() if isinstance(target, bytes) else target
    kind, _, name = field.partition(":")
    try:
        record: Any = json.loads(raw)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return Pause(field, kind, name, 0, None, "", (), True)
    until = record.get("u")
    lists = record.get("ls")
    return Pause(
        target=field,
        kind=str(record.get("k") or kind),
        name=str(record.get("n") or name),
        since_ms=int(record.get("s") or 0),
        until_ms=int(until) if isinstance(until, (int, float)) else None,
        reason=str(record.get("why") or ""),
        lists=tuple(str(one) for one in lists) if isinstance(lists, list) else (),
        resumed=bool(record.get("r")),
    )


def active_pauses(records: dict[Any, Any], now_ms: int) -> dict[str, Pause]:
    """The pauses among ``records`` (a ``HGETALL`` of the pauses hash) that hold calls back at ``now_ms``."""
    pauses = (decode_pause(target, raw) for target, raw in records.items())
    return {pause.target: pause for pause in pauses if pause.active(now_ms)}


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


class Pausing(StoreBase):
    """The store's pause methods (``lua/pause.lua``): pause and resume a target, hold a call received while its
    target is paused, read the pauses."""

    def _pause_script(self, args: Sequence[Any], action: str) -> Any:
        """Run ``pause.lua`` with the store's keys (registered on the first use)."""
        script = self.__dict__.get("_pause")
        if script is None:
            script = self.__dict__["_pause"] = self.client.register_script(pause_source())
        with redis_errors(action):
            return script(keys=self.keys.store_keys, args=list(args))

    def pause(
        self, kind: str, name: str, duration_ms: int | None, reason: str, lists: Sequence[str] = ()
    ) -> tuple[int, int | None]:
        """Pause a task or a queue (``kind``) here; a queue's ``lists`` are the broker lists its calls go to. A
        target paused already keeps its start. (since, until) in ms, by this server's clock; until None: until
        resumed."""
        target = target_of(kind, name)
        duration = "" if duration_ms is None else duration_ms
        since, until = self._pause_script(["pause", target, kind, name, duration, reason, *lists], f"pause {target}")
        return int(since), (int(until) if until not in (b"", "", None) else None)

    def resume(self, kind: str, name: str) -> bool:
        """End the pause of a task or a queue here: its calls go out with the next releases. Whether it was paused."""
        target = target_of(kind, name)
        return bool(self._pause_script(["resume", target], f"resume {target}"))

    def hold_paused(self, call_id: str, worker: str = "", delivery: int = 0) -> int:
        """A worker received delivery number ``delivery`` (0: not known) of a call whose target is paused: the call
        leaves flight for its pause (1), unless it is not in flight here, another worker holds it or that delivery
        is not its current one (0), or its target is no longer paused (-1)."""
        return int(self._pause_script(["hold", call_id, worker, delivery], f"hold paused call {call_id}"))

    def pause_records(self) -> tuple[int, dict[Any, Any]]:
        """This server's time (ms) and the pauses hash as it is (see :func:`active_pauses`): one round trip."""
        with redis_errors("read the pauses"):
            return Pauses(self.client, self.keys.pauses).records_and_clock()

    def paused_count(self, target: str) -> int:
        """How many calls wait on the pause of ``target`` here."""
        with redis_errors(f"count the calls waiting on {target}"):
            prefix = target.encode()
            return int(self.client.zlexcount(self.keys.paused, b"[" + prefix + b"\0", b"(" + prefix + b"\1"))
