"""Whether anything is left that could deliver a call, and the drain that waits until nothing is.

A run is *settled* when nothing can deliver a call any more: the store holds no call parked or in flight and
no open batch group, the broker's queue is empty and no worker holds a message of it unacknowledged. A drain
ends when every call expected ran and the run is settled (complete), or when it has stayed settled for a
while with calls still not run (they never will: missing, or dead-lettered), or at its deadline.

The validation's runner asks the same while its validation runs (:class:`Settling`, from its progress
callback) and ends it early once settled for a while; its soak and the battle drain with :func:`drain`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: kombu's Redis transport: the messages workers hold, not yet acknowledged (message id -> the message).
KOMBU_UNACKED = "unacked"
COMPLETE, SETTLED, DEADLINE = "complete", "settled", "deadline"


def store_idle(rd: Any) -> bool:
    """Nothing parked (due or not, held by a limit or a pause: what ``rd.stats()`` counts as delayed) or in
    flight in the store, on any shard, and no batch group open; one round trip. Raises while Redis is away."""
    pipe = rd.client.pipeline(transaction=False)
    for store in rd.shards.all():
        keys = store.keys
        for key in (keys.delayed, keys.gated, keys.paused, keys.inflight, keys.batches):
            pipe.zcard(key)
    return not any(pipe.execute())


def redis_broker_idle(client: Any, queue: str, *, but: bytes | None = None) -> bool:
    """No message in ``queue`` on a Redis broker, and none held unacknowledged by a worker, but those that
    contain ``but`` (the battle's tick, which beat sends for ever). Raises while Redis is away."""
    if client.llen(queue):
        return False
    return all(but is not None and but in value for value in client.hvals(KOMBU_UNACKED))


class Settling:
    """How long a run has stayed settled: :meth:`see` each look, true once settled for ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.since: float | None = None

    def see(self, settled: bool, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        self.since = (self.since or now) if settled else None
        return self.since is not None and now - self.since >= self.seconds


@dataclass(frozen=True)
class Level:
    """One look during a drain: calls done and expected, and whether the run is settled."""

    done: int
    expected: int
    settled: bool


@dataclass(frozen=True)
class Drained:
    """How a drain ended (:data:`COMPLETE`, :data:`SETTLED` or :data:`DEADLINE`), and its last look."""

    how: str
    last: Level


def drain(
    look: Callable[[], Level],
    *,
    deadline: float,
    settle: float,
    pause: float,
    every: float,
    progress: Callable[[Level], None],
) -> Drained:
    """Look every ``pause`` seconds until every call expected is done and the run is settled, or it has stayed
    settled for ``settle`` seconds, or ``deadline`` seconds have passed; ``progress(level)`` every ``every``."""
    ends = time.monotonic() + deadline
    settling = Settling(settle)
    last_said = time.monotonic()
    level = Level(0, 0, settled=False)
    while time.monotonic() < ends:
        level = look()
        if level.done >= level.expected and level.settled:
            return Drained(COMPLETE, level)
        now = time.monotonic()
        if settling.see(level.settled, now):
            return Drained(SETTLED, level)
        if now - last_said >= every:
            last_said = now
            progress(level)
        time.sleep(pause)
    return Drained(DEADLINE, level)
