"""A durable redis-server that can be stopped and started again on the same port and data directory.

``celery_redisdelay.testing.RedisServer`` takes extra arguments and a port, but it makes a fresh
directory and deletes it on ``stop()``, and truncates its log on each start: a restart with the same
data needs a server of our own. This one runs with ``appendonly yes`` and ``appendfsync always``, so a
write acknowledged to a client is on disk before the reply, and a restart loses nothing.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redisdelay.testing import free_port, kill_group, redis_server_binary, stop_process, wait_for

START_TIMEOUT = 30.0


class DurableRedis:
    """redis-server on 127.0.0.1 with its data in a directory of its own, restartable in place."""

    def __init__(self, directory: Path | None = None, port: int | None = None) -> None:
        self.binary = redis_server_binary()
        self.port = port or free_port()
        self.dir = directory or Path(tempfile.mkdtemp(prefix="chaos-redis-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> float:
        """Start the server (loading its append-only file, if any); return the seconds until it answered."""
        started = time.monotonic()
        args = [
            self.binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--maxmemory-policy",
            "noeviction",
            "--daemonize",
            "no",
        ]
        with open(self.log_path, "ab") as log:  # the server keeps its own descriptor
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
        try:
            wait_for(lambda: self._answers(client), START_TIMEOUT, f"redis-server on port {self.port}")
        finally:
            client.close()
        return time.monotonic() - started

    def _answers(self, client: redis.Redis) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"redis-server exited: {self.log_path.read_text(errors='replace')[-2000:]}")
        try:
            return bool(client.ping())
        except redis.ConnectionError:  # also -LOADING while it reads the append-only file
            return False

    def version(self) -> str:
        client = redis.Redis(host="127.0.0.1", port=self.port)
        try:
            return str(client.info("server")["redis_version"])
        finally:
            client.close()

    def terminate(self, timeout: float = 30.0) -> None:
        """SIGTERM: the server finishes the command at hand, syncs the append-only file and exits."""
        if self.process is not None:
            stop_process(self.process, timeout, sig=signal.SIGTERM)
            self.process = None

    def restart(self) -> tuple[float, float]:
        """Stop with SIGTERM and start again on the same port and data: (seconds down, seconds to stop)."""
        began = time.monotonic()
        self.terminate()
        stopped = time.monotonic() - began
        self.start()
        return time.monotonic() - began, stopped

    def kill(self) -> None:
        if self.process is not None:
            kill_group(self.process)
            self.process.wait(10)
            self.process = None

    def remove_files(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
