"""Every change the package makes to an object it does not own (Celery's, kombu's, the app's), made here, in one
stated order, and each undone here.

A patch replaces attributes of one object (or items of a mapping) and keeps what they were. The patches, in the
order they go on, a later one wrapping an earlier one where both change the same object:

1. ``send_task``: ``app.send_task``, so that calls by name are parked; when ``RedisDelay(app)`` is made
   (extension.py).
2. ``revoke``: ``Panel.data["revoke"]``, the worker's remote-control command, so that a revoke drops parked calls;
   when a worker is made, once per process (bootsteps.py).
3. ``strategy.received``: ``task.Strategy``, the task's message handler, so that a received eta message is parked;
   when a worker is made with ``redisdelay_park_received``, before its consumer makes the handlers
   (worker/received.py).
4. ``strategy.stale``: over it, so that a stale redelivery is dropped (worker/stale.py).
5. ``strategy.paused``: over that, so that a call of a paused task or queue is held back before anything else
   looks at it (worker/pausing.py).
6. ``qos.broker_loss``: a task channel's ``QoS``, so that a lost broker connection does not end the worker; each
   time the consumer starts (worker/broker_loss.py).
7. ``qos.unacked``: over it, so that kombu's unacked bookkeeping is left out for the store's calls
   (worker/unacked.py).

:func:`apply` refuses a patch out of that order on one object, and a second of the same name; :func:`undo` takes
an object's patches off, the last first. Tests take off what they put on that way.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

#: The patches, in the order they go on (see the module's docstring).
ORDER = (
    "send_task",
    "revoke",
    "strategy.received",
    "strategy.stale",
    "strategy.paused",
    "qos.broker_loss",
    "qos.unacked",
)
_MISSING = object()


#: The attribute of a patched object that lists its patches (kept on the object, so that they go with it).
PATCHES = "_redisdelay_patches"


@dataclass
class Patch:
    """One patch: its ``name``, the ``replacements`` it made and the ``originals`` of what they replaced
    (attributes, or items where ``items``)."""

    name: str
    replacements: dict[str, Any]
    items: bool = False
    originals: dict[str, Any] = field(default_factory=dict)


_OF_MAPPINGS: dict[int, list[Patch]] = {}  # the patches of mappings (Panel.data), which take no attribute
_LOCK = threading.Lock()


def _patches(target: Any, items: bool) -> list[Patch]:
    if items:
        return _OF_MAPPINGS.setdefault(id(target), [])
    made: list[Patch] | None = target.__dict__.get(PATCHES)
    if made is None:
        made = []
        setattr(target, PATCHES, made)
    return made


def apply(name: str, target: Any, replacements: Mapping[str, Any], *, items: bool = False) -> Patch:
    """Replace ``target``'s attributes (its items, where ``items``) by ``replacements``, keeping what they were.
    Raises ``ValueError`` for an unknown name, for a patch ``target`` has already, and for one that would go on
    over a patch that comes after it in :data:`ORDER`."""
    if name not in ORDER:
        raise ValueError(f"unknown patch {name!r}: the patches are {', '.join(ORDER)}")
    with _LOCK:
        applied = _patches(target, items)
        for other in applied:
            if other.name == name:
                raise ValueError(f"patch {name!r} is already applied to {target!r}")
            if ORDER.index(other.name) > ORDER.index(name):
                raise ValueError(f"patch {name!r} must go on before {other.name!r}, which {target!r} has already")
        patch = Patch(name, dict(replacements), items)
        for key, value in patch.replacements.items():
            if items:
                patch.originals[key] = target.get(key, _MISSING)
                target[key] = value
            else:
                patch.originals[key] = target.__dict__.get(key, _MISSING)
                setattr(target, key, value)
        applied.append(patch)
        return patch


def applied(target: Any, name: str | None = None, *, items: bool = False) -> list[Patch]:
    """The patches on ``target`` (of ``name`` only, where given), first applied first."""
    with _LOCK:
        found = _OF_MAPPINGS.get(id(target), []) if items else getattr(target, "__dict__", {}).get(PATCHES, [])
        return [patch for patch in found if name is None or patch.name == name]


def undo(target: Any, *, items: bool = False) -> list[str]:
    """Take ``target``'s patches off, the last applied first; the names of those taken off."""
    with _LOCK:
        patches = _OF_MAPPINGS.pop(id(target), []) if items else target.__dict__.pop(PATCHES, [])
    for patch in reversed(patches):
        for key, original in patch.originals.items():
            if isinstance(target, MutableMapping) and patch.items:
                if original is _MISSING:
                    target.pop(key, None)
                else:
                    target[key] = original
            elif original is _MISSING:
                delattr(target, key)  # the class's own shows again
            else:
                setattr(target, key, original)
    return [patch.name for patch in reversed(patches)]
