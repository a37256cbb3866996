"""The modes Celery's integration tests run in, and the settings each gives every app the tests make.

``plain``
    Celery as it is: the baseline.
``delayed``
    Every task of the app is a delayed task: the app's task class becomes the extension's (``rd.Task``) before
    the tests' tasks (``@shared_task``) are bound to it, Celery's own tasks included.
``all-tasks``
    ``redisdelay_all_tasks`` with ``redisdelay_track_due_now = False``: the tasks stay as they are, their calls with
    a countdown or an eta are parked, and their calls due now take Celery's own path.
``tracked``
    ``redisdelay_all_tasks`` as it is by default: the calls due now go through the store too, tracked.

In every mode but ``plain`` the in-process worker of the tests runs the precise releaser in a thread.
"""

from __future__ import annotations

from typing import Any

MODES = ("plain", "delayed", "all-tasks", "tracked")
ENV_MODE = "REDISDELAY_SUITE_MODE"

#: The extension's settings in every mode but plain.
SETTINGS: dict[str, Any] = {
    "redisdelay_key_prefix": "celery-suite",
    "redisdelay_precise_release": True,
    "redisdelay_tick_interval": 0.2,
    "redisdelay_visibility_timeout": 300,
}
MODE_SETTINGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "delayed": SETTINGS,
    "all-tasks": {**SETTINGS, "redisdelay_all_tasks": True, "redisdelay_track_due_now": False},
    "tracked": {**SETTINGS, "redisdelay_all_tasks": True, "redisdelay_track_due_now": True},
}
