"""Names of the Redis keys, built in one place.

All keys of one call store share one hash tag (``{prefix}``, or ``{prefix:N}`` for the shards of
``redisdelay_shards``), so every script runs on one Redis Cluster slot: the twenty fixed keys, the
per-name keys of batch groups and locks, and the cancel scripts' memory of cancels. Validation runs use
their own hash tag, one per run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import ConfigurationError
from .layout import STORE_KEYS


@dataclass(frozen=True)
class Keyspace:
    """The keys of one call store: ``prefix`` names the deployment, ``tag`` (the prefix by default)
    the store's hash tag."""

    prefix: str
    tag: str = ""

    def __post_init__(self) -> None:
        if not self.prefix or any(c in self.prefix for c in "{}"):
            raise ConfigurationError(
                f"redisdelay_key_prefix {self.prefix!r} must be a non-empty string without braces; "
                "the braces of the key names are added by celery-redisdelay as a hash tag"
            )
        if not self.tag:
            object.__setattr__(self, "tag", self.prefix)

    def _key(self, name: str) -> str:
        return f"{{{self.tag}}}:{name}"

    @property
    def delayed(self) -> str:
        return self._key("delayed")

    @property
    def inflight(self) -> str:
        return self._key("inflight")

    @property
    def dead(self) -> str:
        return self._key("dead")

    @property
    def payloads(self) -> str:
        return self._key("payloads")

    @property
    def meta(self) -> str:
        return self._key("meta")

    @property
    def index(self) -> str:
        return self._key("index")

    @property
    def batches(self) -> str:
        return self._key("batches")

    @property
    def counters(self) -> str:
        return self._key("counters")

    @property
    def wake(self) -> str:
        return self._key("wake")

    @property
    def history(self) -> str:
        """Per-minute counts of the last day (see ``operations/history.py``)."""
        return self._key("history")

    @property
    def workers(self) -> str:
        """The workers holding leases on calls of this store: how many each holds, when it last renewed."""
        return self._key("workers")

    @property
    def limits(self) -> str:
        """The limits calls are under, as the code declares them and as an operator set them."""
        return self._key("limits")

    @property
    def gates(self) -> str:
        """The gates with calls waiting on their limits, by when each may next let one go."""
        return self._key("gates")

    @property
    def gated(self) -> str:
        """The due calls waiting in their gates, in due order (a lex-ordered zset)."""
        return self._key("gated")

    @property
    def slots(self) -> str:
        """The calls in flight holding a concurrency slot of a limit, as earlier releases kept them (a
        lex-ordered zset): counted while any is left, and moved into :attr:`held` and :attr:`holders` by the
        sweep."""
        return self._key("slots")

    @property
    def held(self) -> str:
        """How many concurrency slots calls in flight hold: of each limit instance, and of each limit (field
        ``NUL <limit>``)."""
        return self._key("held")

    @property
    def holders(self) -> str:
        """The calls in flight holding concurrency slots: id -> the limit instances, one per line."""
        return self._key("holders")

    @property
    def paces(self) -> str:
        """Each rate limit's next theoretical arrival time (GCRA)."""
        return self._key("paces")

    @property
    def waits(self) -> str:
        """The gates waiting for a slot of a limit (a lex-ordered zset)."""
        return self._key("waits")

    @property
    def pauses(self) -> str:
        """The paused tasks and queues: target (``task:<name>`` or ``queue:<name>``) -> its record (JSON)."""
        return self._key("pauses")

    @property
    def paused(self) -> str:
        """The calls waiting on a pause (a lex-ordered zset: target NUL due NUL id), in due order per target."""
        return self._key("paused")

    @property
    def drained(self) -> str:
        """The calls ``drain`` handed back to Celery lately, by when: ``cancel.lua``'s memory, kept apart from the
        cancels' (``operations/drain.py``)."""
        return self._key("drained")

    @property
    def undrained(self) -> str:
        """The calls ``drain`` took from the store and has not yet seen the broker take: id -> payload. A drain that
        died between the two leaves them here, and the next one hands them out first."""
        return self._key("undrained")

    @property
    def cancelled(self) -> str:
        """The calls cancelled here lately, by when (see ``cancel.lua``): a cancel sent again is answered as the
        first was. It expires with its last cancel's memory."""
        return self._key("cancelled")

    @property
    def unrecorded(self) -> str:
        """The cancelled calls whose caller has not yet recorded them revoked: id -> payload, so that a cancel
        sent again after a lost reply can record them."""
        return self._key("unrecorded")

    def probe(self, worker: str) -> str:
        """One worker's heartbeat for ``celery -A proj redisdelay probe``: a small JSON record its main process
        writes each second with an expiry (``worker/probe.py``, which defines its fields; ``operations/probe.py`` reads
        it). How long ago it was written is what the expiry has counted down, by the Redis server's clock. In the
        first shard only."""
        return self._key(f"probe:{worker}")

    @property
    def store_keys(self) -> list[str]:
        """The keys every store script receives, in the order the scripts expect (:data:`.layout.STORE_KEYS`)."""
        return [self._key(key.name) for key in STORE_KEYS]

    def batch_items(self, group: str) -> str:
        """The list of items waiting in one batch group (see :func:`group_id`)."""
        return self._key(f"batch:{group}")

    def batch_adds(self, group: str) -> str:
        """The ids of one batch group's recent adds, so that the same add sent again adds nothing."""
        return self._key(f"batch-adds:{group}")

    def lock(self, name: str) -> str:
        return self._key(f"lock:{name}")

    def lock_waiters(self, name: str) -> str:
        """The calls deferred because the lock was busy, by the time they first found it busy."""
        return self._key(f"lock-waiters:{name}")

    def lock_wake(self, name: str) -> str:
        """A one-item list pushed on release, which blocking waiters outside tasks wait on."""
        return self._key(f"lock-wake:{name}")

    @property
    def shard_registry(self) -> str:
        """A set of the hash tags of every shard ever configured: releasers drain retired ones too."""
        return f"{{{self.prefix}}}:shards"

    def validation_keys(self, run_id: str) -> list[str]:
        """The keys of one validation run: processed counts per message, and run counters."""
        tag = f"{{{self.prefix}:validate:{run_id}}}"
        return [f"{tag}:processed", f"{tag}:counters"]


def group_id(task: str, key: str) -> str:
    """The name of a task's batch group or unique key: a JSON array, unambiguous whatever ``key`` holds."""
    return json.dumps([task, key], separators=(",", ":"))
