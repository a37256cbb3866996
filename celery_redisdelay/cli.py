"""``celery -A proj redisdelay ...``: the command line, registered under the ``celery.commands`` entry point."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import click

from .extension import RedisDelay
from .precise import PreciseReleaser
from .store import STATES
from .validation import run_validation


def _extension(ctx: click.Context) -> RedisDelay:
    app = ctx.obj.app
    app.loader.import_default_modules()
    return RedisDelay.of(app)


def _emit(data: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    elif isinstance(data, dict):
        width = max((len(str(key)) for key in data), default=0)
        for key, value in data.items():
            click.echo(f"{key:<{width}}  {value}")
    else:
        click.echo(data)


@click.group()
def redisdelay() -> None:
    """Delayed calls kept in Redis by celery-redisdelay."""


@redisdelay.command()
@click.option(
    "--longest-sleep", type=click.FloatRange(0.01, 60), default=1.0, show_default=True, help="Seconds between looks."
)
@click.pass_context
def releaser(ctx: click.Context, longest_sleep: float) -> None:
    """Release each call the moment it is due (runs until SIGTERM or Ctrl-C; the beat tick stays the backstop)."""
    rd = _extension(ctx)
    running = PreciseReleaser(rd, longest_sleep=longest_sleep)

    def stop(signum: int, frame: Any) -> None:
        running.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    click.echo(f"redisdelay releaser: releasing calls of {rd.app.main} as they fall due (pid {os.getpid()})")
    running.run()
    click.echo(f"redisdelay releaser: stopped after releasing {running.released} calls")


@redisdelay.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Counts of calls per state."""
    _emit(_extension(ctx).stats(), as_json)


@redisdelay.command(name="list")
@click.option("--state", type=click.Choice(STATES), default="delayed", show_default=True)
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def list_calls(ctx: click.Context, state: str, limit: int, as_json: bool) -> None:
    """The first calls of one state, oldest first (score: due time, deadline or burial, in ms)."""
    entries = _extension(ctx).store.entries(state, limit)
    rows = [{"id": e.id, "score_ms": int(e.score_ms), **e.meta} for e in entries]
    if as_json:
        _emit(rows, True)
        return
    for row in rows:
        why = f"  {row['why']}" if "why" in row else ""
        click.echo(f"{row['id']}  {row['score_ms']}  {row.get('t', '?')}  deliveries={row.get('d', 0)}{why}")


@redisdelay.command()
@click.argument("task_id")
@click.pass_context
def cancel(ctx: click.Context, task_id: str) -> None:
    """Drop a call that is still parked."""
    if not _extension(ctx).cancel(task_id):
        raise click.ClickException(f"{task_id} is not parked (released, finished, dead or unknown)")
    click.echo(f"cancelled {task_id}")


@redisdelay.command()
@click.argument("task_id")
@click.pass_context
def requeue(ctx: click.Context, task_id: str) -> None:
    """Give a dead-lettered call a fresh start."""
    if not _extension(ctx).requeue(task_id):
        raise click.ClickException(f"{task_id} is not in the dead-letter set")
    click.echo(f"requeued {task_id}")


@redisdelay.command()
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
    rd = _extension(ctx)
    with click.progressbar(length=count, label="processed", file=sys.stderr) as bar:
        seen = [0]

        def progress(done: int, total: int) -> None:
            bar.update(done - seen[0])
            seen[0] = done

        report = run_validation(rd, count, fail_every=fail_every, timeout=timeout, deadline=deadline, progress=progress)
    _emit(report.as_dict(), as_json)
    if not report.ok:
        ctx.exit(1)
