"""Names of the Redis keys, built in one place.

All keys of the call store share one hash tag (``{prefix}``), so every script runs on one
Redis Cluster slot. Validation runs use their own hash tag, one per run.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigurationError


@dataclass(frozen=True)
class Keyspace:
    """The keys of one call store."""

    prefix: str

    def __post_init__(self) -> None:
        if not self.prefix or any(c in self.prefix for c in "{}"):
            raise ConfigurationError(
                f"redisdelay_key_prefix {self.prefix!r} must be a non-empty string without braces; "
                "the braces of the key names are added by celery-redisdelay as a hash tag"
            )

    def _key(self, name: str) -> str:
        return f"{{{self.prefix}}}:{name}"

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
    def store_keys(self) -> list[str]:
        """The five keys every store script receives, in the order the scripts expect."""
        return [self.delayed, self.inflight, self.dead, self.payloads, self.meta]

    def validation_keys(self, run_id: str) -> list[str]:
        """The keys of one validation run: processed counts per message, and run counters."""
        tag = f"{{{self.prefix}:validate:{run_id}}}"
        return [f"{tag}:processed", f"{tag}:counters"]
