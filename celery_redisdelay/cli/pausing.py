"""``celery -A proj redisdelay pause | resume | paused``: pausing a task or a queue for the whole fleet."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from ..operations.humanize import span
from ..operations.pausing import PauseError, check_target
from .output import JSON_OPTION, emit, extension, say, table

TASK_OPTION = click.option("--task", help="The task (its name as registered).")
QUEUE_OPTION = click.option("--queue", help="The queue.")


def _target(task: str | None, queue: str | None) -> None:
    try:
        check_target(task, queue)
    except PauseError as exc:
        raise click.UsageError(str(exc)) from exc


def describe(entry: dict[str, Any]) -> str:
    """A pause in one line: ``task x: paused since ... (for 5m), until ...: reason; n calls waiting``."""
    now = datetime.now(UTC)
    text = f"{entry['kind']} {entry['name']}: paused since {entry['since']:%Y-%m-%d %H:%M:%S} UTC"
    text += f" ({span(max((now - entry['since']).total_seconds(), 0))})"
    until = entry["until"]
    text += ", until resumed" if until is None else f", until {until:%Y-%m-%d %H:%M:%S} UTC"
    if entry["reason"]:
        text += f": {entry['reason']}"
    return text + f"; {entry['waiting']:,} calls waiting"


def json_entry(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        **entry,
        "since": entry["since"].isoformat(),
        "until": None if entry["until"] is None else entry["until"].isoformat(),
    }


@click.command()
@TASK_OPTION
@QUEUE_OPTION
@click.option("--for", "duration", help="End by itself after this long: 30s, 10m, 2h, 1d (default: until resumed).")
@click.option("--reason", default="", help="Why (shown by paused, status and the dashboard).")
@JSON_OPTION
@click.pass_context
def pause(
    ctx: click.Context, task: str | None, queue: str | None, duration: str | None, reason: str, as_json: bool
) -> None:
    """Pause a task (--task) or a queue (--queue) for every worker: none of its calls starts until resume (or
    --for ends). Its calls wait in the store and go out, in due order, when it ends; a call running now finishes."""
    _target(task, queue)
    try:
        entry = extension(ctx).pause(task=task, queue=queue, seconds=duration, reason=reason)
    except PauseError as exc:
        raise click.BadParameter(str(exc)) from exc
    if as_json:
        emit(json_entry(entry), True)
    else:
        say(describe(entry))


@click.command()
@TASK_OPTION
@QUEUE_OPTION
@click.pass_context
def resume(ctx: click.Context, task: str | None, queue: str | None) -> None:
    """End the pause of a task (--task) or a queue (--queue): its calls go out with the next releases, in due order.
    Resuming what is not paused says so, and is no error."""
    _target(task, queue)
    kind, name = ("task", task) if task is not None else ("queue", queue)
    if extension(ctx).resume(task=task, queue=queue):
        say(f"{kind} {name}: resumed; its calls go out with the next releases")
    else:
        say(f"{kind} {name} was not paused; nothing to do")


@click.command()
@JSON_OPTION
@click.pass_context
def paused(ctx: click.Context, as_json: bool) -> None:
    """What is paused: each task and queue, since when, until when, why, and the calls waiting on it."""
    found = extension(ctx).paused()
    if as_json:
        emit([json_entry(entry) for entry in found], True)
        return
    if not found:
        say("nothing is paused")
        return
    rows = [
        [
            entry["kind"],
            entry["name"],
            f"{entry['since']:%Y-%m-%d %H:%M:%S}",
            "until resumed" if entry["until"] is None else f"{entry['until']:%Y-%m-%d %H:%M:%S}",
            f"{entry['waiting']:,}",
            entry["reason"],
        ]
        for entry in found
    ]
    table(["kind", "name", "since (UTC)", "until (UTC)", "waiting", "reason"], rows, right=(4,))


def status_line(found: list[dict[str, Any]]) -> str:
    """The line of ``status`` that says what is paused."""
    if not found:
        return "nothing"
    return "; ".join(f"{entry['kind']} {entry['name']} ({entry['waiting']:,} waiting)" for entry in found)


COMMANDS = (pause, resume, paused)
