"""``celery -A proj redisdelay status``: the whole store at a glance (calls per state, backlogs, workers, pauses,
limits, memory), the queues' table under it, and with ``--history`` what happened per minute
(:mod:`celery_redisdelay.cli.history`)."""

from __future__ import annotations

from typing import Any

import click

from ..operations import admin
from ..operations.history import KEPT_MINUTES, read_history
from ..operations.humanize import size_text, span
from ..operations.queues import LAG_MINUTES, QueueFigures, queue_figures
from . import pausing
from .history import print_history
from .output import JSON_OPTION, emit, extension, pairs, say, table


@click.command()
@click.option("--history", "with_history", is_flag=True, help="Add what happened over the last hour and day.")
@click.option(
    "--minutes",
    type=click.IntRange(1, KEPT_MINUTES),
    default=15,
    show_default=True,
    help="With --history: the last minutes shown one by one (--json: the minutes given).",
)
@JSON_OPTION
@click.pass_context
def status(ctx: click.Context, with_history: bool, minutes: int, as_json: bool) -> None:
    """Calls per state, the release and sweep backlogs, dead letters, and memory, over all shards; with
    --history, what happened per minute too."""
    rd = extension(ctx)
    depot = rd.depot
    found = admin.status(depot)
    paused = rd.paused()
    latency = queue_figures(depot)
    if as_json:
        found = {
            **found,
            "paused": [pausing.json_entry(entry) for entry in paused],
            "queues": {name: figures.as_dict() for name, figures in latency.items()},
        }
        emit({**found, "history": read_history(depot, minutes).as_dict()} if with_history else found, True)
        return
    retired = found["retired_shards"]
    rows = [
        ("shards", f"{found['shards']:,}" + (f" (and {retired:,} retired, still read)" if retired else "")),
        ("delayed", f"{found['delayed']:,}"),
        ("  due now", f"{found['due']:,}"),
        ("  held by limits", f"{found['limited']:,}"),
        ("  held by pauses", f"{found['paused_calls']:,}"),
        ("  oldest overdue", _late(found["oldest_overdue"], "due", "late")),
        ("in flight", f"{found['inflight']:,}"),
        ("  past deadline", f"{found['inflight_expired']:,}"),
        ("  oldest expired", _late(found["oldest_expired"], "deadline", "past")),
        ("dead", f"{found['dead']:,}"),
        ("batch groups", f"{found['batch_groups']:,} open"),
        ("  items waiting", f"{found['batch_items']:,}"),
        ("locks waited on", f"{found['locks_with_waiters']:,}"),
        ("memory", _memory(found["memory_bytes_estimate"])),
        ("releasing", _releasing(found["releasing"])),
        ("workers", f"{len(found['workers']):,} holding calls under leases"),
    ]
    rows += [
        (f"  {worker}", f"{row['leases']:,} calls, renewed {span(row['renewed_seconds_ago'])} ago")
        for worker, row in found["workers"].items()
    ]
    rows.append(("paused", pausing.status_line(paused)))
    rows.append(("limits", f"{len(found['limits']):,} (celery -A proj redisdelay limits)"))
    rows += [
        (
            f"  {row['name']}",
            f"{row['effective'] or 'none'}: {row['waiting']:,} waiting, {row['in_flight']:,} in flight",
        )
        for row in found["limits"]
    ]
    pairs(rows)
    say()
    _queue_table(latency)
    if with_history:
        print_history(rd, minutes)


def _queue_table(latency: dict[str, QueueFigures]) -> None:
    """Per queue: ready in the broker and the oldest's age, in flight, paused, held by limits; the release lag."""
    estimated = any(figures.estimated for figures in latency.values())
    table(
        ["queue", "ready", "oldest ready", "in flight", "paused", "held by limits"],
        [
            [
                name,
                "?" if figures.ready is None else f"{figures.ready:,}",
                _oldest_ready(figures),
                f"{'~' if estimated else ''}{figures.in_flight:,}",
                f"{'~' if estimated else ''}{figures.paused:,}",
                f"{'~' if estimated else ''}{figures.held:,}",
            ]
            for name, figures in latency.items()
        ],
        right=(1, 2, 3, 4, 5),
    )
    lag = next(iter(latency.values()), QueueFigures())
    if lag.release_lag_p50_seconds is not None and lag.release_lag_p99_seconds is not None:
        say(
            f"release lag (all queues, last {LAG_MINUTES} min): p50 {span(lag.release_lag_p50_seconds)}, "
            f"p99 {span(lag.release_lag_p99_seconds)}"
        )
    if estimated:
        say("~: estimated from the first calls of each shard (celery_redisdelay.operations.queues.MOST_READ)")


def _oldest_ready(figures: QueueFigures) -> str:
    if figures.ready == 0:
        return "-"
    return "?" if figures.oldest_ready_seconds is None else span(figures.oldest_ready_seconds)


def _late(oldest: dict[str, Any] | None, what: str, late: str) -> str:
    if oldest is None:
        return "-"
    return f"{oldest['id']} ({oldest['task'] or '?'}), {what} {oldest['time']}, {span(oldest['late_seconds'])} {late}"


def _releasing(releasing: dict[str, Any]) -> str:
    ago = releasing["last_seconds_ago"]
    last = "never" if ago is None else f"{span(ago)} ago"
    if releasing["problem"]:
        return f"NOTHING RELEASES: no worker releases (redisdelay_precise_release False), last release {last}"
    who = "every worker" if releasing["workers"] else "beat or a releaser"
    return f"{who}, last release {last}"


def _memory(size: int | None) -> str:
    if size is None:
        return "unknown (the server refused MEMORY USAGE)"
    return f"{size_text(size)} (estimate: MEMORY USAGE of the fixed keys of each shard)"


COMMANDS = (status,)
