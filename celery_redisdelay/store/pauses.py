"""Pauses as the store keeps them: a record per paused task or queue, and the calls waiting on it.

A pause lives in each shard (``{tag}:pauses``, target -> JSON record; ``{tag}:paused``, the calls set aside, see
``lua/lib/pauses.lua``). ``lua/pause.lua`` writes the records and holds the calls a worker received while
their target was paused; the release moves due calls of a paused target aside and brings them back when the pause
ends. This module builds that script (as :mod:`.scripts` builds the store's) and reads
records back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

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
