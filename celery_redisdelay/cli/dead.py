"""``celery -A proj redisdelay requeue | purge``: the dead letters, given a fresh start or deleted for good."""

from __future__ import annotations

import click

from ..operations import admin
from .output import FORCE_OPTION, JSON_OPTION, emit, extension, pairs


@click.command()
@click.argument("task_id", required=False)
@click.option("--all-dead", is_flag=True, help="Requeue every dead-lettered call, oldest first.")
@JSON_OPTION
@click.pass_context
def requeue(ctx: click.Context, task_id: str | None, all_dead: bool, as_json: bool) -> None:
    """Give a dead-lettered call (or, with --all-dead, all of them) a fresh start, due now."""
    if (task_id is None) == (not all_dead):
        raise click.UsageError("give either TASK_ID or --all-dead")
    rd = extension(ctx)
    if task_id is not None:
        if not rd.requeue(task_id):
            raise click.ClickException(f"{task_id} is not in the dead-letter set")
        emit({"requeued": task_id} if as_json else f"requeued {task_id}", as_json)
        return
    report = admin.requeue_all_dead(rd.depot)
    if as_json:
        emit(report.as_dict(), True)
        return
    rows = [
        ("requeued", f"{report.requeued:,}"),
        ("left dead (no payload)", f"{report.without_payload:,}"),
    ]
    rows.extend(("", call_id) for call_id in report.without_payload_ids)
    if report.without_payload > len(report.without_payload_ids):
        rows.append(("", f"... and {report.without_payload - len(report.without_payload_ids):,} more"))
    pairs(rows)


@click.command()
@FORCE_OPTION
@JSON_OPTION
@click.pass_context
def purge(ctx: click.Context, force: bool, as_json: bool) -> None:
    """Delete the dead-lettered calls for good, with their payloads and metadata (calls dead-lettered
    while this runs are kept)."""
    rd = extension(ctx)
    now = admin.server_ms(rd.depot)
    if not force:
        count = admin.dead_count(rd.depot, before_ms=now)
        if count == 0:
            emit({"purged": 0} if as_json else "no dead-lettered calls", as_json)
            return
        click.confirm(f"delete {count:,} dead-lettered calls for good?", abort=True, err=True)
    purged = admin.purge_dead(rd.depot, before_ms=now)
    emit({"purged": purged} if as_json else f"purged {purged:,} dead-lettered calls", as_json)


COMMANDS = (requeue, purge)
