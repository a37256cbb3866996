"""``celery -A proj redisdelay drain``: the way out, every call waiting in the store handed back to Celery."""

from __future__ import annotations

import click

from ..operations.drain import drain as drain_store
from ..operations.drain import waiting
from .output import FORCE_OPTION, JSON_OPTION, emit, extension, say, table


@click.command()
@click.option("--dry-run", is_flag=True, help="Count what would be handed back and left; move nothing.")
@FORCE_OPTION
@JSON_OPTION
@click.pass_context
def drain(ctx: click.Context, dry_run: bool, force: bool, as_json: bool) -> None:
    """Hand every call waiting in the store (parked, held by limits, paused) back to Celery: each goes to the
    broker as Celery's own message, with its id, its options and an eta of its due time, for workers with or
    without the extension. What Celery has no form for (a call behind a busy lock, an open batch group) stays,
    listed. Run it with no worker of the extension's releasing (docs: Upgrading, rolling back, removing)."""
    rd = extension(ctx)
    if dry_run:
        emit(waiting(rd.depot), as_json)
        return
    if not force:
        click.confirm(
            "Hand every call waiting in the store back to Celery's own path (they leave the store)?", abort=True
        )
    report = drain_store(rd.app, rd.depot, rd.celery_send_task)
    if as_json:
        emit(report.as_dict(), True)
        return
    say(f"handed back to Celery: {len(report.handed):,} calls")
    if report.kept:
        say(f"left in the store: {len(report.kept):,} calls")
        table(("id", "state", "task", "why"), [(k.id, k.state, k.task, k.reason) for k in report.kept])
    if report.open_batches:
        say(
            f"left in the store: {report.open_batches:,} batch groups gathering {report.batch_items:,} items "
            "(Celery has no batching): let them flush, then drain again"
        )
    if report.in_flight:
        say(f"in flight (in the broker or running already; not moved): {report.in_flight:,}")
    if report.dead:
        say(f"dead letters (not moved: requeue or purge them): {report.dead:,}")


COMMANDS = [drain]
