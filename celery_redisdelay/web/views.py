"""The dashboard's pages (GET): the overview, the paged lists of delayed calls (those held by their limits and
those waiting on a pause each in a list of their own), in-flight and dead calls, and one call. Each reads a bounded
amount from Redis, whatever the backlog."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flask import Blueprint, abort, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from ..operations import admin
from ..operations.actions import ACTION_STATES
from ..operations.history import KEPT_MINUTES, read_history
from ..operations.listing import SCORE_MEANING
from . import overview
from .board import dashboard
from .history import WINDOWS, history_view
from .overview import STATE_TITLES, state_counts
from .query import PAGE_SIZES, ListQuery

if TYPE_CHECKING:
    from ..extension import RedisDelay

blueprint = Blueprint("views", __name__)

#: The actions a list offers per state, as (action, button text), in the order shown.
LIST_ACTIONS = {
    "delayed": [("run-now", "Run now"), ("reschedule", "Reschedule"), ("cancel", "Cancel")],
    "limited": [("cancel", "Cancel")],
    "paused": [("cancel", "Cancel")],  # run now and reschedule move calls in the delay set only
    "inflight": [],
    "dead": [("requeue", "Requeue"), ("purge", "Purge")],
}


def page_context(rd: RedisDelay, active: str, counts: dict[str, int] | None = None) -> dict[str, Any]:
    """What the layout around every page needs: the tab shown and the counts in the tabs."""
    return {"active": active, "counts": counts or state_counts(rd)}


@blueprint.get("/")
def overview_page() -> str:
    rd = dashboard().rd
    status = admin.status(rd.depot)
    counts = {state: status[state] for state in STATE_TITLES if state != "paused"}
    counts["paused"] = status["paused_calls"]
    # Each tab counts what its list shows (status counts the calls held by limits or paused as delayed).
    counts["delayed"] -= status["limited"] + status["paused_calls"]
    return render_template(
        "overview.html",
        status=status,
        history=history_view(rd, _window()),
        due=overview.due_histogram(rd),
        tasks=overview.task_chart(overview.tasks_sample(rd)),
        limits=overview.limit_rows(rd, status["limits"]),
        paused=rd.paused(),
        **page_context(rd, "overview", counts),
    )


@blueprint.get("/history")
def history() -> str:
    """The overview's history section alone: the page's script swaps it in every few seconds."""
    return render_template("_history.html", history=history_view(dashboard().rd, _window()))


@blueprint.get("/api/history")
def history_json() -> dict[str, Any]:
    """The history as JSON, minute by minute: ``?minutes=`` 1 to 1440 (60 by default)."""
    minutes = request.args.get("minutes", "60")
    if not minutes.isdigit() or not 1 <= int(minutes) <= KEPT_MINUTES:
        abort(400, f"minutes must be a whole number from 1 to {KEPT_MINUTES}")
    return read_history(dashboard().rd.depot, int(minutes)).as_dict()


def _window() -> str:
    window = request.args.get("window", "1h")
    if window not in WINDOWS:
        abort(400, f"window must be one of {', '.join(WINDOWS)}")
    return window


@blueprint.get("/calls/<state>")
def calls(state: str) -> str | Response:
    board = dashboard()
    rd = board.rd
    query = ListQuery.parse(state, request.args, board.scan)
    if set(request.args) != set(query.params()):
        return redirect(query.url())  # the filter form sends every field: keep only those that say something
    found = admin.page(
        rd.depot,
        state,
        limit=query.limit,
        cursor=query.cursor or None,
        task=query.task,
        queue=query.queue,
        search=query.q,
        newest_first=query.newest_first,
        scan=query.scan,
    )
    return render_template(
        "calls.html",
        query=query,
        page=found,
        rows=[admin.entry_dict(entry, found.now_ms) for entry in found.calls],
        meaning=SCORE_MEANING[state],
        actions=[] if board.read_only else LIST_ACTIONS[state],
        page_sizes=PAGE_SIZES,
        known_tasks=sorted(name for name in rd.app.tasks if not name.startswith("celery.")),
        known_queues=sorted(rd.app.amqp.queues),
        timezone=rd.app.conf.timezone or "UTC",
        **page_context(rd, state),
    )


@blueprint.get("/call/<call_id>")
def call(call_id: str) -> str:
    rd = dashboard().rd
    found = admin.describe(rd.depot, call_id)
    if found is None:
        abort(404, f"No call {call_id} in the store: never parked, or finished, cancelled or purged since.")
    state = found["state"]
    actions = [action for action, wanted in ACTION_STATES.items() if wanted == state]
    listed = state  # the list that shows it
    if found["paused_on"] is not None:
        listed = "paused"
        actions = ["cancel"]  # run now and reschedule move only the calls in the delay set; it waits on its pause
    return render_template(
        "call.html",
        call=found,
        listed=listed,
        actions=[] if dashboard().read_only else actions,
        timezone=rd.app.conf.timezone or "UTC",
        **page_context(rd, listed),
    )


@blueprint.get("/find")
def find() -> Response:
    """The id box in the header: straight to the call's page (which says when there is no such call)."""
    call_id = request.args.get("id", "").strip()
    if not call_id:
        return redirect(url_for("views.overview_page"))
    return redirect(url_for("views.call", call_id=call_id))
