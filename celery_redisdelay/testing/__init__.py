"""Real processes for tests, the demo and the benchmarks: a redis-server, Celery workers and beat.

Everything listens on 127.0.0.1, is started in its own session and is stopped by its PID.
:mod:`.topologies` builds bigger set-ups on loopback: a Redis Cluster, Sentinel, TLS.
"""

from .processes import (
    DEBIAN_REDIS_SERVER,
    CeleryProcess,
    RedisServer,
    beat,
    free_port,
    kill_group,
    redis_server_binary,
    stop_process,
    wait_for,
    worker,
)

__all__ = [
    "DEBIAN_REDIS_SERVER",
    "CeleryProcess",
    "RedisServer",
    "beat",
    "free_port",
    "kill_group",
    "redis_server_binary",
    "stop_process",
    "wait_for",
    "worker",
]
