"""The figures, in the order a full run measures them. Each takes the run's context and returns a dict
with ``rows`` (table rows, see :class:`bench.report.Row`) and ``details``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..context import Context
from .burst import burst
from .dashboard import dashboard
from .due_now import e2e_due_now, e2e_due_now_io
from .e2e import e2e_throughput
from .history import history_cost
from .lateness import lateness
from .limits import limits
from .park import park_bulk, park_single, send_due_now
from .pause_fleet import pause_fleet
from .probe_cost import probe_cost
from .rabbitmq import e2e_rabbitmq, release_rabbitmq, worker_memory_rabbitmq
from .recovery import long_run, long_run_due_now, recovery, recovery_due_now
from .redis_memory import redis_memory_per_call
from .release import release
from .release_cluster import release_cluster
from .release_limited import release_limited
from .release_paused import release_paused
from .scrape import exporter_scrape
from .worker_memory import worker_memory
from .workers_releasing import workers_releasing

Figure = Callable[[Context], dict[str, Any]]

FIGURES: dict[str, Figure] = {
    "park_single": park_single,
    "park_bulk": park_bulk,
    "send_due_now": send_due_now,
    "release": release,
    "release_limited": release_limited,
    "release_paused": release_paused,
    "history_cost": history_cost,
    "worker_memory": worker_memory,
    "lateness": lateness,
    "redis_memory_per_call": redis_memory_per_call,
    "release_cluster": release_cluster,
    "dashboard": dashboard,
    "exporter_scrape": exporter_scrape,
    "e2e_throughput": e2e_throughput,
    "e2e_due_now": e2e_due_now,
    "e2e_due_now_io": e2e_due_now_io,
    "probe_cost": probe_cost,
    "recovery": recovery,
    "long_run": long_run,
    "recovery_due_now": recovery_due_now,
    "long_run_due_now": long_run_due_now,
    "burst": burst,
    "limits": limits,
    "pause_fleet": pause_fleet,
    "workers_releasing": workers_releasing,
    "release_rabbitmq": release_rabbitmq,
    "worker_memory_rabbitmq": worker_memory_rabbitmq,
    "e2e_rabbitmq": e2e_rabbitmq,
}
