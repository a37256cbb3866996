"""Queue latency as JSON, shaped for autoscalers: KEDA's ``metrics-api`` scaler reads one number from a JSON
document (``valueLocation``, e.g. ``ready`` or ``oldest_ready_seconds``). See docs/operations.rst, "Queue latency and
autoscaling".

``GET /api/queues/<queue>``: ``{"queue": name, "ready": N, "oldest_ready_seconds": S, ...}`` (the fields of
:class:`~celery_redisdelay.operations.queues.QueueFigures`). A queue that no task routes to and the store has not
seen is refused with 404, its JSON naming the known queues: a typo in a ScaledObject fails loudly rather than
scaling on a queue that is always empty. ``GET /api/queues``: every known queue.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify
from werkzeug.wrappers import Response

from ..operations.queues import queue_figures
from .board import dashboard

blueprint = Blueprint("keda", __name__)


@blueprint.get("/api/queues")
def every_queue() -> dict[str, Any]:
    figures = queue_figures(dashboard().rd.depot)
    return {"queues": {name: found.as_dict() for name, found in figures.items()}}


@blueprint.get("/api/queues/<path:queue>")
def one_queue(queue: str) -> Response:
    figures = queue_figures(dashboard().rd.depot)
    found = figures.get(queue)
    if found is None:
        refused = jsonify(
            error=f"no task routes to queue {queue!r} and the store has seen no call of it",
            queue=queue,
            known_queues=sorted(figures),
        )
        refused.status_code = 404
        return refused
    return jsonify(queue=queue, **found.as_dict())
