"""Pausing a task or a queue for the whole fleet: the checks of an operator's input, and what is paused.

A pause is written to every shard (:meth:`~celery_redisdelay.store.calls.CallStore.pause`); the release holds the
due calls of a paused target back in the store, ``send.lua`` holds the tracked calls due now, and workers hold back
the calls they receive while it lasts (:mod:`celery_redisdelay.worker.pausing`). See docs/pausing.rst.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..errors import RedisDelayError
from ..store.pauses import active_pauses, target_of

if TYPE_CHECKING:
    from ..store.depot import Depot

#: The longest reason a pause keeps (characters).
MOST_REASON = 500
#: The longest task or queue name a pause takes (characters).
MOST_NAME = 1000
#: The longest pause with an end (seconds): ten years. Longer: pause without one.
MOST_SECONDS = 10 * 365 * 86400
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


class PauseError(RedisDelayError, ValueError):
    """A pause or resume that cannot work (no target, two targets, a bad duration or reason); nothing was stored."""


def parse_duration(value: Any) -> float:
    """Seconds from a number of seconds or a text such as ``30s``, ``10m``, ``2h``, ``1d`` (or ``90``): positive,
    finite and at most :data:`MOST_SECONDS`."""
    if isinstance(value, bool):
        raise PauseError(f"a pause's duration is a number of seconds or a text like 10m, not {value!r}")
    if isinstance(value, str):
        found = _DURATION.match(value.lower())
        if not found:
            raise PauseError(f"cannot read the duration {value!r}: give seconds, or a number with s, m, h or d (10m)")
        seconds = float(found.group(1)) * _UNITS[found.group(2)]
    elif isinstance(value, (int, float)):
        seconds = float(value)
    else:
        raise PauseError(f"a pause's duration is a number of seconds or a text like 10m, not {value!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise PauseError(f"a pause's duration must be a positive, finite number of seconds, not {value!r}")
    if seconds > MOST_SECONDS:
        raise PauseError(f"a pause's duration is at most {MOST_SECONDS} seconds (ten years), not {value!r}")
    return seconds


def check_target(task: Any, queue: Any) -> tuple[str, str]:
    """The (kind, name) of a pause's target: a task or a queue, exactly one, a non-empty name."""
    if task is not None and queue is not None:
        raise PauseError("pause one target at a time: give a task or a queue, not both")
    if task is None and queue is None:
        raise PauseError("give the task or the queue to pause (task=... or queue=...)")
    kind, name = ("task", task) if task is not None else ("queue", queue)
    if not isinstance(name, str) or not name.strip():
        raise PauseError(f"the {kind} to pause is a non-empty name, not {name!r}")
    if len(name) > MOST_NAME or "\0" in name:
        raise PauseError(f"the {kind} name must be at most {MOST_NAME} characters, without NUL")
    return kind, name


def check_reason(reason: Any) -> str:
    if not isinstance(reason, str):
        raise PauseError(f"a pause's reason is a text, not {reason!r}")
    if len(reason) > MOST_REASON:
        raise PauseError(f"a pause's reason is at most {MOST_REASON} characters, not {len(reason)}")
    return reason


def queue_lists(depot: Depot, queue: str) -> list[str]:
    """The broker lists the calls of ``queue`` go to, at every priority step (kombu's Redis names): a call whose
    stored metadata names one of them is held by a pause of the queue."""
    layout = depot.broker_layout
    return sorted({layout.list_key(queue, step) for step in (0, *layout.priority_steps)})


def moment(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def pause(depot: Depot, task: Any = None, queue: Any = None, seconds: Any = None, reason: Any = "") -> dict[str, Any]:
    """Pause a task or a queue on every shard (checked first: bad input stores nothing); what is paused now."""
    kind, name = check_target(task, queue)
    duration_ms = None if seconds is None else max(1, round(parse_duration(seconds) * 1000))
    why = check_reason(reason)
    if kind == "queue" and not depot.wire_format:
        # A queue's calls are known by the broker lists they go to, which only a Redis broker has (each call
        # names its list in the store); elsewhere (RabbitMQ) such a pause would hold nothing back.
        raise PauseError(
            f"cannot pause queue {name!r}: pausing a queue needs a Redis broker, and this app's broker is "
            f"{depot.app.connection_for_write().transport_cls!r}; pause its tasks instead (task=...)"
        )
    lists = queue_lists(depot, name) if kind == "queue" else []
    since = until = None
    for store in depot.shards.all():
        started, ends = store.pause(kind, name, duration_ms, why, lists)
        since = started if since is None else min(since, started)
        until = ends
    found = [one for one in paused(depot) if one["kind"] == kind and one["name"] == name]
    if found:
        return found[0]
    return {"kind": kind, "name": name, "since": moment(since), "until": moment(until), "reason": why, "waiting": 0}


def resume(depot: Depot, task: Any = None, queue: Any = None) -> bool:
    """End the pause of a task or a queue on every shard: its calls go out with the next releases, in due order.
    Whether it was paused (on any shard)."""
    kind, name = check_target(task, queue)
    was = False
    for store in depot.shards.all():
        was = store.resume(kind, name) or was
    return was


def paused(depot: Depot) -> list[dict[str, Any]]:
    """What is paused, by kind and name: ``kind``, ``name``, ``since`` and ``until`` (aware datetimes, UTC; until
    None: until resumed), ``reason`` and ``waiting``, the calls waiting on it in the store (every shard)."""
    found: dict[str, dict[str, Any]] = {}
    stores = depot.shards.all()
    for store in stores:
        now_ms, records = store.pause_records()
        for target, one in active_pauses(records, now_ms).items():
            seen = found.get(target)
            if seen is None:
                found[target] = {
                    "kind": one.kind,
                    "name": one.name,
                    "since": moment(one.since_ms),
                    "until": moment(one.until_ms),
                    "reason": one.reason,
                    "waiting": 0,
                }
            elif seen["since"] is not None and one.since_ms / 1000 < seen["since"].timestamp():
                seen["since"] = moment(one.since_ms)
    for target, entry in found.items():
        entry["waiting"] = sum(store.paused_count(target) for store in stores)
    return sorted(found.values(), key=lambda entry: (entry["kind"], entry["name"]))


__all__ = ["MOST_REASON", "PauseError", "check_target", "parse_duration", "pause", "paused", "resume", "target_of"]
