"""A pytest plugin for Celery's integration tests (``-p celery_suite.plugin``): every app the tests make gets the
extension as ``REDISDELAY_SUITE_MODE`` says (:mod:`celery_suite.modes`), without a change to Celery's files.

Celery's pytest fixtures make their apps with ``celery.contrib.testing.app.TestApp``; the plugin wraps it. An app
whose broker is not a Redis (TestApp's default is ``memory://``) keeps its calls in the suite's redis-server
(``redisdelay_url`` = ``TEST_BROKER``), as a user of such a broker would have to say, under a key prefix of its own.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from .modes import ENV_MODE, MODE_SETTINGS


def pytest_configure(config: Any) -> None:
    mode = os.environ.get(ENV_MODE, "plain")
    if mode not in MODE_SETTINGS:
        raise ValueError(f"{ENV_MODE}={mode!r}: expected one of {', '.join(MODE_SETTINGS)}")
    if mode == "plain":
        return
    from celery.contrib.testing import app as testing_app

    from celery_redisdelay import RedisDelay

    made = testing_app.TestApp

    def with_the_extension(*args: Any, config: Any = None, **kwargs: Any) -> Any:
        settings = {**(config or {}), **MODE_SETTINGS[mode]}
        broker = kwargs.get("broker") or settings.get("broker_url") or testing_app.DEFAULT_TEST_CONFIG["broker_url"]
        if not str(broker).startswith("redis") and os.environ.get("TEST_BROKER", "").startswith("redis"):
            settings.setdefault("redisdelay_url", os.environ["TEST_BROKER"])
            # Its own keys: its calls are released to its own broker, never the session app's calls to it.
            settings["redisdelay_key_prefix"] = f"{settings['redisdelay_key_prefix']}-{uuid.uuid4().hex[:12]}"
        app = made(*args, config=settings, **kwargs)
        rd = RedisDelay(app)
        if mode == "delayed":
            app.Task = rd.Task  # every task bound to the app from now on is a delayed task
        return app

    testing_app.TestApp = with_the_extension
