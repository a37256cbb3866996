"""Tests of Celery's integration suite that pass with Celery alone and not with the extension, each with the
reason: a difference README "Differences from Celery's own countdown" names. Keyed by mode, then test id."""

from __future__ import annotations

#: README "Differences", "Publish-time hooks run when the call is parked": a call rendered from a kept template
#: leaves out the Redis result backend's subscription to its result's channel; ``get()`` subscribes when it waits.
KEPT_TEMPLATE_SUBSCRIPTION = (
    "the second call of a task with the same options is rendered from a kept template, which leaves out the Redis "
    "result backend's subscription to the result's channel at the call (AsyncResult.get() subscribes when it waits); "
    "the test looks for that channel right after the call"
)

DIFFERENCES: dict[str, dict[str, str]] = {
    "delayed": {
        "t.integration.test_tasks.test_task_redis_result_backend::test_asyncresult_forget_cancels_subscription": (
            KEPT_TEMPLATE_SUBSCRIPTION
        ),
        "t.integration.test_tasks.test_task_redis_result_backend::test_asyncresult_get_cancels_subscription": (
            KEPT_TEMPLATE_SUBSCRIPTION
        ),
    },
    "all-tasks": {},
}
