"""Start-up checks: what in the store's Redis or the settings can lose parked calls or deliver them twice.

Workers and beat log each problem as a WARNING when they start (``RedisDelay._warn_about_server``);
``depot.check_server()`` and ``depot.check_config()`` return the same texts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..broker_redis import is_redis_transport
from ..producer.task import DelayedTask

if TYPE_CHECKING:
    from ..store.depot import Depot


def server_problems(depot: Depot) -> list[str]:
    """Problems of the store's Redis that can lose parked calls; logged loudly when workers and beat start."""
    problems = [] if depot.settings.workers_release else list(filter(None, [releasing(depot)["problem"]]))
    policy = depot.eviction_policy()
    if policy is None:
        return problems  # CONFIG may be disabled (managed Redis): nothing to say of its eviction
    if policy.startswith("allkeys-"):
        problems.append(
            f"Redis at {depot.settings.url} has maxmemory-policy {policy}: when it fills up it evicts keys, "
            "and parked calls with them, silently. Set maxmemory-policy noeviction for the store"
        )
    elif policy.startswith("volatile-"):
        problems.append(
            f"Redis at {depot.settings.url} has maxmemory-policy {policy}: when it fills up it may evict locks "
            "(they expire, so they are candidates); use noeviction to keep lock deferral exclusive"
        )
    return problems


#: A releaser that has not run for this many tick intervals is taken for none at all (beat's tick runs every one).
QUIET_TICKS = 5


def release_problems(depot: Depot, now: float, last_release: float | None) -> list[str]:
    """Nothing releases: the workers do not (``redisdelay_precise_release = False``) and no releaser has run for
    :data:`QUIET_TICKS` tick intervals (``last_release``: when one last ran, s, the shard released longest ago; None:
    never). Parked calls, the calls due now that had to be parked, and the calls of a dead worker would wait."""
    settings = depot.settings
    quiet = QUIET_TICKS * settings.tick_interval
    if settings.workers_release or (last_release is not None and now - last_release <= quiet):
        return []
    since = "ever" if last_release is None else f"for {now - last_release:.0f} s"
    return [
        f"nothing releases: redisdelay_precise_release is False and no releaser has run {since}. Parked calls, calls "
        "due now that had to be parked and the calls of a worker that died wait until beat (celery -A proj beat) or "
        "a releaser (celery -A proj redisdelay releaser) runs; or remove the setting, and each worker releases"
    ]


def releasing(depot: Depot) -> dict[str, Any]:
    """Who releases and sweeps: ``workers`` (each worker does, ``redisdelay_precise_release`` not False), when a
    releaser last ran (``last_seconds_ago``, the shard released longest ago; None: one never was), and the
    ``problem`` :func:`release_problems` finds (None: none)."""
    now, oldest = 0.0, None
    for index, store in enumerate(depot.shards.all()):
        now, released = store.last_release()
        oldest = released if index == 0 or oldest is None or released is None else min(oldest, released)
    problems = release_problems(depot, now, oldest)
    return {
        "workers": depot.settings.workers_release,
        "last_seconds_ago": None if oldest is None else max(0.0, now - oldest),
        "problem": problems[0] if problems else None,
    }


def config_problems(depot: Depot) -> list[str]:
    """Settings that make the broker deliver calls we track a second time; logged loudly at start-up.

    kombu's Redis transport delivers a message again when it stays unacknowledged longer than the
    broker's ``visibility_timeout`` (one hour by default): a run longer than that under
    ``acks_late``, or a message waiting in a worker's prefetch buffer that long.
    """
    problems = limit_problems(depot)
    with depot.app.connection_for_read() as connection:  # as kombu reaches the broker; nothing connects yet
        if not is_redis_transport(connection):
            return problems
        options = connection.transport_options or {}
    broker_timeout = float(options.get("visibility_timeout", 3600))
    runs = {
        task.name: task.visibility_timeout or depot.settings.visibility_timeout
        for task in depot.app.tasks.values()
        if isinstance(task, DelayedTask) and task.acks_late
    }
    too_long = sorted(name for name, run in runs.items() if run > broker_timeout)
    if too_long:
        longest = max(runs[name] for name in too_long)
        names = ", ".join(too_long)
        problems.append(
            f"tasks with acks_late ({names}) may run up to {longest:.0f} s (their visibility timeout), longer "
            f"than the broker's visibility_timeout of {broker_timeout:.0f} s: the broker would deliver a running "
            "call again. Raise broker_transport_options['visibility_timeout'] above the longest run"
        )
    if depot.settings.queue_timeout < broker_timeout:
        problems.append(
            f"redisdelay_queue_timeout ({depot.settings.queue_timeout:.0f} s) is shorter than the broker's "
            f"visibility_timeout ({broker_timeout:.0f} s): a released call a worker prefetched can be delivered "
            "by the sweep and again by the broker. Leave redisdelay_queue_timeout unset (twice the broker's)"
        )
    return problems


def limit_problems(depot: Depot) -> list[str]:
    """Rate limits faster than one call per tick without the precise releaser: a gate lets a call out only when
    a releaser looks, so the tick releaser runs such a task at one call per tick, below its limit."""
    if depot.settings.workers_release:
        return []
    tick_ms = depot.settings.tick_interval * 1000
    fast = sorted(
        task.name
        for task in depot.app.tasks.values()
        if isinstance(task, DelayedTask)
        and task.task_limits is not None
        and any(per / calls < tick_ms for calls, per in task.task_limits.own.rates)
    )
    fast += sorted(
        f"quota {name}"
        for name, limit in depot.quotas.items()
        if any(per / calls < tick_ms for calls, per in limit.rates)
    )
    if not fast:
        return []
    return [
        f"{', '.join(fast)}: a rate limit faster than one call per tick ({depot.settings.tick_interval:g} s), and "
        "redisdelay_precise_release is False: the tick releaser lets out one call of each key per tick, below the "
        "limit. Remove the setting (each worker then releases as calls fall due)"
    ]
