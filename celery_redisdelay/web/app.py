"""The dashboard's WSGI application (Flask): :func:`create_app` builds it for one Celery app.

Flask, because the store's calls are synchronous redis-py and most Celery users run Django or Flask
(WSGI): the app mounts under a path of either, and of an ASGI app through a WSGI adapter. Templates
and static files ship inside this package; nothing is loaded from anywhere else.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from celery import Celery
from flask import Flask, render_template
from werkzeug.exceptions import HTTPException

from ..errors import RedisDelayError, StoreUnavailableError
from ..extension import RedisDelay
from ..operations.humanize import compact, deliveries, lock_text, relative, size_text, span
from ..operations.listing import iso
from ..operations.payloads import as_json
from . import actions, keda, overview, views
from .board import ACTION_BUDGET, Dashboard
from .security import Guard, parse_auth


def create_app(
    target: RedisDelay | Celery,
    *,
    read_only: bool = False,
    auth: str | tuple[str, str] | None = None,
    secret: str | bytes | None = None,
    scan: int = 10_000,
    budget: float = ACTION_BUDGET,
) -> Flask:
    """The dashboard of ``target`` (a :class:`RedisDelay`, or a Celery app that has one) as a WSGI app.

    ``read_only`` hides every action and refuses their POSTs (403); ``auth`` (``"user:password"``)
    asks every request for HTTP basic auth; ``secret`` signs the CSRF token and the flash-message
    cookie (random per process by default: give one when several processes serve the same address).
    ``scan`` bounds the entries a filtered list page reads, ``budget`` the seconds one action on
    everything matching a filter may take before it stops and says how far it got.
    """
    rd = target if isinstance(target, RedisDelay) else RedisDelay.of(target)
    key = secret.encode() if isinstance(secret, str) else secret or secrets.token_bytes(32)
    guard = Guard(key, parse_auth(auth), read_only)
    app = Flask(__name__.rsplit(".", 1)[0])  # this package: templates/ and static/ beside this file
    app.secret_key = key
    app.config.update(
        SESSION_COOKIE_NAME="redisdelay_session",  # not the session cookie of an app it is mounted in
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        MAX_CONTENT_LENGTH=1024 * 1024,
    )
    app.extensions["redisdelay"] = Dashboard(rd, guard, scan, budget)
    app.before_request(guard.before_request)
    app.after_request(guard.after_request)
    app.register_blueprint(views.blueprint)
    app.register_blueprint(actions.blueprint)
    app.register_blueprint(keda.blueprint)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(RedisDelayError, _store_error)
    app.jinja_env.filters.update(
        relative=relative,
        span=span,
        iso=iso,
        size=size_text,
        deliveries=deliveries,
        compact=compact,
        lock=lock_text,
        pretty=pretty,
    )
    app.jinja_env.globals.update(
        csrf_token=lambda: guard.csrf_token,
        read_only=read_only,
        app_name=rd.app.main,
        titles=overview.STATE_TITLES,
        shards=rd.shards,
        paused_targets=rd.paused,  # the banner of every page: called once per page
        queue_rows=lambda: overview.queue_rows(rd),  # the overview's table of queues
    )
    # Made once here, not by the first requests at the same time in several threads.
    rd.shards.all()
    _ = rd.depot.broker_layout, rd.depot.accepted_content_types
    return app


def _http_error(error: HTTPException) -> Any:
    code = error.code or 500
    return render_template("error.html", code=code, title=error.name, message=error.description), code


def _store_error(error: RedisDelayError) -> Any:
    code = 503 if isinstance(error, StoreUnavailableError) else 400
    title = "Redis is unavailable" if code == 503 else "Bad request"
    return render_template("error.html", code=code, title=title, message=str(error)), code


def pretty(value: Any, width: int = 100) -> str:
    """Arguments as the search sees them (:func:`as_json`): on one line when short, else indented."""
    flat = as_json(value)
    if len(flat) <= width or not flat.startswith(("[", "{")):
        return flat
    return json.dumps(value, indent=2, ensure_ascii=False)
