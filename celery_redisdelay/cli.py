"""``celery -A proj redisdelay ...``: the command line, registered under the ``celery.commands`` entry point.

The commands print aligned plain-text tables, or JSON with ``--json``; the work is done by
:mod:`celery_redisdelay.admin`, which scripts can call too. Errors of the store (an unreachable Redis
among them) end a command with a one-line message and exit status 1, not a traceback.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import click

from . import admin, metrics
from .errors import RedisDelayError
from .extension import RedisDelay
from .precise import PreciseReleasers
from .store import STATES
from .validation import run_validation

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


class RedisDelayGroup(click.Group):
    """The command group; turns the errors of celery-redisdelay into clean command-line errors."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RedisDelayError as exc:
            raise click.ClickException(str(exc)) from exc


def _extension(ctx: click.Context) -> RedisDelay:
    app = ctx.obj.app
    app.loader.import_default_modules()
    return RedisDelay.of(app)


def _emit(data: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    elif isinstance(data, dict):
        _pairs([(str(key), str(value)) for key, value in data.items()])
    else:
        click.echo(data)


def _pairs(rows: Sequence[tuple[str, str]]) -> None:
    """Print labels and values, the values aligned."""
    width = max((len(label) for label, _ in rows), default=0)
    for label, value in rows:
        click.echo(f"{label:<{width}}  {value}".rstrip())


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> None:
    """Print rows under headers in aligned columns; the columns numbered in ``right`` aligned right."""
    widths = [max(len(row[column]) for row in [headers, *rows]) for column in range(len(headers))]
    for row in [headers, *rows]:
        cells = [
            cell.rjust(width) if column in right else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        click.echo("  ".join(cells).rstrip())


def _span(seconds: float) -> str:
    """A duration in its two largest units: ``250ms``, ``42s``, ``5m 3s``, ``2h 5m``, ``3d 4h``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    whole = int(seconds)
    for unit, size, smaller, smaller_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if whole >= size:
            rest = whole % size // smaller_size
            return f"{whole // size}{unit}" + (f" {rest}{smaller}" if rest else "")
    return f"{whole}s"


def _relative(seconds: float) -> str:
    """Seconds from now (negative: past) as ``in 5m`` or ``3s ago``."""
    if abs(seconds) < 0.0005:
        return "now"
    return f"in {_span(seconds)}" if seconds > 0 else f"{_span(-seconds)} ago"


def _bytes(size: int) -> str:
    if size < 1024:
        return f"{size:,} B"
    scaled = float(size)
    for unit in ("KiB", "MiB", "GiB"):
        scaled /= 1024
        if scaled < 1024 or unit == "GiB":
            break
    return f"{scaled:,.1f} {unit}"


def _on_stop_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM and Ctrl-C (for the commands that run until stopped)."""

    def handler(signum: int, frame: Any) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


@click.group(cls=RedisDelayGroup)
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
    running = PreciseReleasers(rd, longest_sleep=longest_sleep)

    _on_stop_signals(running.stop)
    click.echo(f"redisdelay releaser: releasing calls of {rd.app.main} as they fall due (pid {os.getpid()})")
    running.run()
    click.echo(f"redisdelay releaser: stopped after releasing {running.released} calls")


@redisdelay.command()
@click.option("--port", type=click.IntRange(1, 65535), default=9808, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True, help="Where to listen (0.0.0.0: every interface).")
@click.pass_context
def exporter(ctx: click.Context, port: int, address: str) -> None:
    """Serve Prometheus metrics at http://ADDRESS:PORT/metrics until SIGTERM or Ctrl-C (the prometheus extra)."""
    rd = _extension(ctx)
    try:
        server = metrics.serve(rd, port, address)
    except (RuntimeError, OSError) as exc:
        raise click.ClickException(f"cannot serve metrics on {address}:{port}: {exc}") from exc
    stopping = threading.Event()
    _on_stop_signals(stopping.set)
    click.echo(f"redisdelay exporter: metrics of {rd.app.main} at http://{address}:{port}/metrics (pid {os.getpid()})")
    stopping.wait()
    server.shutdown()
    server.server_close()
    click.echo("redisdelay exporter: stopped")


@redisdelay.command()
@JSON_OPTION
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Calls per state, the release and sweep backlogs, dead letters, and memory, over all shards."""
    found = admin.status(_extension(ctx))
    if as_json:
        _emit(found, True)
        return
    retired = found["retired_shards"]
    rows = [
        ("shards", f"{found['shards']:,}" + (f" (and {retired:,} retired, still read)" if retired else "")),
        ("delayed", f"{found['delayed']:,}"),
        ("  due now", f"{found['due']:,}"),
        ("  oldest overdue", _late(found["oldest_overdue"], "due", "late")),
        ("in flight", f"{found['inflight']:,}"),
        ("  past deadline", f"{found['inflight_expired']:,}"),
        ("  oldest expired", _late(found["oldest_expired"], "deadline", "past")),
        ("dead", f"{found['dead']:,}"),
        ("batch groups", f"{found['batch_groups']:,} open"),
        ("  items waiting", f"{found['batch_items']:,}"),
        ("memory", _memory(found["memory_bytes_estimate"])),
    ]
    _pairs(rows)


def _late(oldest: dict[str, Any] | None, what: str, late: str) -> str:
    if oldest is None:
        return "-"
    return f"{oldest['id']} ({oldest['task'] or '?'}), {what} {oldest['time']}, {_span(oldest['late_seconds'])} {late}"


def _memory(size: int | None) -> str:
    if size is None:
        return "unknown (the server refused MEMORY USAGE)"
    return f"{_bytes(size)} (estimate: MEMORY USAGE of the nine fixed keys of each shard)"


@redisdelay.command(hidden=True)
@JSON_OPTION
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """The old name of ``status``."""
    ctx.invoke(status, as_json=as_json)


@redisdelay.command(name="list")
@click.option("--state", type=click.Choice(STATES), default="delayed", show_default=True)
@click.option("--task", help="Only calls of this task (name as registered).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True, help="Calls per page.")
@click.option("--cursor", help="Where the page starts: the cursor the previous page printed.")
@click.option(
    "--scan",
    type=click.IntRange(1),
    default=10_000,
    show_default=True,
    help="With --task, read at most this many entries for one page.",
)
@JSON_OPTION
@click.pass_context
def list_calls(
    ctx: click.Context, state: str, task: str | None, limit: int, cursor: str | None, scan: int, as_json: bool
) -> None:
    """A page of calls in one state, oldest first (due time, deadline or burial), over all shards."""
    found = admin.page(_extension(ctx), state, limit=limit, cursor=cursor, task=task, scan=scan)
    if as_json:
        _emit(found.as_dict(), True)
        return
    calls = [admin.entry_dict(entry, found.now_ms) for entry in found.calls]
    headers = ["ID", "TASK", admin.SCORE_MEANING[state].upper(), "WHEN", "DELIVERIES", "PHASE"]
    rows = [
        [
            call["id"],
            call["task"] or "?",
            call["time"],
            _relative(call["seconds_from_now"]),
            _deliveries(call["deliveries"], call["max_deliveries"]),
            call["phase"] or "?",
        ]
        for call in calls
    ]
    if state == "dead":
        headers.append("REASON")
        for row, call in zip(rows, calls, strict=True):
            row.append(call["why"] or "")
    if rows:
        _table(headers, rows, right=(4,))
    else:
        click.echo(f"no {state} calls" + (f" of {task}" if task else "") + (" from this cursor" if cursor else ""))
    if found.scan_stopped:
        click.echo(f"stopped after reading {found.scanned:,} entries (--scan) with {len(calls)} of {task}")
    if found.next_cursor is not None:
        click.echo(f"next page: --cursor {found.next_cursor}")


def _deliveries(done: Any, limit: Any, of: str = "/", unlimited: str = "") -> str:
    """Deliveries so far and the most allowed (0 or missing: no limit)."""
    return f"{done}{of}{limit}" if limit else f"{done}{unlimited}"


@redisdelay.command()
@click.argument("task_id")
@JSON_OPTION
@click.pass_context
def show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """One call: where it is, its metadata and its arguments."""
    found = admin.describe(_extension(ctx), task_id)
    if found is None:
        raise click.ClickException(f"no call {task_id} in the store (never parked, finished, cancelled or purged)")
    if as_json:
        _emit(found, True)
        return
    rows = [
        ("id", found["id"]),
        ("task", found["task"] or "?"),
        ("state", found["state"]),
        (found["score_meaning"], f"{found['time']} ({_relative(found['seconds_from_now'])})"),
        ("phase", found["phase"] or "?"),
        ("deliveries", _deliveries(found["deliveries"], found["max_deliveries"], " of ", " (no limit)")),
        ("run timeout", _millis(found["run_timeout_ms"])),
        ("queue timeout", _millis(found["queue_timeout_ms"])),
    ]
    if found["deferrals"]:
        rows.append(("lock deferrals", str(found["deferrals"])))
    if found["key"] is not None:
        rows.append(("unique/debounce key", str(found["key"])))
    if found["why"] is not None:
        rows.append(("dead because", str(found["why"])))
    rows.extend(_payload_rows(found["payload"]))
    rows.append(("history", "no event log is kept per call; the deliveries, phase and reason above are what is known"))
    _pairs(rows)


def _millis(ms: Any) -> str:
    return "?" if ms is None else _span(ms / 1000)


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


@redisdelay.command()
@click.argument("task_id")
@JSON_OPTION
@click.pass_context
def cancel(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Drop a call that is still parked."""
    if not _extension(ctx).cancel(task_id):
        raise click.ClickException(f"{task_id} is not parked (released, finished, dead or unknown)")
    _emit({"cancelled": task_id} if as_json else f"cancelled {task_id}", as_json)


@redisdelay.command()
@click.argument("task_id", required=False)
@click.option("--all-dead", is_flag=True, help="Requeue every dead-lettered call, oldest first.")
@JSON_OPTION
@click.pass_context
def requeue(ctx: click.Context, task_id: str | None, all_dead: bool, as_json: bool) -> None:
    """Give a dead-lettered call (or, with --all-dead, all of them) a fresh start, due now."""
    if (task_id is None) == (not all_dead):
        raise click.UsageError("give either TASK_ID or --all-dead")
    rd = _extension(ctx)
    if task_id is not None:
        if not rd.requeue(task_id):
            raise click.ClickException(f"{task_id} is not in the dead-letter set")
        _emit({"requeued": task_id} if as_json else f"requeued {task_id}", as_json)
        return
    report = admin.requeue_all_dead(rd)
    if as_json:
        _emit(report.as_dict(), True)
        return
    rows = [
        ("requeued", f"{report.requeued:,}"),
        ("left dead (no payload)", f"{report.without_payload:,}"),
    ]
    rows.extend(("", call_id) for call_id in report.without_payload_ids)
    if report.without_payload > len(report.without_payload_ids):
        rows.append(("", f"... and {report.without_payload - len(report.without_payload_ids):,} more"))
    _pairs(rows)


@redisdelay.command()
@click.option("--state", type=click.Choice(["dead"]), required=True, help="What to purge: the dead letters.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@JSON_OPTION
@click.pass_context
def purge(ctx: click.Context, state: str, yes: bool, as_json: bool) -> None:
    """Delete dead-lettered calls for good, with their payloads and metadata (calls dead-lettered while
    this runs are kept)."""
    rd = _extension(ctx)
    now = admin.server_ms(rd)
    if not yes:
        count = admin.dead_count(rd, before_ms=now)
        if count == 0:
            _emit({"purged": 0} if as_json else "no dead-lettered calls", as_json)
            return
        click.confirm(f"delete {count:,} dead-lettered calls for good?", abort=True, err=True)
    purged = admin.purge_dead(rd, before_ms=now)
    _emit({"purged": purged} if as_json else f"purged {purged:,} dead-lettered calls", as_json)


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
