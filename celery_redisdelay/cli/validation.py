"""``celery -A proj redisdelay validate``: an end-to-end check of a running fleet
(:mod:`celery_redisdelay.operations.validation`), messages sent to a consumer that fails some, every one accounted
for."""

from __future__ import annotations

import sys

import click

from ..operations.validation import run_validation
from .output import emit, extension


@click.command()
@click.option("--count", type=click.IntRange(1), default=1000, show_default=True, help="Messages to send.")
@click.option(
    "--fail-every",
    type=click.IntRange(0),
    default=2,
    show_default=True,
    help="The consumer fails every N-th delivery without acknowledging it (0: never).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0.1),
    default=5.0,
    show_default=True,
    help="The consumer's visibility timeout, in seconds.",
)
@click.option(
    "--deadline", type=click.FloatRange(1), default=600.0, show_default=True, help="Give up after this many seconds."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def validate(ctx: click.Context, count: int, fail_every: int, timeout: float, deadline: float, as_json: bool) -> None:
    """Send COUNT messages to a consumer that fails every other one; check every one is processed.

    Needs running workers and beat (or another releaser) for the same app. Exits 1 when a message is missing.
    """
    rd = extension(ctx)
    with click.progressbar(length=count, label="processed", file=sys.stderr) as bar:
        seen = [0]

        def progress(done: int, total: int) -> None:
            bar.update(done - seen[0])
            seen[0] = done

        report = run_validation(rd, count, fail_every=fail_every, timeout=timeout, deadline=deadline, progress=progress)
    emit(report.as_dict(), as_json)
    if not report.ok:
        ctx.exit(1)


COMMANDS = (validate,)
