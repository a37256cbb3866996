"""Tests of Celery's integration suite that pass with Celery alone and not with the extension, each with the
reason: a difference README "Differences from Celery's own countdown" names (``docs/differences.rst``). Keyed by
mode, then test id.

Two are left, both by design, both found by ``--full`` (Celery 5.7.0):

* ``test_inspect.py``'s ``test_scheduled`` calls a task with an eta and asks the worker (``inspect().scheduled()``)
  for what it holds on its timer: with the extension the worker holds nothing, the call waits in Redis.
* ``test_group_chains.py``'s tests run each workflow with ``task_protocol = 1`` too: the extension refuses that
  protocol (``ConfigurationError``), so in the delayed mode, where every task is a delayed task, those calls raise.
  In the all-tasks mode they pass: a call due now is Celery's own there.

Not differences, as they fail with Celery alone too (the comparison leaves them out): ``test_tasks.py``'s
``test_trace_log_arguments`` tests, and in ``--full`` ``test_redis_backend.py``'s ``test_pubsub_*`` tests, which
find the result channels earlier files left subscribed.
"""

from __future__ import annotations

from itertools import product

INSPECT_SCHEDULED = "t.integration.test_inspect.test_Inspect::test_scheduled"
NOTHING_ON_THE_WORKER_TIMER = (
    "the call with an eta waits in Redis, not on the worker's timer, so inspect().scheduled() lists nothing where the "
    "test expects the call (`celery -A proj redisdelay list` lists it): the point of the extension"
)

GROUP_CHAINS = "t.integration.test_group_chains.test_group_chains"
#: test_group_chains.py's tests with ``task_protocol = 1`` (the last part of each id).
PROTOCOL_1_TESTS = (
    *(
        f"{GROUP_CHAINS}::test_group_results_reach_the_next_group[{'-'.join(flags)}-1]"
        for flags in product(("False", "True"), repeat=3)  # as_chord_body, frozen, serialized
    ),
    *(f"{GROUP_CHAINS}::test_pending_chord_keeps_header_errback[{level}-1]" for level in (0, 2)),
)
PROTOCOL_1_REFUSED = (
    "the test sets task_protocol = 1, which the extension refuses (ConfigurationError at the call of a delayed "
    "task): its countdown cannot be taken out of the message"
)

DIFFERENCES: dict[str, dict[str, str]] = {
    "delayed": {
        INSPECT_SCHEDULED: NOTHING_ON_THE_WORKER_TIMER,
        **dict.fromkeys(PROTOCOL_1_TESTS, PROTOCOL_1_REFUSED),
    },
    "all-tasks": {INSPECT_SCHEDULED: NOTHING_ON_THE_WORKER_TIMER},
    "tracked": {INSPECT_SCHEDULED: NOTHING_ON_THE_WORKER_TIMER},
}
