"""The marks the benchmarks' tasks leave when they start, and the one reader of them.

A task that marks its start (``bench.stamp`` and the other ``record_start`` tasks of :mod:`bench.app`,
:mod:`bench.plain_app`, :mod:`bench.peer_app` and :mod:`bench.rabbit_app`; ``bench.sleeper``) does it as the first
thing it does: it RPUSHes onto a Redis list, in database 0, whose key the figure passed it, the line

    ``<call id> <ms>[ <worker>]``

``<ms>`` is the Redis server's clock (TIME) in milliseconds, the clock due times are scored by, so a start is
compared with its due time on one clock whichever process ran it. ``<worker>``, the worker's hostname
(``name@host``), is there for the tasks that record it (``bench.sleeper``). A call run twice leaves two marks; the
list keeps them in the order the starts were recorded.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import redis

from .common import server_ms


class Mark(NamedTuple):
    """One start: the call's id, the Redis time (ms) it started at, and the worker that ran it when recorded."""

    call_id: str
    ms: int
    worker: str | None = None

    @classmethod
    def parse(cls, line: str | bytes) -> Mark:
        """The mark of a line as :func:`record_mark` writes it."""
        text = line.decode() if isinstance(line, bytes) else line
        call_id, ms, *worker = text.split(" ", 2)
        return cls(call_id, int(ms), worker[0] if worker else None)

    @property
    def line(self) -> str:
        """The line this mark is recorded as."""
        return f"{self.call_id} {self.ms}" if self.worker is None else f"{self.call_id} {self.ms} {self.worker}"


def record_mark(client: redis.Redis, key: str, call_id: str, worker: str | None = None) -> None:
    """Mark a call's start under ``key`` now, by the Redis server's clock (what a marking task does first)."""
    client.rpush(key, Mark(call_id, server_ms(client), worker).line)


def read_marks(client: redis.Redis, key: str) -> list[Mark]:
    """Every start marked under ``key`` so far, in the order recorded (the list is left as it is)."""
    lines: Any = client.lrange(key, 0, -1)
    return [Mark.parse(line) for line in lines]
