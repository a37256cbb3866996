"""Metrics: counts per state and running totals, read from Redis; a Prometheus exporter (an extra).

The totals are kept by the store's scripts in each shard's ``counters`` hash, in the same atomic
step as the change they count, so they are exact and shared by every process: any exporter, on any
host, reports the whole deployment. Install ``celery-redisdelay[prometheus]`` and run
``celery -A proj redisdelay exporter --port 9808``, or register :class:`RedisDelayCollector` in a
registry of your own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..store.calls import redis_errors
from ..store.census import totals
from ..store.depot import Depot, HoldsDepot, depot_of
from ..store.layout import LATENESS_BOUNDS_MS
from .admin import worker_leases
from .limits import LimitState, limit_states
from .listing import server_ms
from .pausing import paused
from .queues import QueueFigures, queue_figures

#: Running totals: counter field -> (metric name, help).
TOTALS = {
    "parked": ("parked", "Calls put in the delay set (a retry parked again counts again)."),
    "released": ("released", "Calls taken from the delay set for the broker (a failed publish gives one back)."),
    "swept": ("swept", "In-flight calls past their deadline put back for another delivery."),
    "dead_lettered": ("dead_lettered", "Calls moved to the dead-letter set."),
    "worker_lost": (
        "worker_lost",
        "Runs cut short with their worker and dead-lettered, not run again, by their task's contract "
        "(redisdelay_worker_lost; counted in dead_lettered too).",
    ),
    "acked": ("acknowledged", "Calls acknowledged by a worker (finished)."),
    "revoked": ("revoked", "Released calls a worker discarded unrun because they were revoked."),
    "expired": ("expired", "Released calls a worker discarded unrun because their expires had passed."),
    "cancelled": ("cancelled", "Parked calls dropped by cancel, or by a worker that heard their revoke."),
    "batches_flushed": ("batches_flushed", "Batch groups turned into one call."),
    "lock_deferrals": ("lock_deferrals", "Calls deferred because their lock was busy."),
    "lock_takeovers": ("lock_takeovers", "Locks taken over from a call whose run was gone (its worker died)."),
    "limited": ("held_by_limits", "Due calls their limits held back (each counted once, when it began to wait)."),
}


@dataclass
class Snapshot:
    """Counts per state (summed over shards) and running totals since the store was created."""

    states: dict[str, int]
    totals: dict[str, int]
    lateness_buckets: list[tuple[float, int]] = field(default_factory=list)  # (upper bound in s, cumulative)
    lateness_sum_seconds: float = 0.0
    last_release: float | None = None  # when a releaser last ran (s since the epoch), the oldest over the shards
    #: worker -> (calls it holds under a lease, when it last renewed them in s since the epoch)
    workers: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: every limit calls are under: what waits on it, what it holds, what it let go
    limits: dict[str, LimitState] = field(default_factory=dict)
    now: float = 0.0  # the Redis clock when the limits were read (s)
    #: what is paused (see :func:`~celery_redisdelay.operations.pausing.paused`)
    pauses: list[dict[str, Any]] = field(default_factory=list)


def snapshot(depot: Depot) -> Snapshot:
    """Read the state counts and the totals of every shard."""
    summed: dict[str, int] = {}
    releases: list[int | None] = []
    stores = depot.shards.all()
    with redis_errors("read the counters"):
        for store in stores:
            counters, released_at = totals(store.registries)
            for name, value in counters.items():
                summed[name] = summed.get(name, 0) + value
            releases.append(released_at)
    states = depot.stats()
    cumulative, buckets = 0, []
    for bound in LATENESS_BOUNDS_MS:
        cumulative += summed.get(f"late_le_{bound}", 0)
        buckets.append((bound / 1000, cumulative))
    buckets.append((float("inf"), cumulative + summed.get("late_le_inf", 0)))
    return Snapshot(
        states=states,
        totals={name: summed.get(name, 0) for name in TOTALS},
        lateness_buckets=buckets,
        lateness_sum_seconds=summed.get("late_ms_sum", 0) / 1000,
        last_release=oldest_release(releases),
        workers={worker: (row["leases"], row["renewed_ms"] / 1000) for worker, row in worker_leases(depot).items()},
        limits=limit_states(depot),
        now=server_ms(depot) / 1000,
        pauses=paused(depot),
    )


def limit_metrics(ns: str, shot: Snapshot) -> Iterator[Any]:
    """Per limit (``task:<name>`` or ``quota:<name>``): calls waiting on it, the keys they wait under, calls in
    flight under it, seconds until its next waiting call may go, and the calls it let go (a counter)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    waiting = GaugeMetricFamily(f"{ns}_limit_waiting", "Due calls waiting on a limit.", labels=["limit"])
    gates = GaugeMetricFamily(f"{ns}_limit_keys_waiting", "Keys with calls waiting on a limit.", labels=["limit"])
    in_flight = GaugeMetricFamily(f"{ns}_limit_in_flight", "Calls in flight under a limit.", labels=["limit"])
    upcoming = GaugeMetricFamily(
        f"{ns}_limit_next_seconds", "Seconds until a limit's next waiting call may go.", labels=["limit"]
    )
    released = CounterMetricFamily(f"{ns}_limit_released", "Calls a limit let go.", labels=["limit"])
    for name, state in shot.limits.items():
        waiting.add_metric([name], state.waiting)
        gates.add_metric([name], state.gates)
        in_flight.add_metric([name], state.in_flight)
        if state.next_ms is not None:
            upcoming.add_metric([name], max(state.next_ms / 1000 - shot.now, 0.0))
        released.add_metric([name], state.released)
    yield from (waiting, gates, in_flight, upcoming, released)


def pause_metrics(ns: str, shot: Snapshot) -> Iterator[Any]:
    """What is paused: how many targets, and per task or queue the calls waiting on it and when it began."""
    from prometheus_client.core import GaugeMetricFamily

    yield GaugeMetricFamily(f"{ns}_paused_targets", "Tasks and queues paused now.", value=len(shot.pauses))
    waiting = GaugeMetricFamily(
        f"{ns}_paused_calls", "Calls waiting in the store on a paused task or queue.", labels=["kind", "name"]
    )
    since = GaugeMetricFamily(
        f"{ns}_paused_since_timestamp_seconds", "When a paused task or queue was paused.", labels=["kind", "name"]
    )
    for entry in shot.pauses:
        waiting.add_metric([entry["kind"], entry["name"]], entry["waiting"])
        since.add_metric([entry["kind"], entry["name"]], entry["since"].timestamp())
    yield from (waiting, since)


def queue_metrics(ns: str, figures: dict[str, QueueFigures]) -> Iterator[Any]:
    """Per queue (:mod:`.queues`): calls ready in the broker's lists and the age of the oldest, calls in flight,
    paused and held by limits; and the release lag's p50 and p99 over the last minutes, for all queues together
    (the store counts lateness per bucket, not per queue)."""
    from prometheus_client.core import GaugeMetricFamily

    families = {
        "ready": GaugeMetricFamily(
            f"{ns}_queue_ready", "Calls ready in a queue's broker lists (priority lists included).", labels=["queue"]
        ),
        "oldest_ready_seconds": GaugeMetricFamily(
            f"{ns}_queue_oldest_ready_seconds",
            "Seconds since the oldest ready call of a queue became ready (its release, for a parked call); "
            "absent when no ready message says when.",
            labels=["queue"],
        ),
        "in_flight": GaugeMetricFamily(
            f"{ns}_queue_in_flight", "Calls released to a queue and not finished (ready or running).", labels=["queue"]
        ),
        "paused": GaugeMetricFamily(f"{ns}_queue_paused", "Calls of a queue waiting on a pause.", labels=["queue"]),
        "held": GaugeMetricFamily(f"{ns}_queue_held", "Due calls of a queue held back by limits.", labels=["queue"]),
    }
    for name, found in figures.items():
        for field_name, family in families.items():
            value = getattr(found, field_name)
            if value is not None:
                family.add_metric([name], value)
    yield from families.values()
    lag = next(iter(figures.values()), QueueFigures())  # the same for every queue
    for quantile, value in (("p50", lag.release_lag_p50_seconds), ("p99", lag.release_lag_p99_seconds)):
        if value is not None:
            yield GaugeMetricFamily(
                f"{ns}_release_lag_{quantile}_seconds",
                f"The {quantile} of release lag (release time minus due time) over the last minutes, all queues.",
                value=value,
            )


def oldest_release(releases: list[int | None]) -> float | None:
    """When every shard was last released (s): the oldest shard's time; None if one never was."""
    if not releases or None in releases:
        return None
    return min(ms for ms in releases if ms is not None) / 1000


class RedisDelayCollector:
    """A ``prometheus_client`` collector: every scrape reads Redis (a few commands per shard). ``rd`` is
    the app's extension (``RedisDelayCollector(rd)``) or its depot."""

    def __init__(self, rd: Depot | HoldsDepot, namespace: str = "redisdelay") -> None:
        self.depot = depot_of(rd)
        self.namespace = namespace

    def describe(self) -> list[Any]:
        return []  # unchecked collector: the families are built on each scrape

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        ns = self.namespace
        shot = snapshot(self.depot)
        calls = GaugeMetricFamily(f"{ns}_calls", "Calls stored, by state.", labels=["state"])
        for state in ("delayed", "inflight", "dead"):
            calls.add_metric([state], shot.states.get(state, 0))
        yield calls
        for name, help_text in (
            ("due", "Delayed calls already due (waiting for a releaser)."),
            ("inflight_expired", "In-flight calls past their deadline (waiting for a sweep)."),
            ("batch_groups", "Batch groups with items waiting."),
            ("batch_items", "Items waiting in batch groups."),
            ("limited", "Delayed calls that are due and wait on their limits."),
        ):
            yield GaugeMetricFamily(f"{ns}_{name}", help_text, value=shot.states.get(name, 0))
        if shot.last_release is not None:
            yield GaugeMetricFamily(
                f"{ns}_last_release_timestamp_seconds",
                "When a releaser last ran, by the Redis clock (with shards: the shard released longest ago).",
                value=shot.last_release,
            )
        yield GaugeMetricFamily(
            f"{ns}_tick_interval_seconds",
            "How often releasers run (redisdelay_tick_interval): alerts count missed ticks with it.",
            value=self.depot.settings.tick_interval,
        )
        leases = GaugeMetricFamily(f"{ns}_worker_leases", "Calls a worker holds under a lease.", labels=["worker"])
        renewed = GaugeMetricFamily(
            f"{ns}_worker_lease_renewed_timestamp_seconds",
            "When a worker last renewed its leases, by the Redis clock.",
            labels=["worker"],
        )
        for worker, (held, at) in shot.workers.items():
            leases.add_metric([worker], held)
            renewed.add_metric([worker], at)
        yield leases
        yield renewed
        yield from limit_metrics(ns, shot)
        yield from pause_metrics(ns, shot)
        yield from queue_metrics(ns, queue_figures(self.depot))
        for field_name, (name, help_text) in TOTALS.items():
            yield CounterMetricFamily(f"{ns}_{name}", help_text, value=shot.totals[field_name])
        yield HistogramMetricFamily(
            f"{ns}_release_lateness_seconds",
            "How long after its due time a call left the delay set.",
            buckets=[
                ("+Inf" if bound == float("inf") else str(bound), count) for bound, count in shot.lateness_buckets
            ],
            sum_value=shot.lateness_sum_seconds,
        )


def serve(depot: Depot, port: int, address: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` on ``address:port`` in a thread; returns the server (``shutdown()`` stops it)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("the exporter needs prometheus-client: pip install 'celery-redisdelay[prometheus]'") from exc
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RedisDelayCollector(depot))
    server, _thread = start_http_server(port, addr=address, registry=registry)
    return server
