"""The dashboard's actions (POST, each checked for its CSRF token and refused in read-only mode):
run now, reschedule, cancel, requeue and purge, on one call, on the calls selected in a list, or on
every call matching the list's filter; setting a limit, or resetting it to the code's; pausing and resuming a task
or a queue. The
destructive ones and every bulk one show a confirmation page first. Each step is the same bounded
script call as the command line's (see :mod:`celery_redisdelay.operations.actions`); cancelling marks
the calls REVOKED (``rd.cancel_many``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from ..errors import ConfigurationError, ScheduleError
from ..operations.actions import ACTION_LISTS, ACTION_STATES, act_on, act_on_matching
from ..operations.limits import Limit, set_limit
from ..operations.listing import server_ms
from ..operations.pausing import PauseError
from ..producer.schedule import resolve_due
from .board import dashboard
from .overview import state_counts
from .query import ListQuery

if TYPE_CHECKING:
    from ..extension import RedisDelay

blueprint = Blueprint("actions", __name__)

VERBS = {
    "run-now": "made due now",
    "reschedule": "rescheduled",
    "cancel": "cancelled",
    "requeue": "requeued",
    "purge": "purged",
}
#: Actions that lose something for good, so even one call is confirmed first.
CONFIRMED = ("cancel", "purge")
#: The most ids one "selected" action takes (a list page shows at most 500).
MOST_SELECTED = 1000
UNITS = {"s": 1, "min": 60, "h": 3600, "d": 86400}


def _due(rd: RedisDelay, action: str) -> tuple[int | None, str]:
    """The new due time of a reschedule from the form (a delay with its unit, or an eta), as ms by the
    Redis clock, and how to say it; (None, "") for the other actions."""
    if action != "reschedule":
        return None, ""
    delay, eta = request.form.get("delay", "").strip(), request.form.get("eta", "").strip()
    try:
        if eta:
            due = resolve_due(eta=eta, timezone=rd.app.conf.timezone)
            return due.at_ms, f"for {eta} ({rd.app.conf.timezone or 'UTC'})"
        unit = request.form.get("unit", "min")
        seconds = float(delay) * UNITS[unit]
        due = resolve_due(countdown=seconds)
    except (ValueError, KeyError, ScheduleError) as exc:
        abort(400, f"A reschedule needs a delay (a number and a unit) or an eta: {exc}")
    assert due.countdown_ms is not None
    return server_ms(rd.depot) + due.countdown_ms, f"to {delay} {unit} from now"


@blueprint.post("/call/<call_id>/<action>")
def one(call_id: str, action: str) -> Response | str:
    rd = dashboard().rd
    if action not in ACTION_STATES:
        abort(404, f"No action {action!r}; the actions are {', '.join(ACTION_STATES)}.")
    due_ms, when = _due(rd, action)
    if action in CONFIRMED and not request.form.get("confirmed"):
        return _confirm(f"{action.capitalize()} call {call_id}?", url_for("views.call", call_id=call_id))
    done, refused = act_on(rd.depot, action, [call_id], due_ms)
    if done:
        flash(f"Call {call_id} {VERBS[action]} {when}".rstrip() + ".", "done")
    elif refused:
        flash(f"Call {call_id} has no payload left to run; it stays dead-lettered.", "error")
    else:
        flash(f"Call {call_id} is no longer {ACTION_STATES[action]}: nothing was done.", "error")
    if action in ("cancel", "purge") and done:
        return redirect(url_for("views.calls", state=ACTION_STATES[action]))
    return redirect(url_for("views.call", call_id=call_id))


@blueprint.post("/calls/<state>/act")
def many(state: str) -> Response | str:
    """An action on the selected calls (``scope=selected``) or on every call matching the list's filter
    (``scope=matching``), after a confirmation page."""
    board = dashboard()
    rd = board.rd
    query = ListQuery.parse(state, request.form, board.scan)
    action, scope = request.form.get("action", ""), request.form.get("scope", "selected")
    if state not in ACTION_LISTS.get(action, ()) or scope not in ("selected", "matching"):
        abort(400, f"No action {action!r} on {scope} {state} calls.")
    ids = list(dict.fromkeys(request.form.getlist("ids")))
    if scope == "selected" and not ids:
        flash("Select some calls first (or act on every call matching the filter).", "error")
        return redirect(query.url())
    if len(ids) > MOST_SELECTED:
        abort(400, f"At most {MOST_SELECTED:,} selected calls at once; act on the filter instead.")
    due_ms, when = _due(rd, action)
    if not request.form.get("confirmed"):
        what = f"{len(ids):,} selected {state} calls" if scope == "selected" else _matching(rd, query)
        return _confirm(f"{action.replace('-', ' ').capitalize()} {what} {when}".rstrip() + "?", query.url())
    if scope == "selected":
        done, refused = act_on(rd.depot, action, ids, due_ms)
        skipped = len(ids) - len(done) - len(refused)
        message = f"{len(done):,} of {len(ids):,} selected calls {VERBS[action]}"
        message += f"; {skipped:,} had left the {state} set" if skipped else ""
        message += f"; {len(refused):,} have no payload and stay dead" if refused else ""
    else:
        report = act_on_matching(
            rd.depot,
            action,
            query.filter,
            due_ms=due_ms,
            newest_first=query.newest_first,
            scan=query.scan,
            budget=board.budget,
            lists=(state,),  # what the page lists
        )
        message = f"{report.done:,} calls {VERBS[action]} ({report.scanned:,} entries read)"
        message += f"; {report.refused:,} have no payload and stay dead" if report.refused else ""
        message += f"; {report.stopped}" if report.stopped else ""
    flash(message + ".", "done")
    return redirect(query.url(cursor=""))


def _matching(rd: RedisDelay, query: ListQuery) -> str:
    total = state_counts(rd)[query.state]
    if not query.filter.active:
        return f"all {total:,} {query.state} calls"
    return f"every {query.state} call matching {query.filter.describe()} (of {total:,})"


def _confirm(question: str, back: str) -> str:
    """A page asking ``question`` whose button posts the same form again with ``confirmed`` set."""
    fields = [
        (name, value) for name, value in request.form.items(multi=True) if name not in ("csrf_token", "confirmed")
    ]
    danger = request.form.get("action") in CONFIRMED or request.path.rsplit("/", 1)[-1] in CONFIRMED
    return render_template(
        "confirm.html", question=question, fields=fields, target=request.path, back=back, danger=danger
    )


@blueprint.post("/limits/<path:name>")
def limit(name: str) -> Response:
    """Set limit ``name`` from the form (``rate``: rates separated by commas; ``concurrency``), over what the code
    declares, or reset it to the code's (``reset``): as ``celery -A proj redisdelay limits set|reset`` does."""
    rd = dashboard().rd
    back = redirect(url_for("views.overview_page") + "#limits")
    try:
        if request.form.get("reset"):
            set_limit(rd.depot, name, None)
            flash(f"{name}: as the code declares it.", "done")
            return back
        rates = [rate.strip() for rate in request.form.get("rate", "").split(",") if rate.strip()]
        concurrency = request.form.get("concurrency", "").strip()
        chosen = Limit.declared(
            rates or None,
            int(concurrency) if concurrency.lstrip("-").isdigit() else concurrency or None,
            ("rate", "concurrency"),
        )
        if chosen.empty:
            raise ConfigurationError("give a rate, a concurrency or both (Reset goes back to the code's)")
        set_limit(rd.depot, name, chosen)
    except (ConfigurationError, ValueError) as exc:
        flash(f"{name}: nothing changed: {exc}", "error")
        return back
    flash(f"{name}: {chosen.describe()}; the next release goes by it.", "done")
    return back


@blueprint.post("/pauses")
def pause() -> Response:
    """Pause a task or a queue from the form (``kind``, ``name``, ``for``: a duration or empty, ``reason``), as
    ``celery -A proj redisdelay pause`` does."""
    rd = dashboard().rd
    kind, name = request.form.get("kind", ""), request.form.get("name", "").strip()
    duration = request.form.get("for", "").strip() or None
    try:
        if kind not in ("task", "queue"):
            raise PauseError("pause a task or a queue")
        entry = rd.pause(**{kind: name}, seconds=duration, reason=request.form.get("reason", ""))
    except PauseError as exc:
        flash(f"nothing paused: {exc}", "error")
    else:
        flash(f"{entry['kind']} {entry['name']} paused: none of its calls starts until it is resumed.", "done")
    return redirect(url_for("views.overview_page") + "#paused")


@blueprint.post("/pauses/resume")
def resume() -> Response:
    """Resume a paused task or queue (``kind``, ``name``): its calls go out with the next releases."""
    rd = dashboard().rd
    kind, name = request.form.get("kind", ""), request.form.get("name", "")
    try:
        if kind not in ("task", "queue"):
            raise PauseError("resume a task or a queue")
        was = rd.resume(**{kind: name})
    except PauseError as exc:
        flash(f"nothing resumed: {exc}", "error")
    else:
        flash(f"{kind} {name} {'resumed' if was else 'was not paused'}.", "done")
    return redirect(url_for("views.overview_page") + "#paused")
