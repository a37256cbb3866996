"""``celery -A proj redisdelay ...``: the command line, registered under the ``celery.commands`` entry point.

The commands print aligned plain-text tables, or JSON with ``--json``; the work is done by
:mod:`celery_redisdelay.operations.admin`, which scripts can call too. Errors of the store (an unreachable Redis
among them) end a command with a one-line message and exit status 1, not a traceback.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import click
from celery.bin.base import handle_preload_options

from .. import monitoring
from ..errors import RedisDelayError
from ..operations import admin, metrics
from ..operations.history import KEPT_MINUTES, read_history
from ..operations.humanize import deliveries, lock_text, relative, size_text, span
from ..operations.listing import LISTS, iso
from ..operations.queues import LAG_MINUTES, QueueFigures, queue_figures
from ..operations.validation import run_validation
from ..operations.waiting import adopt_waiting
from ..release.precise import PreciseReleasers
from . import actions, drain, pausing, probe
from .history import print_history
from .limits import limits
from .output import FORCE_OPTION, JSON_OPTION, emit, extension, on_stop_signals, pairs, say, table


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


for _command in actions.COMMANDS:
    redisdelay.add_command(_command)
for _command in pausing.COMMANDS:
    redisdelay.add_command(_command)
for _command in probe.COMMANDS:
    redisdelay.add_command(_command)
for _command in drain.COMMANDS:
    redisdelay.add_command(_command)
redisdelay.add_command(limits)


@redisdelay.command()
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


@redisdelay.command()
@click.option("--port", type=click.IntRange(1, 65535), default=9808, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True, help="Where to listen (0.0.0.0: every interface).")
@click.pass_context
def exporter(ctx: click.Context, port: int, address: str) -> None:
    """Serve Prometheus metrics at http://ADDRESS:PORT/metrics until SIGTERM or Ctrl-C (the prometheus extra)."""
    rd = extension(ctx)
    try:
        server = metrics.serve(rd.depot, port, address)
    except (RuntimeError, OSError) as exc:
        raise click.ClickException(f"cannot serve metrics on {address}:{port}: {exc}") from exc
    stopping = threading.Event()
    on_stop_signals(stopping.set)
    say(f"redisdelay exporter: metrics of {rd.app.main} at http://{address}:{port}/metrics (pid {os.getpid()})")
    stopping.wait()
    server.shutdown()
    server.server_close()
    say("redisdelay exporter: stopped")


@redisdelay.command(name="monitoring")
@click.argument("what", type=click.Choice(sorted(monitoring.FILES)))
def monitoring_files(what: str) -> None:
    """Print the Grafana dashboard (grafana) or the Prometheus alert rules (alerts) for the exporter's metrics."""
    click.echo(monitoring.read(what), nl=False)


@redisdelay.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Where to listen (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=5556, show_default=True)
@click.option("--read-only", is_flag=True, help="Show everything, change nothing: no action buttons, POSTs refused.")
@click.option("--auth", envvar="REDISDELAY_WEB_AUTH", help="user:password for HTTP basic auth on every page.")
@click.option(
    "--secret",
    envvar="REDISDELAY_WEB_SECRET",
    help="Signs CSRF tokens (default: random per process; share one across processes).",
)
@click.option("--threads", type=click.IntRange(1, 64), default=4, show_default=True)
@click.pass_context
def web(
    ctx: click.Context, host: str, port: int, read_only: bool, auth: str | None, secret: str | None, threads: int
) -> None:
    """Serve the dashboard at http://HOST:PORT/ until SIGTERM or Ctrl-C (the web extra)."""
    rd = extension(ctx)
    try:
        from ..web import create_app, serve
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs the web extra: pip install 'celery-redisdelay[web]' ({exc})"
        ) from exc
    try:
        app = create_app(rd, read_only=read_only, auth=auth, secret=secret)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--auth") from exc
    if host not in ("127.0.0.1", "localhost", "::1") and auth is None:
        click.echo(
            f"redisdelay web: WARNING: listening on {host} without --auth: anyone who reaches it can act", err=True
        )
    serve(app, host, port, threads, say=say)


@redisdelay.command()
@click.option("--history", "with_history", is_flag=True, help="Add what happened over the last hour and day.")
@click.option(
    "--minutes",
    type=click.IntRange(1, KEPT_MINUTES),
    default=15,
    show_default=True,
    help="With --history: the last minutes shown one by one (--json: the minutes given).",
)
@JSON_OPTION
@click.pass_context
def status(ctx: click.Context, with_history: bool, minutes: int, as_json: bool) -> None:
    """Calls per state, the release and sweep backlogs, dead letters, and memory, over all shards; with
    --history, what happened per minute too."""
    rd = extension(ctx)
    depot = rd.depot
    found = admin.status(depot)
    paused = rd.paused()
    latency = queue_figures(depot)
    if as_json:
        found = {
            **found,
            "paused": [pausing.json_entry(entry) for entry in paused],
            "queues": {name: figures.as_dict() for name, figures in latency.items()},
        }
        emit({**found, "history": read_history(depot, minutes).as_dict()} if with_history else found, True)
        return
    retired = found["retired_shards"]
    rows = [
        ("shards", f"{found['shards']:,}" + (f" (and {retired:,} retired, still read)" if retired else "")),
        ("delayed", f"{found['delayed']:,}"),
        ("  due now", f"{found['due']:,}"),
        ("  held by limits", f"{found['limited']:,}"),
        ("  held by pauses", f"{found['paused_calls']:,}"),
        ("  oldest overdue", _late(found["oldest_overdue"], "due", "late")),
        ("in flight", f"{found['inflight']:,}"),
        ("  past deadline", f"{found['inflight_expired']:,}"),
        ("  oldest expired", _late(found["oldest_expired"], "deadline", "past")),
        ("dead", f"{found['dead']:,}"),
        ("batch groups", f"{found['batch_groups']:,} open"),
        ("  items waiting", f"{found['batch_items']:,}"),
        ("locks waited on", f"{found['locks_with_waiters']:,}"),
        ("memory", _memory(found["memory_bytes_estimate"])),
        ("releasing", _releasing(found["releasing"])),
        ("workers", f"{len(found['workers']):,} holding calls under leases"),
    ]
    rows += [
        (f"  {worker}", f"{row['leases']:,} calls, renewed {span(row['renewed_seconds_ago'])} ago")
        for worker, row in found["workers"].items()
    ]
    rows.append(("paused", pausing.status_line(paused)))
    rows.append(("limits", f"{len(found['limits']):,} (celery -A proj redisdelay limits)"))
    rows += [
        (
            f"  {row['name']}",
            f"{row['effective'] or 'none'}: {row['waiting']:,} waiting, {row['in_flight']:,} in flight",
        )
        for row in found["limits"]
    ]
    pairs(rows)
    say()
    _queue_table(latency)
    if with_history:
        print_history(rd, minutes)


def _queue_table(latency: dict[str, QueueFigures]) -> None:
    """Per queue: ready in the broker and the oldest's age, in flight, paused, held by limits; the release lag."""
    estimated = any(figures.estimated for figures in latency.values())
    table(
        ["queue", "ready", "oldest ready", "in flight", "paused", "held by limits"],
        [
            [
                name,
                "?" if figures.ready is None else f"{figures.ready:,}",
                _oldest_ready(figures),
                f"{'~' if estimated else ''}{figures.in_flight:,}",
                f"{'~' if estimated else ''}{figures.paused:,}",
                f"{'~' if estimated else ''}{figures.held:,}",
            ]
            for name, figures in latency.items()
        ],
        right=(1, 2, 3, 4, 5),
    )
    lag = next(iter(latency.values()), QueueFigures())
    if lag.release_lag_p50_seconds is not None and lag.release_lag_p99_seconds is not None:
        say(
            f"release lag (all queues, last {LAG_MINUTES} min): p50 {span(lag.release_lag_p50_seconds)}, "
            f"p99 {span(lag.release_lag_p99_seconds)}"
        )
    if estimated:
        say("~: estimated from the first calls of each shard (celery_redisdelay.operations.queues.MOST_READ)")


def _oldest_ready(figures: QueueFigures) -> str:
    if figures.ready == 0:
        return "-"
    return "?" if figures.oldest_ready_seconds is None else span(figures.oldest_ready_seconds)


def _late(oldest: dict[str, Any] | None, what: str, late: str) -> str:
    if oldest is None:
        return "-"
    return f"{oldest['id']} ({oldest['task'] or '?'}), {what} {oldest['time']}, {span(oldest['late_seconds'])} {late}"


def _releasing(releasing: dict[str, Any]) -> str:
    ago = releasing["last_seconds_ago"]
    last = "never" if ago is None else f"{span(ago)} ago"
    if releasing["problem"]:
        return f"NOTHING RELEASES: no worker releases (redisdelay_precise_release False), last release {last}"
    who = "every worker" if releasing["workers"] else "beat or a releaser"
    return f"{who}, last release {last}"


def _memory(size: int | None) -> str:
    if size is None:
        return "unknown (the server refused MEMORY USAGE)"
    return f"{size_text(size)} (estimate: MEMORY USAGE of the fixed keys of each shard)"


@redisdelay.command(name="list")
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
def list_calls(  # noqa: C901, PLR0913 - known: to be split
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
    if state == "inflight":
        headers.append("WORKER")
        for row, call in zip(rows, calls, strict=True):
            row.append(call["worker"] or "-")
    if state == "dead":
        headers.append("REASON")
        for row, call in zip(rows, calls, strict=True):
            row.append(call["why"] or "")
    if state == "paused":
        headers.append("PAUSED BY")
        for row, call in zip(rows, calls, strict=True):
            row.append(_target(call["paused_on"]))
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


def _target(paused_on: str | None) -> str:
    """A pause's target as ``paused`` and ``status`` name it: ``task billing.charge``, ``queue emails``."""
    return "?" if not paused_on else paused_on.replace(":", " ", 1)


@redisdelay.command()
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


@redisdelay.command()
@click.argument("task_id", required=False)
@click.option("--all-dead", is_flag=True, help="Requeue every dead-lettered call, oldest first.")
@JSON_OPTION
@click.pass_context
def requeue(ctx: click.Context, task_id: str | None, all_dead: bool, as_json: bool) -> None:
    """Give a dead-lettered call (or, with --all-dead, all of them) a fresh start, due now."""
    if (task_id is None) == (not all_dead):
        raise click.UsageError("give either TASK_ID or --all-dead")
    rd = extension(ctx)
    if task_id is not None:
        if not rd.requeue(task_id):
            raise click.ClickException(f"{task_id} is not in the dead-letter set")
        emit({"requeued": task_id} if as_json else f"requeued {task_id}", as_json)
        return
    report = admin.requeue_all_dead(rd.depot)
    if as_json:
        emit(report.as_dict(), True)
        return
    rows = [
        ("requeued", f"{report.requeued:,}"),
        ("left dead (no payload)", f"{report.without_payload:,}"),
    ]
    rows.extend(("", call_id) for call_id in report.without_payload_ids)
    if report.without_payload > len(report.without_payload_ids):
        rows.append(("", f"... and {report.without_payload - len(report.without_payload_ids):,} more"))
    pairs(rows)


@redisdelay.command()
@FORCE_OPTION
@JSON_OPTION
@click.pass_context
def purge(ctx: click.Context, force: bool, as_json: bool) -> None:
    """Delete the dead-lettered calls for good, with their payloads and metadata (calls dead-lettered
    while this runs are kept)."""
    rd = extension(ctx)
    now = admin.server_ms(rd.depot)
    if not force:
        count = admin.dead_count(rd.depot, before_ms=now)
        if count == 0:
            emit({"purged": 0} if as_json else "no dead-lettered calls", as_json)
            return
        click.confirm(f"delete {count:,} dead-lettered calls for good?", abort=True, err=True)
    purged = admin.purge_dead(rd.depot, before_ms=now)
    emit({"purged": purged} if as_json else f"purged {purged:,} dead-lettered calls", as_json)


@redisdelay.command()
@click.option("--dry-run", is_flag=True, help="Count the eta messages that would be moved; move none.")
@click.option(
    "--budget", type=click.FloatRange(1), default=600.0, show_default=True, help="Stop after this many seconds."
)
@JSON_OPTION
@click.pass_context
def adopt(ctx: click.Context, dry_run: bool, budget: float, as_json: bool) -> None:
    """Move the task messages with an eta that wait in the broker's queues into the store (a Redis broker).

    Each message of one of the app's tasks whose calls may be parked (delayed tasks; every task with
    redisdelay_all_tasks or redisdelay_park_received) is parked as its call, due at its eta, and taken out of
    its queue. Run it once the workers run with the extension.
    """
    rd = extension(ctx)
    report = adopt_waiting(rd.depot, rd.rules_of, dry_run=dry_run, budget=budget)
    if as_json:
        emit({**report.as_dict(), "dry_run": dry_run}, True)
        return
    moved = "would move" if dry_run else "moved"
    rows = [("messages read", f"{report.examined:,}"), (f"eta messages {moved}", f"{report.adopted:,}")]
    if not dry_run:
        rows += [("already parked", f"{report.known:,}"), ("taken by a worker meanwhile", f"{report.gone:,}")]
    if report.failed:
        rows.append(("unreadable (left in place)", f"{report.failed:,}"))
    if not report.finished:
        rows.append(("stopped", f"after {budget:g} s; run it again for the rest"))
    pairs(rows)


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
