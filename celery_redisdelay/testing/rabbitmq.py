"""A throwaway RabbitMQ node on loopback ports of its own, for tests and benchmarks of RabbitMQ as the broker.

Debian's ``rabbitmq-server`` (``apt-get install rabbitmq-server``) is started from its own scripts under
``/usr/lib/rabbitmq/bin``, not through the package's service: with a data directory, a node name, a cookie and an
Erlang port mapper (``epmd``) of its own, each on a free loopback port, so that it neither needs nor touches a
node the machine may run. The port mapper is started in the foreground beside it (never as Erlang's own daemon),
and both are stopped by their PIDs.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Self

from .processes import free_port, stop_process, wait_for

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
EPMD = "/usr/bin/epmd"
#: What a machine without the server needs.
INSTALL_HINT = "apt-get install rabbitmq-server"


class RabbitMQUnavailable(RuntimeError):
    """This machine has no RabbitMQ server to start (the message says how to install one)."""


def available() -> bool:
    """Whether Debian's RabbitMQ server and Erlang's port mapper are on this machine."""
    return os.access(RABBITMQ_BIN / "rabbitmq-server", os.X_OK) and os.access(EPMD, os.X_OK)


class RabbitMQServer:
    """A RabbitMQ node on a free loopback port, its data in a directory of its own.

    ``config`` lines are added to its ``rabbitmq.conf`` (``consumer_timeout = 60000``), ``erl_args`` to its Erlang
    command line (settings ``rabbitmq.conf`` has no key for, ``-rabbit channel_tick_interval 1000``). ``start()``
    waits until the AMQP port answers and keeps how long it took in ``startup_seconds`` (Erlang starts slowly:
    seconds, not the milliseconds of redis-server). ``restart()`` stops the node and starts it again on the same
    ports and data: durable queues and their persistent messages survive it. ``ctl(...)`` runs ``rabbitmqctl``
    against it.
    """

    def __init__(
        self, config: list[str] | None = None, directory: str | Path | None = None, *, erl_args: str = ""
    ) -> None:
        if not available():
            raise RabbitMQUnavailable(f"no RabbitMQ server on this machine: {INSTALL_HINT}")
        self.dir = Path(directory or tempfile.mkdtemp(prefix="redisdelay-rabbitmq-"))
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.node = f"redisdelay{self.port}@localhost"
        self.config = list(config or [])
        self.erl_args = erl_args  # added to the node's Erlang arguments (application settings: -rabbit name value)
        self.log_path = self.dir / "rabbitmq.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        self.startup_seconds = 0.0

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def env(self) -> dict[str, str]:
        """The environment its scripts (the server, ``rabbitmqctl``) run with."""
        return {
            **os.environ,
            "HOME": str(self.dir),  # its Erlang cookie
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_LOGS": "-",
            # Erlang's schedulers busy-wait by default, taking cores from the tests beside the node: not here.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": f"+sbwt none +sbwtdcpu none +sbwtdio none {self.erl_args}".strip(),
        }

    def _write_config(self) -> None:
        lines = [f"listeners.tcp.1 = 127.0.0.1:{self.port}", "loopback_users = none", *self.config]
        (self.dir / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        (self.dir / "enabled_plugins").write_text("[].\n")

    def start(self, timeout: float = 90.0) -> Self:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        began = time.monotonic()
        if self.epmd is None or self.epmd.poll() is not None:
            self.epmd = subprocess.Popen(
                [EPMD, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.dir,
                start_new_session=True,
            )
        wait_for(self._answers, timeout, f"RabbitMQ on port {self.port}", interval=0.1)
        self.startup_seconds = time.monotonic() - began
        return self

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"rabbitmq-server exited: {self.log_path.read_text(errors='replace')[-3000:]}")
        if "Server startup complete" not in self.log_path.read_text(errors="replace"):
            return False
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """``rabbitmqctl args`` against this node; its output (a failure raises, with it)."""
        done = subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.node, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def queue_depth(self, connection: Any, queue: str) -> int:
        """Messages ready in ``queue`` (a passive declare on a kombu ``connection``)."""
        channel = connection.channel()
        try:
            return int(channel.queue_declare(queue=queue, passive=True).message_count)
        finally:
            channel.close()

    def terminate(self) -> None:
        """Stop the node (SIGTERM: it closes its queues' files); its data stays."""
        if self.process is not None:
            stop_process(self.process, 60)
            self.process = None
        self._truncate_log_marker()

    def _truncate_log_marker(self) -> None:
        # start() waits for the log's "startup complete" line: the next start must not read the last one's.
        if self.log_path.exists():
            self.log_path.rename(self.dir / f"rabbitmq-{time.time_ns()}.log")

    def restart(self) -> float:
        """Stop and start again on the same ports and data; seconds down."""
        began = time.monotonic()
        self.terminate()
        self.start()
        return time.monotonic() - began

    def stop(self) -> None:
        self.terminate()
        if self.epmd is not None:
            stop_process(self.epmd, 10)
            self.epmd = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
