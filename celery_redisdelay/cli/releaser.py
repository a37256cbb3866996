"""``celery -A proj redisdelay releaser``: a process that releases each call the moment it is due
(:class:`celery_redisdelay.release.precise.PreciseReleasers`); beat's tick stays the backstop.
"""

from __future__ import annotations

import os

import click

from ..release.precise import PreciseReleasers
from .output import extension, on_stop_signals, say


@click.command()
@click.option(
    "--longest-sleep", type=click.FloatRange(0.01, 60), default=1.0, show_default=True, help="Seconds between looks."
)
@click.option(
    "--shard",
    "shards",
    type=click.IntRange(min=0),
    multiple=True,
    help="Release only this shard (0 to redisdelay_shards - 1); repeat for more. Default: every shard.",
)
@click.pass_context
def releaser(ctx: click.Context, longest_sleep: float, shards: tuple[int, ...]) -> None:
    """Release each call the moment it is due (runs until SIGTERM or Ctrl-C; the beat tick stays the backstop).

    On a sharded store, releasers that each own their shards (--shard) do not compete for any.
    """
    rd = extension(ctx)
    running = PreciseReleasers(rd.releasers, longest_sleep=longest_sleep, shards=shards or None)

    on_stop_signals(running.stop)
    say(f"redisdelay releaser: releasing calls of {rd.app.main} as they fall due (pid {os.getpid()})")
    running.run()
    say(f"redisdelay releaser: stopped after releasing {running.released} calls")


COMMANDS = (releaser,)
