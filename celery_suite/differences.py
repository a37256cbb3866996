"""Tests of Celery's integration suite that pass with Celery alone and not with the extension, each with the
reason: a difference README "Differences from Celery's own countdown" names. Keyed by mode, then test id.

None is left. The last, ``test_canvas.py::test_chord::test_group_or_task_countdown_delays_header``, checked that
each header task saw an eta: a parked call's task now gets the eta Celery computed (``self.request.eta``), though
its released message carries none for the worker's timer."""

from __future__ import annotations

DIFFERENCES: dict[str, dict[str, str]] = {
    "delayed": {},
    "all-tasks": {},
}
