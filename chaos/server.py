"""A redis-server of the run: durable as a production one, restarted in the middle of the run.

``appendonly yes`` with ``appendfsync everysec`` by default, as production stores run: Redis writes
each change to its append-only file before it replies, and fsyncs the file once a second in a
background thread. ``restart()`` (from :class:`celery_redisdelay.testing.RedisServer`) stops it with
SIGTERM, which syncs the file; ``crash()`` SIGKILLs it and starts it again from whatever the file
holds, as a supervisor would after the process died.
"""

from __future__ import annotations

import time
from pathlib import Path

from celery_redisdelay.testing import RedisServer, kill_group

FSYNC_POLICIES = ("everysec", "always")


def durable_args(fsync: str = "everysec") -> list[str]:
    if fsync not in FSYNC_POLICIES:
        raise ValueError(f"appendfsync must be one of {FSYNC_POLICIES}, not {fsync!r}")
    return ["--appendonly", "yes", "--appendfsync", fsync, "--maxmemory-policy", "noeviction"]


class DurableRedis(RedisServer):
    """redis-server on 127.0.0.1 with its data in ``directory``, restartable in place."""

    def __init__(self, directory: Path | None = None, port: int | None = None, fsync: str = "everysec") -> None:
        super().__init__(extra_args=durable_args(fsync), port=port, directory=directory)
        self.fsync = fsync

    def crash(self) -> tuple[float, float]:
        """SIGKILL, then start again on the same port and data: (seconds down, seconds to load the data and
        answer)."""
        began = time.monotonic()
        if self.process is not None:
            kill_group(self.process)
            self.process.wait(10)
            self.process = None
        dead = time.monotonic()
        self.start()
        return time.monotonic() - began, time.monotonic() - dead
