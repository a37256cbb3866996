"""The run's redis-server: durable, so it can be restarted in the middle of the run and lose nothing.

With ``appendonly yes`` and ``appendfsync always`` a write acknowledged to a client is on disk before
the reply; ``restart()`` (from :class:`celery_redisdelay.testing.RedisServer`) stops it with SIGTERM
and starts it again on the same port and data directory.
"""

from __future__ import annotations

from pathlib import Path

from celery_redisdelay.testing import RedisServer

DURABLE = ("--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction")


class DurableRedis(RedisServer):
    """redis-server on 127.0.0.1 with its data in ``directory``, restartable in place."""

    def __init__(self, directory: Path | None = None, port: int | None = None) -> None:
        super().__init__(extra_args=DURABLE, port=port, directory=directory)
