"""The commands that move or drop parked calls: ``cancel``, ``reschedule`` and ``run-now``, each for one
call or, with ``--all``, for every parked call matching a filter (in bounded steps, see
:mod:`celery_redisdelay.operations.actions`). Registered on the ``redisdelay`` group by :mod:`celery_redisdelay.cli`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from ..errors import ScheduleError
from ..extension import RedisDelay
from ..operations.actions import BulkReport, act_on, act_on_matching
from ..operations.listing import Filter
from ..producer.schedule import resolve_due
from .output import JSON_OPTION, emit, extension, pairs


def selection(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options shared by the commands: one TASK_ID, or --all with a filter; -f/--force; --json."""
    for option in reversed(
        [
            click.argument("task_id", required=False),
            click.option("--all", "every", is_flag=True, help="Every parked call matching --task/--queue/--search."),
            click.option("--task", help="With --all: only calls of this task (name as registered)."),
            click.option("--queue", help="With --all: only calls routed to this queue."),
            click.option("--search", help="With --all: only calls whose args or kwargs contain this text."),
            click.option(
                "-f", "--force", "--yes", "force", is_flag=True, help="With --all: do not ask for confirmation."
            ),
            JSON_OPTION,
        ]
    ):
        command = option(command)
    return command


@dataclass(frozen=True)
class Selection:
    """What a command acts on: one call, or every parked call matching a filter."""

    task_id: str | None
    matching: Filter
    force: bool
    as_json: bool

    @classmethod
    def of(cls, options: dict[str, Any]) -> Selection:
        task_id, narrowed = options["task_id"], any(options[name] for name in ("task", "queue", "search"))
        if (task_id is None) == (not options["every"]):
            raise click.UsageError("give either TASK_ID or --all (with --task, --queue or --search to narrow it)")
        if task_id is not None and narrowed:
            raise click.UsageError("--task, --queue and --search go with --all")
        found = Filter(options["task"] or None, options["queue"] or None, options["search"] or None)
        return cls(task_id, found, options["force"], options["as_json"])

    def confirm(self, rd: RedisDelay, what: str) -> None:
        if self.force:
            return
        parked = "" if self.matching.active else f" ({rd.stats()['delayed']:,} parked calls)"
        click.confirm(f"{what} every parked call matching {self.matching.describe()}{parked}?", abort=True, err=True)

    def one(self, done: bool, key: str, said: str) -> None:
        """Report on the one call acted on: ``said`` (or ``{key: id}`` as JSON), or why nothing was done."""
        if not done:
            raise click.ClickException(f"{self.task_id} is not parked (released, finished, dead or unknown)")
        emit({key: self.task_id} if self.as_json else said, self.as_json)

    def report(self, report: BulkReport, verb: str) -> None:
        if self.as_json:
            emit(report.as_dict(), True)
            return
        rows = [(verb, f"{report.done:,}"), ("entries read", f"{report.scanned:,}")]
        if report.stopped:
            rows.append(("stopped", report.stopped))
        pairs(rows)


@click.command()
@selection
@click.pass_context
def cancel(ctx: click.Context, /, **options: Any) -> None:
    """Drop a call that is still parked (or, with --all, every parked call matching a filter) and mark it
    REVOKED in the result backend."""
    chosen = Selection.of(options)
    rd = extension(ctx)
    if chosen.task_id is not None:
        chosen.one(bool(rd.cancel_many([chosen.task_id])), "cancelled", f"cancelled {chosen.task_id}")
        return
    chosen.confirm(rd, "cancel")
    chosen.report(act_on_matching(rd.depot, "cancel", chosen.matching), "cancelled")


@click.command()
@selection
@click.option("--countdown", type=click.FloatRange(0), help="The new due time, in seconds from now.")
@click.option("--eta", help="The new due time: an ISO 8601 date and time (naive: the app's timezone).")
@click.pass_context
def reschedule(ctx: click.Context, /, countdown: float | None, eta: str | None, **options: Any) -> None:
    """Move a parked call (or, with --all, every parked call matching a filter) to a new due time."""
    chosen = Selection.of(options)
    if (countdown is None) == (eta is None):
        raise click.UsageError("give either --countdown or --eta")
    rd = extension(ctx)
    try:
        due = resolve_due(countdown, eta, timezone=rd.app.conf.timezone)
    except ScheduleError as exc:
        raise click.BadParameter(str(exc)) from exc
    if chosen.task_id is not None:
        moved = rd.reschedule(chosen.task_id, countdown=countdown, eta=eta)
        chosen.one(moved, "rescheduled", f"rescheduled {chosen.task_id}")
        return
    chosen.confirm(rd, "reschedule")
    report = act_on_matching(rd.depot, "reschedule", chosen.matching, due_ms=due.at_ms, countdown_ms=due.countdown_ms)
    chosen.report(report, "rescheduled")


@click.command(name="run-now")
@selection
@click.pass_context
def run_now(ctx: click.Context, /, **options: Any) -> None:
    """Make a parked call (or, with --all, every parked call matching a filter) due now: the next tick
    releases it."""
    chosen = Selection.of(options)
    rd = extension(ctx)
    if chosen.task_id is not None:
        chosen.one(bool(act_on(rd.depot, "run-now", [chosen.task_id])[0]), "due_now", f"{chosen.task_id} is due now")
        return
    chosen.confirm(rd, "run now")
    chosen.report(act_on_matching(rd.depot, "run-now", chosen.matching), "due now")


COMMANDS = (cancel, reschedule, run_now)
