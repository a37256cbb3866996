"""``celery -A proj redisdelay list | show``: reading the calls in the store, a page of one state or one call
with all that is known of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..operations import admin
from ..operations.humanize import deliveries, lock_text, relative, span
from ..operations.listing import LISTS, iso
from .output import JSON_OPTION, emit, extension, pairs, say, table


@click.command(name="list")
@click.option("--state", type=click.Choice(LISTS), default="delayed", show_default=True)
@click.option("--task", help="Only calls of this task (name as registered).")
@click.option("--queue", help="Only calls routed to this queue.")
@click.option("--search", help="Only calls whose args or kwargs (as JSON) contain this text, in any case.")
@click.option("--newest", is_flag=True, help="Newest first (the cursor then counts from the newest).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True, help="Calls per page.")
@click.option("--cursor", help="Where the page starts: the cursor the previous page printed.")
@click.option(
    "--scan",
    type=click.IntRange(1),
    default=10_000,
    show_default=True,
    help="With a filter, read at most this many entries for one page.",
)
@JSON_OPTION
@click.pass_context
def list_calls(  # noqa: PLR0913 - click passes each option of the command
    ctx: click.Context,
    state: str,
    task: str | None,
    queue: str | None,
    search: str | None,
    newest: bool,
    limit: int,
    cursor: str | None,
    scan: int,
    as_json: bool,
) -> None:
    """A page of calls in one state, oldest first (due time, deadline or burial), over all shards.

    The calls waiting on a pause are listed with --state paused (by pause, then due time), those held by their
    limits with --state limited (by limit key, then due time); both are delayed calls still."""
    depot = extension(ctx).depot
    found = admin.page(
        depot,
        state,
        limit=limit,
        cursor=cursor,
        task=task,
        queue=queue,
        search=search,
        newest_first=newest,
        scan=scan,
    )
    if as_json:
        emit(found.as_dict(), True)
        return
    calls = [admin.entry_dict(entry, found.now_ms) for entry in found.calls]
    headers, rows = _rows(state, calls)
    if rows:
        table(headers, rows, right=(4,))
    else:
        matching = admin.Filter(task, queue, search)
        say(
            f"no {state} calls"
            + (f" matching {matching.describe()}" if matching.active else "")
            + (" from this cursor" if cursor else "")
        )
    if found.scan_stopped:
        say(f"stopped after reading {found.scanned:,} entries (--scan) with {len(calls)} matching")
    if found.next_cursor is not None:
        say(f"next page: --cursor {found.next_cursor}")
    if state == "delayed" and not cursor and (aside := admin.list_size(depot, "paused")):
        unfiltered = " (of any task or queue)" if admin.Filter(task, queue, search).active else ""
        say(f"{aside:,} calls wait on pauses{unfiltered}, not in this list: see --state paused")


#: The column a state's listing adds: its header, and its cell of a call.
_EXTRA_COLUMNS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "inflight": ("WORKER", lambda call: call["worker"] or "-"),
    "dead": ("REASON", lambda call: call["why"] or ""),
    "paused": ("PAUSED BY", lambda call: _target(call["paused_on"])),
}


def _rows(state: str, calls: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The table of a page of calls of ``state``: its headers and rows."""
    headers = ["ID", "TASK", admin.SCORE_MEANING[state].upper(), "WHEN", "DELIVERIES", "PHASE"]
    rows = [
        [
            call["id"],
            call["task"] or "?",
            call["time"],
            relative(call["seconds_from_now"]),
            deliveries(call["deliveries"], call["max_deliveries"]),
            call["phase"] or "?",
        ]
        for call in calls
    ]
    extra = _EXTRA_COLUMNS.get(state)
    if extra is not None:
        header, cell = extra
        headers.append(header)
        for row, call in zip(rows, calls, strict=True):
            row.append(cell(call))
    return headers, rows


def _target(paused_on: str | None) -> str:
    """A pause's target as ``paused`` and ``status`` name it: ``task billing.charge``, ``queue emails``."""
    return "?" if not paused_on else paused_on.replace(":", " ", 1)


@click.command()
@click.argument("task_id")
@JSON_OPTION
@click.pass_context
def show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """One call: where it is, its metadata and its arguments."""
    found = admin.describe(extension(ctx).depot, task_id)
    if found is None:
        raise click.ClickException(f"no call {task_id} in the store (never parked, finished, cancelled or purged)")
    if as_json:
        emit(found, True)
        return
    rows = [
        ("id", found["id"]),
        ("task", found["task"] or "?"),
        ("state", found["state"]),
        (found["score_meaning"], f"{found['time']} ({relative(found['seconds_from_now'])})"),
        ("phase", found["phase"] or "?"),
        ("deliveries", deliveries(found["deliveries"], found["max_deliveries"], " of ", " (no limit)")),
        ("run timeout", _millis(found["run_timeout_ms"])),
        ("queue timeout", _millis(found["queue_timeout_ms"])),
        ("queue", found["queue"] or "?"),
    ]
    if found["worker"] is not None:
        rows.append(("held by", f"{found['worker']} (under a lease it renews)"))
    if found["run_ends_ms"] is not None:
        rows.append(("run ends by", f"{iso(found['run_ends_ms'])} (the task's own timeout)"))
    if found["deferrals"]:
        rows.append(("lock deferrals", str(found["deferrals"])))
    if found["key"] is not None:
        rows.append(("unique/debounce key", str(found["key"])))
    if found["why"] is not None:
        rows.append(("dead because", str(found["why"])))
    if found["paused_on"] is not None:
        rows.append(("paused by", f"{_target(found['paused_on'])} (waits in the store until it is resumed)"))
    if found["lock"] is not None:
        rows.append(("lock", lock_text(found["lock"])))
    rows.extend(_payload_rows(found["payload"]))
    rows.append(("history", "no event log is kept per call; the deliveries, phase and reason above are what is known"))
    pairs(rows)


def _millis(ms: Any) -> str:
    return "?" if ms is None else span(ms / 1000)


def _payload_rows(payload: dict[str, Any] | None) -> list[tuple[str, str]]:
    if payload is None:
        return [("payload", "none stored (a requeue cannot run it)")]
    rows = [("payload", f"{payload['format'] or 'unreadable'}, {payload['bytes']:,} bytes")]
    if payload["format"] == "batch":
        rows.append(("batch", f"key {payload['batch_key']!r}, {payload['items']} items"))
    elif payload["format"] is not None:
        rows.append(("route", f"exchange {payload['exchange']!r}, routing key {payload['routing_key']!r}"))
        rows.append(("content", f"{payload['content_type']} ({payload['content_encoding']})"))
        rows.extend((f"header {name}", str(value)) for name, value in payload["headers"].items())
    if payload["decoded"]:
        rows.append(("args", _shorten(repr(payload["args"]))))
        rows.append(("kwargs", _shorten(repr(payload["kwargs"]))))
    if payload["note"]:
        rows.append(("arguments", payload["note"]))
    return rows


def _shorten(text: str, most: int = 2000) -> str:
    return text if len(text) <= most else f"{text[:most]}... ({len(text):,} characters; --json shows all)"


COMMANDS = (list_calls, show)
