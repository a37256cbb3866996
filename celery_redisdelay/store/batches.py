"""Batches: items gathered per group (``{tag}:batch:<group>``), each group due in ``{tag}:batches`` when its first
item has waited its max wait, and flushed into one parked call."""

from __future__ import annotations

from typing import Any

from .base import StoreBase, redis_errors, server_ms, text
from .meta import CallMeta, Limits, meta_json


class Batches(StoreBase):
    """The store's methods for batch groups: add an item, find the due groups, flush one."""

    def batch_add(
        self, group: str, item: str, size: int, max_wait_ms: int, call_id: str, meta: Limits | CallMeta
    ) -> tuple[int, str | None]:
        """Add an item to a group: (items now waiting, id of the call this add released or None). ``call_id``
        is the add's own too: the same add again (its reply lost) adds nothing and answers as the first did."""
        waiting, released = self._run(
            "batch_add",
            [group, item, size, max_wait_ms, call_id, meta_json(meta)],
            f"add an item to batch group {group}",
            [self.keys.batch_items(group), self.keys.batch_adds(group)],
            replicated=True,
        )
        return int(waiting), text(released) or None

    def due_groups(self, limit: int) -> list[str]:
        """Batch groups whose first item has waited their max wait, by the Redis clock."""
        with redis_errors("list due batch groups"):
            now_ms = server_ms(self.client, self.keys.batches)
            groups: Any = self.client.zrangebyscore(self.keys.batches, "-inf", now_ms, start=0, num=limit)
        return [text(group) for group in groups]

    def batch_flush(self, group: str, size: int, call_id: str, meta: Limits | CallMeta) -> int:
        """Flush a due group into one call; how many items it took (0: not due or flushed already)."""
        return int(
            self._run(
                "batch_flush",
                [group, size, call_id, meta_json(meta)],
                f"flush batch group {group}",
                [self.keys.batch_items(group)],
            )
        )
