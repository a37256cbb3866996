"""What a soak measures besides the messages: the memory of every process, and what Redis holds.

* RSS: ``VmRSS`` from ``/proc/<pid>/status`` of every process of the run (workers with their pool
  children, beat, the releaser, every redis-server and sentinel, the runner itself), sampled every
  :data:`SAMPLE_SECONDS` by a thread; a process started again after a fault is a new row.
* Redis: ``INFO memory``, ``DBSIZE`` and every key with its type and size (fields, members, items),
  at the start (processes ready, nothing parked) and after the drain. A key that is there after the
  drain and was not at the start is listed, and is a leak unless it is one of :data:`DOCUMENTED`.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

SAMPLE_SECONDS = 5.0
SERIES_SECONDS = 30.0  # the samples kept in the report
TICK_TASK = "redisdelay.tick"
#: The fields of INFO memory kept in the report: what the dataset is, and what Redis holds besides it.
MEMORY_FIELDS = (
    "used_memory",
    "used_memory_rss",
    "used_memory_dataset",
    "used_memory_overhead",
    "used_memory_startup",
    "used_memory_scripts",
    "used_memory_scripts_eval",
    "number_of_cached_scripts",
    "mem_clients_normal",
    "mem_aof_buffer",
    "mem_replication_backlog",
    "mem_fragmentation_ratio",
    "allocator_allocated",
)
#: Keys a drained store or broker may hold that it did not hold before the first call: each named with why.
DOCUMENTED = {
    r"\{chaos(/\d+)?\}:counters": "running totals for the metrics (a fixed set of fields)",
    r"\{chaos(/\d+)?\}:wake": "markers for precise releasers (at most 16)",
    r"\{chaos(/\d+)?\}:history": "the per-minute history (the last 24 hours, pruned by the sweep)",
    r"\{chaos(/\d+)?\}:workers": "the workers holding leases (a killed worker's entry stays until another worker's "
    "renewal finds it three leases old)",
    r"\{chaos\}:shards": "the shard registry (with redisdelay_shards > 1)",
    r"\{chaos(/\d+)?\}:batch-adds:.*": "a batch group's last add ids (expires a minute after its last add)",
    r"\{chaos(/\d+)?\}:cancelled": "the calls cancelled in the last ten minutes (expires ten minutes after the last)",
    r"\{chaos(/\d+)?\}:unrecorded": "cancelled calls whose caller could not say it recorded them revoked "
    "(a fault cut that; expires ten minutes after the last cancel)",
    r"\{chaos(/\d+)?\}:lock-wake:.*": "a lock's wake-up list (expires 10 s after the release)",
    r"\{chaos(/\d+)?\}:probe:.*": "a worker's heartbeat for the probe (expires ten minutes after its last write)",
    r"_kombu\.binding\..*": "kombu's queue bindings (a killed worker's pidbox binding stays)",
    r"unacked_mutex": "kombu's restore lock (expires)",
    r"unacked_index": "kombu's index of the unacknowledged messages (the tick being run, see unacked)",
}
_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{12}")


def rss_kib(pid: int) -> int | None:
    """The resident set of ``pid`` in KiB, or None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def children_of(pid: int) -> list[int]:
    """The direct children of ``pid`` (a worker's pool processes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


@dataclass
class Series:
    """The RSS samples of one process: (seconds since the start of the soak, KiB)."""

    name: str
    pid: int
    samples: list[tuple[float, int]] = field(default_factory=list)

    def at_or_after(self, moment: float) -> tuple[float, int] | None:
        return next((sample for sample in self.samples if sample[0] >= moment), None)

    def summary(self, warm_seconds: float) -> dict[str, Any]:
        """First sample, the first after ``warm_seconds``, the last, the peak, the highest sample of the first two
        thirds of the process's life and the lowest of the last third, the slope over the last two thirds (KiB
        a minute, least squares), and the samples every :data:`SERIES_SECONDS`.

        ``growth_kib`` (the lowest of the last third less the highest before) tells a leak from garbage: a
        Python process's RSS climbs while reference cycles (exception tracebacks) pile up between full garbage
        collections, to the high-water mark of that garbage, and stays there (freed memory is reused, not
        returned to the system); a leak keeps the RSS rising above anything it reached before.
        """
        first, last = self.samples[0], self.samples[-1]
        warm = self.at_or_after(first[0] + warm_seconds) or last
        third = (last[0] - first[0]) / 3
        before = [kib for moment, kib in self.samples if moment < last[0] - third] or [first[1]]
        late = [kib for moment, kib in self.samples if moment >= last[0] - third] or [last[1]]
        series, shown = [], -SERIES_SECONDS
        for moment, kib in self.samples:
            if moment - shown >= SERIES_SECONDS:
                series.append((round(moment), kib))
                shown = moment
        return {
            "name": self.name,
            "pid": self.pid,
            "from_s": round(first[0], 1),
            "to_s": round(last[0], 1),
            "first_kib": first[1],
            "warm_kib": warm[1],
            "last_kib": last[1],
            "peak_kib": max(kib for _, kib in self.samples),
            "high_before_kib": max(before),
            "floor_late_kib": min(late),
            "growth_kib": min(late) - max(before),
            "slope_kib_per_min": round(_slope([s for s in self.samples if s[0] >= first[0] + third]) * 60, 1),
            "series": series,
        }


def _slope(samples: list[tuple[float, int]]) -> float:
    if len(samples) < 3:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    spread = sum((t - mean_t) ** 2 for t, _ in samples)
    return sum((t - mean_t) * (v - mean_v) for t, v in samples) / spread if spread else 0.0


class Sampler(threading.Thread):
    """Samples the RSS of every process ``processes()`` names, every :data:`SAMPLE_SECONDS`, until stopped."""

    def __init__(self, processes: Callable[[], list[tuple[str, int]]], started: float) -> None:
        super().__init__(name="chaos-rss", daemon=True)
        self.processes = processes
        self.started = started  # time.monotonic() of the soak's start
        self.series: dict[tuple[str, int], Series] = {}
        self.stopping = threading.Event()

    def sample(self) -> None:
        moment = time.monotonic() - self.started
        for name, pid in self.processes():
            kib = rss_kib(pid)
            if kib is not None:
                self.series.setdefault((name, pid), Series(name, pid)).samples.append((moment, kib))

    def run(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            self.stopping.wait(SAMPLE_SECONDS)

    def finish(self) -> None:
        self.stopping.set()
        self.join(30)
        self.sample()  # the end, after the drain

    def summaries(self, warm_seconds: float) -> list[dict[str, Any]]:
        return [series.summary(warm_seconds) for series in self.series.values() if series.samples]


def key_size(client: redis.Redis, key: bytes, kind: str) -> int:
    sizes: dict[str, Callable[[bytes], Any]] = {
        "hash": client.hlen,
        "zset": client.zcard,
        "list": client.llen,
        "set": client.scard,
        "string": client.strlen,
        "stream": client.xlen,
    }
    return int(sizes[kind](key)) if kind in sizes else 0


def held_tasks(client: redis.Redis, key: bytes, kind: str) -> list[str] | None:
    """The task names of the kombu messages a broker list or kombu's ``unacked`` hash holds (100 at most)."""
    if kind == "list":
        raw = client.lrange(key, 0, 99)
    elif kind == "hash" and key == b"unacked":
        raw = [json.loads(value)[0] for value in client.hvals(key)[:100]]
    else:
        return None
    names = set()
    for message in raw:
        try:
            payload = json.loads(message) if isinstance(message, (bytes, str)) else message
            names.add(str(payload["headers"]["task"]))
        except (ValueError, KeyError, TypeError):
            names.add("?")
    return sorted(names)


def inventory(client: redis.Redis) -> dict[str, Any]:
    """Memory and every key of one Redis: type, size, and the tasks of the messages a broker list or kombu's
    ``unacked`` hash holds. The slow log is emptied first: it keeps copies of the arguments of the last slow
    commands (parks carry a whole message), which INFO counts in the dataset."""
    client.slowlog_reset()
    histograms = len(client.info("latencystats"))  # Redis 7: one per command name used since the start
    memory = client.info("memory")
    keys: dict[str, dict[str, Any]] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        if kind == "none":
            continue  # expired or deleted since the scan saw it
        name = key.decode(errors="backslashreplace") if isinstance(key, bytes) else str(key)
        keys[name] = {"type": kind, "size": key_size(client, key, kind)}
        tasks = held_tasks(client, key, kind)
        if tasks is not None:
            keys[name]["tasks"] = tasks
    return {
        "used_memory": int(memory["used_memory"]),
        "used_memory_dataset": int(memory.get("used_memory_dataset", 0)),
        "dbsize": int(client.dbsize()),
        "latency_histograms": histograms,
        "memory": {name: value for name, value in memory.items() if name in MEMORY_FIELDS},
        "keys": keys,
    }


def histogram_bytes(client: redis.Redis) -> int:
    """What one command's latency histogram costs (Redis 7 makes one the first time a command name is used,
    ``latency-tracking yes``, and INFO counts it in the dataset): the dataset before and after a first ECHO."""
    if any(name.endswith("echo") for name in client.info("latencystats")):
        return 0  # already used: cannot tell
    before = int(client.info("memory")["used_memory_dataset"])
    client.echo("calibrating")
    return max(0, int(client.info("memory")["used_memory_dataset"]) - before)


def dataset_change(start: dict[str, Any], end: dict[str, Any], per_histogram: int) -> dict[str, int]:
    """The dataset's change, and how much of it is new latency histograms; the rest is what the keys hold.
    (The script cache is counted in the overhead, not in the dataset.)"""
    change = end["used_memory_dataset"] - start["used_memory_dataset"]
    histograms = (end["latency_histograms"] - start["latency_histograms"]) * per_histogram
    return {"change": change, "latency_histograms": histograms, "rest": change - histograms}


def pattern(key: str) -> str:
    return _ID.sub("*", key)


def documented(key: str, info: dict[str, Any]) -> str | None:
    if info.get("tasks") == [TICK_TASK]:
        return "beat's tick, waiting in its queue or being run by a worker at that moment"
    return next((why for rule, why in DOCUMENTED.items() if re.fullmatch(rule, key)), None)


def compare(start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """Keys after the drain that were not there at the start: documented ones, and leaks."""
    new = sorted(set(end["keys"]) - set(start["keys"]))
    why = {key: documented(key, end["keys"][key]) for key in new}
    leaked = [{"key": key, **end["keys"][key]} for key in new if why[key] is None]
    known = [{"key": key, **end["keys"][key], "why": why[key]} for key in new if why[key] is not None]
    grown = [
        {"key": key, "type": info["type"], "start": start["keys"][key]["size"], "end": info["size"]}
        for key, info in end["keys"].items()
        if key in start["keys"] and info["size"] != start["keys"][key]["size"]
    ]
    return {
        "new_keys_documented": known,
        "leaked_keys": leaked,
        "changed_size": grown,
        "gone_keys": sorted(set(start["keys"]) - set(end["keys"])),
        "dbsize": [start["dbsize"], end["dbsize"]],
        "used_memory": [start["used_memory"], end["used_memory"]],
        "used_memory_dataset": [start["used_memory_dataset"], end["used_memory_dataset"]],
        "dataset_change": dataset_change(start, end, int(start.get("histogram_bytes", 0))),
    }


def this_process() -> tuple[str, int]:
    return "runner", os.getpid()
