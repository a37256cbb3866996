"""A Redis server's load between two snapshots of its INFO, and the exactness of calls that recorded their starts:
the pure part of the ``workers_releasing`` figure (importing it creates no app)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import redis

from .marks import Mark
from .report import percentile


def snapshot(client: redis.Redis) -> dict[str, Any]:
    """What the window figures are computed from: the server's counters now (three INFO calls)."""
    stats, cpu, commandstats = client.info("stats"), client.info("cpu"), client.info("commandstats")
    return {
        "at": time.monotonic(),
        "commands": int(stats["total_commands_processed"]),
        "cpu": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        "cmdstats": {
            name.removeprefix("cmdstat_"): {"calls": int(entry["calls"]), "usec": int(entry["usec"])}
            for name, entry in commandstats.items()
        },
    }


def window(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The load between two snapshots: commands/s, Redis CPU in ms per second, and per command calls/s and µs/s."""
    seconds = after["at"] - before["at"]
    if seconds <= 0:
        raise ValueError("the second snapshot must be later than the first")
    commands: dict[str, dict[str, float]] = {}
    for name, entry in after["cmdstats"].items():
        earlier = before["cmdstats"].get(name, {"calls": 0, "usec": 0})
        calls, usec = entry["calls"] - earlier["calls"], entry["usec"] - earlier["usec"]
        if calls:
            commands[name] = {
                "calls_per_s": calls / seconds,
                "usec_per_s": usec / seconds,
                "usec_per_call": usec / calls,
            }
    return {
        "seconds": seconds,
        "commands_per_s": (after["commands"] - before["commands"]) / seconds,
        "cpu_ms_per_s": (after["cpu"] - before["cpu"]) * 1000 / seconds,
        "by_command": dict(sorted(commands.items(), key=lambda item: -item[1]["calls_per_s"])),
    }


def exactness(due_ms: dict[str, int], marks: Sequence[Mark | str]) -> dict[str, Any]:
    """Each call's runs from the starts its task marked (:mod:`bench.marks`; a line as recorded is read as its mark),
    against its due time (ms, same clock)."""
    starts = [mark if isinstance(mark, Mark) else Mark.parse(mark) for mark in marks]
    runs = Counter(mark.call_id for mark in starts)
    first: dict[str, int] = {}
    early = 0
    for call_id, start, _ in starts:
        if call_id in due_ms and start < due_ms[call_id]:
            early += 1
        first[call_id] = min(start, first.get(call_id, start))
    late = [float(first[call_id] - due) for call_id, due in due_ms.items() if call_id in first]
    return {
        "calls": len(due_ms),
        "ran_once": sum(1 for call_id in due_ms if runs[call_id] == 1),
        "duplicates": sum(count - 1 for call_id, count in runs.items() if call_id in due_ms and count > 1),
        "missing": sum(1 for call_id in due_ms if call_id not in runs),
        "unknown": sum(count for call_id, count in runs.items() if call_id not in due_ms),
        "early": early,
        "p50_ms": percentile(late, 50) if late else None,
        "p99_ms": percentile(late, 99) if late else None,
        "max_ms": max(late) if late else None,
        "min_ms": min(late) if late else None,
    }
