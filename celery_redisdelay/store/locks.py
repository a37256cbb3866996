"""Locks: one key per lock (``{tag}:lock:<name>``, its holder's token, with a TTL), the calls deferred behind it
(``lock-waiters:<name>``) and the list its release pushes for the waiters outside tasks (``lock-wake:<name>``)."""

from __future__ import annotations

from .base import StoreBase, redis_errors


class Locks(StoreBase):
    """The store's methods for locks: take, release, extend, wait."""

    def lock_take(
        self, name: str, token: str, ttl_ms: int, call_id: str = "", retry_ms: int = 0, delivery: int = 0
    ) -> tuple[int, int]:
        """Take a lock, or defer ``call_id`` behind it: (1 taken | 2 taken over from a holder whose run is gone |
        0 busy | -1 busy and call untracked | -2 ``delivery`` (0: not known) is older than the call's current
        one, ms left)."""
        status, remaining = self._run(
            "lock_take",
            [token, ttl_ms, call_id, retry_ms, delivery],
            f"take lock {name}",
            [self.keys.lock(name), self.keys.lock_waiters(name)],
        )
        return int(status), int(remaining)

    def lock_release(self, name: str, token: str) -> bool:
        """Release a lock held by ``token`` and wake its first waiter; False when the token lost it."""
        return bool(
            self._run(
                "lock_release",
                [token],
                f"release lock {name}",
                [self.keys.lock(name), self.keys.lock_waiters(name), self.keys.lock_wake(name)],
            )
        )

    def lock_extend(self, name: str, token: str, ttl_ms: int) -> bool:
        with redis_errors(f"extend lock {name}"):
            return bool(self._scripts["lock_extend"](keys=[self.keys.lock(name)], args=[token, ttl_ms]))

    def lock_wait(self, name: str, timeout: float) -> None:
        """Block up to ``timeout`` seconds for a release of the lock (no polling)."""
        with redis_errors(f"wait for lock {name}"):
            self.client.blpop([self.keys.lock_wake(name)], timeout=timeout)
