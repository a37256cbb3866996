"""Keyed batches: items gather per key in Redis and run as one call ``task(key, items)``.

``@rd.batched(size=10, max_wait=240)`` makes a :class:`BatchedTask`; ``task.add(key, item)`` appends
an item to the key's group. The add that brings a group to ``size`` items turns exactly those items
into one parked call in the same script; the tick flushes a group whose first item has waited
``max_wait`` seconds. A flushed batch is an ordinary parked call from then on (in flight, ack, sweep,
dead letter); its stored payload is a stub that the releaser turns into the task's message.
"""

from __future__ import annotations

from typing import Any, ClassVar

from celery.result import AsyncResult
from kombu.utils import json

from ..errors import ConfigurationError, PayloadError, ScheduleError
from ..store.keys import group_id
from .schedule import seconds
from .task import DelayedTask

#: The most items in one batch: one script moves a whole batch, and scripts stay bounded.
LARGEST_BATCH = 10_000


def check_batch_options(function: Any, options: dict[str, Any]) -> None:
    """Refuse, at decoration, a batch size or max wait that cannot work."""
    name = options.get("name") or getattr(function, "__name__", "?")
    size = options.get("batch_size")
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= LARGEST_BATCH:
        raise ConfigurationError(
            f"size of batched task {name} must be an integer from 1 to {LARGEST_BATCH}, not {size!r}"
        )
    try:
        seconds(options.get("batch_max_wait"), "max_wait")
    except ScheduleError as exc:
        raise ConfigurationError(f"batched task {name}: {exc}") from exc


class BatchedTask(DelayedTask):
    """A delayed task called with a key and the list of items gathered under it (``@rd.batched``)."""

    batch_size: ClassVar[int] = 10
    batch_max_wait: ClassVar[float] = 60.0

    def add(self, key: str, item: Any) -> AsyncResult | None:
        """Add ``item`` to the group of ``key``; returns at once.

        Returns the result of the batch call when this add filled the group (the call is parked, due
        now), else None. ``item`` must be JSON-serializable (Celery's json: dates, UUIDs, decimals too).
        """
        if not isinstance(key, str):
            raise ScheduleError(f"a batch key must be a string, not {key!r}")
        try:
            encoded = json.dumps(item)
        except (TypeError, ValueError) as exc:
            raise PayloadError(
                f"cannot add {item!r} to a batch of {self.name}: it is not JSON-serializable ({exc}); "
                "nothing was stored"
            ) from exc
        self.depot.check_size(f"an item of {self.name}", len(encoded.encode()))
        group = group_id(self.name, key)
        shards = self.depot.shards
        store = shards.for_name(group)
        released = store.batch_add(
            group,
            encoded,
            self.batch_size,
            round(self.batch_max_wait * 1000),
            shards.new_id(store),
            self.call_limits(),
        )[1]
        return None if released is None else self.AsyncResult(released)
