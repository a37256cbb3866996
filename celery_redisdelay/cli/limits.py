"""``celery -A proj redisdelay limits``: the limits calls are under, and changing one while everything runs."""

from __future__ import annotations

import click

from ..errors import ConfigurationError
from ..operations.limits import Limit, limit_states, set_limit
from ..operations.listing import server_ms
from .output import JSON_OPTION, emit, extension, say, table


@click.group(invoke_without_command=True)
@JSON_OPTION
@click.pass_context
def limits(ctx: click.Context, as_json: bool) -> None:
    """The limits calls are under (rate and concurrency per task, per key and per quota): what each allows,
    the calls waiting on it and in flight under it. ``limits set`` and ``limits reset`` change one."""
    if ctx.invoked_subcommand is not None:
        return
    depot = extension(ctx).depot
    states = limit_states(depot)
    if as_json:
        emit([state.as_dict() for state in states.values()], True)
        return
    if not states:
        say("no limits: no call under one was parked, and none was set")
        return
    now = server_ms(depot)
    rows = []
    for state in states.values():
        found = state.as_dict()
        wait = "-" if state.next_ms is None else f"{max(state.next_ms - now, 0) / 1000:.2f} s"
        rows.append(
            [
                state.name,
                found["effective"] or "none",
                "set" if state.set is not None else "code",
                f"{state.waiting:,}",
                f"{state.gates:,}",
                f"{state.in_flight:,}",
                wait,
                f"{state.released:,}",
            ]
        )
    headers = ["limit", "allows", "from", "waiting", "keys waiting", "in flight", "next in", "let go"]
    table(headers, rows, right=(3, 4, 5, 6, 7))


@limits.command(name="set")
@click.argument("name")
@click.option("--rate", "rates", multiple=True, help="A rate, as Celery writes it: 100/m, 5/s, 10/h (repeatable).")
@click.option("--concurrency", type=int, help="Most calls in flight at once.")
@click.pass_context
def set_command(ctx: click.Context, name: str, rates: tuple[str, ...], concurrency: int | None) -> None:
    """Set limit NAME (task:<task name> or quota:<quota name>) over what the code declares, on every shard;
    the next release goes by it."""
    try:
        limit = Limit.declared(rates or None, concurrency, ("--rate", "--concurrency"))
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from exc
    if limit.empty:
        raise click.UsageError("give --rate, --concurrency or both (limits reset NAME goes back to the code's)")
    try:
        set_limit(extension(ctx).depot, name, limit)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from exc
    say(f"{name}: {limit.describe()}")


@limits.command()
@click.argument("name")
@click.pass_context
def reset(ctx: click.Context, name: str) -> None:
    """Forget what was set for limit NAME: the code's limit holds again."""
    try:
        set_limit(extension(ctx).depot, name, None)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from exc
    say(f"{name}: as the code declares it")


COMMANDS = (limits,)
