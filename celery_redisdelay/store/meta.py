"""A call's metadata: the small JSON object kept beside its payload (``{tag}:meta``), typed.

The Lua scripts read and write the same fields; ``lua/lib/meta.lua`` lists them and points here. The
park writes the limits (and, for a stored broker message, its list), not yet delivered; the scripts
then keep the delivery count and phase as the call moves (see README, the life of a call).
"""

from __future__ import annotations

import json
from typing import Any, NotRequired, TypedDict, cast


class Limits(TypedDict):
    """What a call is parked with: its task and limits (written once, by the park)."""

    t: str  # the task's name
    m: int  # deliveries before it is dead-lettered (0: no limit)
    r: int  # run timeout: ms a started call may run before the sweep delivers it again
    q: int  # queue timeout: ms a released call may wait in the broker queue
    o: NotRequired[int]  # 1: r is the task's own timeout, a hard end of a run under a lease


class CallMeta(TypedDict, total=False):
    """A call's metadata as read back: its limits and what the scripts add as it moves. Any field may be
    missing (metadata someone damaged reads as empty)."""

    t: str
    m: int
    r: int
    q: int
    l: str  # noqa: E741 - the broker list a stored broker message goes to (the fast release path)
    k: str  # the unique/debounce key it holds while parked
    d: int  # deliveries so far
    s: str  # phase: delayed | claimed | queued | running | swept | deferred | dead
    w: int  # deferrals behind a busy lock
    why: str  # why it was dead-lettered
    o: int  # 1: r is the task's own timeout
    h: str  # the worker holding it under a lease (worker/leases.py)
    g: str  # kombu's delivery tag of the delivery that worker holds
    x: int  # the hard end of its run (ms): started + r, when r is the task's own
    b: int  # 1: a warm shutdown gave it back, and kombu put its message back in the list in kombu's own form
    rj: int  # the delivery its worker rejected with requeue: a start of it written later is stale
    lg: str  # the gate of the limits it is under (store/limits.py)
    lw: int  # its due time, while it waits in its gate (s 'limited')
    mi: int  # when the sweep first found it popped from its list and held by no one (ms), at delivery md
    md: int


def routed(limits: Limits, list_key: str) -> CallMeta:
    """The metadata of a call stored as a broker message: its limits and the list it goes to."""
    return cast(CallMeta, {**limits, "l": list_key})


def meta_json(meta: Limits | CallMeta, key: str | None = None) -> str:
    """The metadata a call is parked with: its limits (and list), not yet delivered, and the unique or
    debounce key it holds. release.lua recognises this form by its end (``,"d":0,"s":"delayed"}``)."""
    fields = {**meta, "d": 0, "s": "delayed"}
    if key is not None:
        fields["k"] = key
    return json.dumps(fields, separators=(",", ":"))


def decode_meta(raw: bytes | str | None, state: str | None = None) -> CallMeta:
    """A call's stored metadata (empty when missing or not JSON); with its ``state``, as it stands there:
    release.lua leaves a first delivery's metadata as parked, which in flight means queued, delivery 1
    (meta.lua's ``load_inflight_meta``)."""
    try:
        meta = json.loads(raw) if raw else {}
    except ValueError:
        return CallMeta()
    if not isinstance(meta, dict):
        return CallMeta()
    if state == "inflight" and meta.get("s") == "delayed" and not meta.get("d"):
        meta.update(s="queued", d=1)
    return cast(CallMeta, meta)


FRESH = ',"d":0,"s":"delayed"}'


def gated_meta(stored: str, gate: str) -> str:
    """A call's stored metadata (:func:`meta_json`) with the gate of the limits it is under, before the end
    release.lua recognises a parked call's metadata by."""
    if not stored.endswith(FRESH):
        raise ValueError(f"not the metadata of a parked call: {stored!r}")
    return f'{stored[: -len(FRESH)]},"lg":{json.dumps(gate)}{FRESH}'


#: The metadata's fields an operator reads, by the names listings and descriptions give them (the one place a letter
#: is given its name), each with what a missing field reads as.
NAMED_FIELDS: dict[str, tuple[str, int | None]] = {
    "task": ("t", None),
    "phase": ("s", None),
    "deliveries": ("d", 0),
    "max_deliveries": ("m", None),
    "run_timeout_ms": ("r", None),
    "queue_timeout_ms": ("q", None),
    "deferrals": ("w", 0),
    "worker": ("h", None),
    "run_ends_ms": ("x", None),
    "key": ("k", None),
    "broker_list": ("l", None),
    "why": ("why", None),
}


def named(meta: CallMeta) -> dict[str, Any]:
    """A call's metadata by the names of :data:`NAMED_FIELDS`, in that order."""
    fields: dict[str, Any] = dict(meta)
    return {name: fields.get(letter, missing) for name, (letter, missing) in NAMED_FIELDS.items()}
