"""The call store's layout, written once: the keys every store script receives, and the numbers Python and Lua share.

:mod:`.keys` names the keys from :data:`STORE_KEYS`, in its order; :mod:`.scripts` writes from the same table the
header of each Lua script (a local per key it uses, ``DELAYED = KEYS[1]``, and a check of its type), so a key's
position is stated here and nowhere else. The Lua names are the names here in capitals.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StoreKey:
    """One of the keys every store script receives: its name (the key is ``{tag}:<name>``), its Redis type, and
    what it holds."""

    name: str
    type: str
    holds: str
    #: Whether the key exists in most stores most of the time. The others are looked for with one EXISTS before
    #: their types are checked: a key that is not there cannot have the wrong type.
    usual: bool = False

    @property
    def lua(self) -> str:
        """The name of the Lua local that holds this key in every script that uses it."""
        return self.name.upper()


#: The keys every store script receives first, in this order, all under one hash tag. A script's own keys (a batch
#: group's, a lock's, a broker list) follow them, from ``KEYS[FIXED_KEYS + 1]`` on. The metadata's fields are
#: listed in :mod:`.meta` (``CallMeta``).
STORE_KEYS: tuple[StoreKey, ...] = (
    StoreKey("delayed", "zset", "id -> due time (ms since the epoch, server clock)", usual=True),
    StoreKey("inflight", "zset", "id -> deadline (ms)", usual=True),
    StoreKey("dead", "zset", "id -> when it was dead-lettered (ms)"),
    StoreKey("payloads", "hash", "id -> envelope (opaque to Lua), or a batch stub (batch_add.lua)", usual=True),
    StoreKey("meta", "hash", "id -> the call's metadata, a small JSON object (meta.py, CallMeta)", usual=True),
    StoreKey("index", "hash", "unique/debounce key -> id of the parked call holding it"),
    StoreKey("batches", "zset", "batch group -> when the group is flushed (ms): its first item + max wait"),
    StoreKey(
        "counters",
        "hash",
        "batch_items (items waiting in all groups), lock_lines (locks with waiters), and the running totals "
        "(operations/metrics.py, TOTALS)",
        usual=True,
    ),
    StoreKey("wake", "zset", "markers for precise releasers: a call parked earlier than every other (wake.lua)"),
    StoreKey(
        "history",
        "hash",
        "the totals per minute, '<minute>:<name>' -> count, for HISTORY_MINUTES; 'pruned', 'unacked_seen', "
        "'queued_seen', 'holders_seen' (how far the sweep has read), 'released_at' (history.lua, sweep.lua)",
        usual=True,
    ),
    StoreKey("limits", "hash", "'code:<limit>' as the code declares it, 'set:<limit>' as an operator set it"),
    StoreKey("gates", "zset", "gate -> when its first waiting call may be looked at again (ms)"),
    StoreKey("gated", "zset", "(lex) gate NUL due NUL id: the due calls waiting in each gate"),
    StoreKey("slots", "zset", "(lex) limit instance NUL id: slot holders as earlier releases wrote them"),
    StoreKey("paces", "zset", "limit instance NUL rate number -> the rate's theoretical arrival time (GCRA, ms)"),
    StoreKey("waits", "zset", "(lex) limit instance NUL gate: gates waiting for a slot of that instance"),
    StoreKey("held", "hash", "limit instance -> concurrency slots held; NUL limit -> the same over its instances"),
    StoreKey("holders", "hash", "id -> the limit instances whose slots the call in flight holds, one per line"),
    StoreKey("pauses", "hash", "'task:<name>' or 'queue:<name>' -> the pause's record (JSON, pauses.lua)"),
    StoreKey("paused", "zset", "(lex) target NUL due NUL id: the calls waiting on a pause"),
)

#: How many minutes of history the store keeps (history.lua prunes older ones).
HISTORY_MINUTES = 1440

#: Upper bounds (ms) of the release lateness buckets (releases.lua counts them; the last bucket is unbounded).
LATENESS_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
