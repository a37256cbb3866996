"""Tests of Celery's integration suite that pass with Celery alone and not with the extension, each with the
reason: a difference README "Differences from Celery's own countdown" names. Keyed by mode, then test id."""

from __future__ import annotations

#: README "Differences", "The running task sees no eta": the wait happened in Redis, so the released message
#: reaches the worker without one and ``self.request.eta`` is None. The header still waits for its countdown
#: (the test's elapsed-time check passes); only its check that each header task saw an eta fails.
NO_ETA_AT_THE_WORKER = (
    "the header tasks are parked for their countdown and reach the worker due, without an eta, so "
    "self.request.eta is None where the test expects the eta (it checks the delay itself first, and that passes)"
)
HEADER_ETA = "t.integration.test_canvas.test_chord::test_group_or_task_countdown_delays_header"

DIFFERENCES: dict[str, dict[str, str]] = {
    "delayed": {HEADER_ETA: NO_ETA_AT_THE_WORKER},
    # The header's tasks are plain tasks with a countdown, which this mode parks as a delayed task parks them.
    "all-tasks": {HEADER_ETA: NO_ETA_AT_THE_WORKER},
}
