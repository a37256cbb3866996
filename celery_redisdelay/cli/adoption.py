"""``celery -A proj redisdelay adopt``: the way in, the eta messages waiting in the broker's queues moved into the
store (:mod:`celery_redisdelay.operations.waiting`); ``drain`` is the way out."""

from __future__ import annotations

import click

from ..operations.waiting import adopt_waiting
from .output import JSON_OPTION, emit, extension, pairs


@click.command()
@click.option("--dry-run", is_flag=True, help="Count the eta messages that would be moved; move none.")
@click.option(
    "--budget", type=click.FloatRange(1), default=600.0, show_default=True, help="Stop after this many seconds."
)
@JSON_OPTION
@click.pass_context
def adopt(ctx: click.Context, dry_run: bool, budget: float, as_json: bool) -> None:
    """Move the task messages with an eta that wait in the broker's queues into the store (a Redis broker).

    Each message of one of the app's tasks whose calls may be parked (delayed tasks; every task with
    redisdelay_all_tasks or redisdelay_park_received) is parked as its call, due at its eta, and taken out of
    its queue. Run it once the workers run with the extension.
    """
    rd = extension(ctx)
    report = adopt_waiting(rd.depot, rd.rules_of, dry_run=dry_run, budget=budget)
    if as_json:
        emit({**report.as_dict(), "dry_run": dry_run}, True)
        return
    moved = "would move" if dry_run else "moved"
    rows = [("messages read", f"{report.examined:,}"), (f"eta messages {moved}", f"{report.adopted:,}")]
    if not dry_run:
        rows += [("already parked", f"{report.known:,}"), ("taken by a worker meanwhile", f"{report.gone:,}")]
    if report.failed:
        rows.append(("unreadable (left in place)", f"{report.failed:,}"))
    if not report.finished:
        rows.append(("stopped", f"after {budget:g} s; run it again for the rest"))
    pairs(rows)


COMMANDS = (adopt,)
