"""``celery -A proj redisdelay ...``: the command line, registered under the ``celery.commands`` entry point.

This module is the ``redisdelay`` group; each command lives in the module of its concern (``status``, ``calls``,
``actions``, ``dead``, ``pausing``, ``limits``, ...), which lists it in its ``COMMANDS``, and is added here.
The commands print aligned plain-text tables, or JSON with ``--json``; the work is done by
:mod:`celery_redisdelay.operations.admin`, which scripts can call too. Errors of the store (an unreachable Redis
among them) end a command with a one-line message and exit status 1, not a traceback.
"""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import handle_preload_options

from ..errors import RedisDelayError
from . import (
    actions,
    adoption,
    calls,
    dashboard,
    dead,
    drain,
    exporter,
    limits,
    pausing,
    probe,
    releaser,
    status,
    validation,
)


class RedisDelayGroup(click.Group):
    """The command group; turns the errors of celery-redisdelay into clean command-line errors."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RedisDelayError as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=RedisDelayGroup)
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]  # Celery is untyped
def redisdelay(ctx: click.Context, **preload: Any) -> None:
    """Delayed calls kept in Redis by celery-redisdelay."""
    # The app's own preload options (``app.user_options['preload']``) are added to this group by
    # Celery; handle_preload_options hands them to the app's user_preload_options receivers.


#: The modules of the commands, in the order their commands are added (``--help`` sorts them by name).
MODULES = (
    actions,
    pausing,
    probe,
    drain,
    limits,
    releaser,
    exporter,
    dashboard,
    status,
    calls,
    dead,
    adoption,
    validation,
)

for _module in MODULES:
    for _command in _module.COMMANDS:
        redisdelay.add_command(_command)
