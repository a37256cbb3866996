"""The call store: parked calls in Redis and every state change of their life, one script each.

The life of a call::

    park ──> delayed ──claim──> in flight (claimed) ──confirm──> in flight (queued)
               ^  ^                  │ unclaim                       │ start (a worker runs it)
               │  └──────────────────┘                               v
               │                                          in flight (running) ──ack──> gone
               └───── sweep (deadline passed) <─── in flight ──sweep, too many deliveries──> dead
                                                                         dead ──requeue──> delayed

:class:`CallStore` is one shard's store, made of one part per Redis structure it changes, each in its own module:
:mod:`.parking` (the delay set), :mod:`.releasing` (due calls into flight), :mod:`.inflight` (runs and leases, the
sweep), :mod:`.cancels` (cancels and drains), :mod:`.dead_letters`, :mod:`.pauses`, :mod:`.batches`, :mod:`.locks`,
:mod:`.reading` (counts, finding and listing calls) and :mod:`.validation`, all on :mod:`.base` (the client, the
keys, running a script). The names they define are importable from here, as they were when this module held them.
"""

from __future__ import annotations

from .base import LARGEST_STEP, redis_errors, server_ms, text
from .batches import Batches
from .cancels import CANCEL_MEMORY_MS, DRAIN_MEMORY_MS, Cancelled, Cancels
from .dead_letters import DeadLetters
from .inflight import OUTCOMES, STARTS, InFlight
from .locks import Locks
from .parking import CONFLICT, KEPT, PARKED_NOW, SENT, STORED, BrokerCopy, Parking, due_args
from .pauses import Pausing, pause_note, paused_member
from .reading import LISTS, STATES, Entry, Reading, gated_entry, paused_entry
from .releasing import Claimed, Released, Releasing
from .validation import Validation

__all__ = [
    "CANCEL_MEMORY_MS",
    "CONFLICT",
    "DRAIN_MEMORY_MS",
    "KEPT",
    "LARGEST_STEP",
    "LISTS",
    "OUTCOMES",
    "PARKED_NOW",
    "SENT",
    "STARTS",
    "STATES",
    "STORED",
    "BrokerCopy",
    "CallStore",
    "Cancelled",
    "Claimed",
    "Entry",
    "Released",
    "due_args",
    "gated_entry",
    "pause_note",
    "paused_entry",
    "paused_member",
    "redis_errors",
    "server_ms",
    "text",
]


class CallStore(Parking, Releasing, InFlight, Cancels, DeadLetters, Pausing, Batches, Locks, Reading, Validation):
    """Python face of the Lua scripts; every method is one round trip."""
