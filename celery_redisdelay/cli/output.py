"""What every command of ``celery -A proj redisdelay`` shares: finding the extension, and printing
aligned tables, label/value pairs or JSON."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Sequence
from typing import Any

import click

from ..extension import RedisDelay

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
#: As Celery's ``purge -f``: act without asking (``--yes`` is the same).
FORCE_OPTION = click.option("-f", "--force", "--yes", "force", is_flag=True, help="Do not ask for confirmation.")


def extension(ctx: click.Context) -> RedisDelay:
    """The app's RedisDelay, after importing the app's task modules (so their names are known)."""
    app = ctx.obj.app
    app.loader.import_default_modules()
    return RedisDelay.of(app)


def say(message: Any = "") -> None:
    """Print a line of a command's output, unless Celery's global ``--quiet`` asked for none (as Celery's
    own commands do: ``celery -A proj -q redisdelay purge -f`` purges and prints nothing). Errors go to
    stderr through click whatever ``--quiet`` says."""
    context = click.get_current_context(silent=True)
    celery = context.find_root().obj if context is not None else None
    if not getattr(celery, "quiet", False):
        click.echo(message)


def emit(data: Any, as_json: bool) -> None:
    if as_json:
        say(json.dumps(data, indent=2, default=str))
    elif isinstance(data, dict):
        pairs([(str(key), str(value)) for key, value in data.items()])
    else:
        say(data)


def pairs(rows: Sequence[tuple[str, str]]) -> None:
    """Print labels and values, the values aligned."""
    width = max((len(label) for label, _ in rows), default=0)
    for label, value in rows:
        say(f"{label:<{width}}  {value}".rstrip())


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> None:
    """Print rows under headers in aligned columns; the columns numbered in ``right`` aligned right."""
    widths = [max(len(row[column]) for row in [headers, *rows]) for column in range(len(headers))]
    for row in [headers, *rows]:
        cells = [
            cell.rjust(width) if column in right else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        say("  ".join(cells).rstrip())


def on_stop_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM and Ctrl-C (for the commands that run until stopped)."""

    def handler(signum: int, frame: Any) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
