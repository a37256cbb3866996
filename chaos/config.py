"""Names and settings shared by the runner and the app; importing this module starts nothing.

(``chaos.app`` builds the Celery app from the environment when it is imported, so the runner imports
it only once it has set these variables.)
"""

from __future__ import annotations

#: The store's URL; empty when the store follows a ``sentinel://`` broker.
ENV_URL = "REDISDELAY_CHAOS_URL"
#: The broker's URL (the store's when not set).
ENV_BROKER_URL = "REDISDELAY_CHAOS_BROKER_URL"
#: kombu's ``master_name`` for a ``sentinel://`` broker.
ENV_MASTER_NAME = "REDISDELAY_CHAOS_MASTER_NAME"
ENV_WAIT_REPLICAS = "REDISDELAY_CHAOS_WAIT_REPLICAS"
ENV_EVENTS = "REDISDELAY_CHAOS_EVENTS"
ENV_SHARDS = "REDISDELAY_CHAOS_SHARDS"
#: ``1``: the workers run the precise releaser in a thread (``redisdelay_precise_release``).
ENV_PRECISE_IN_WORKER = "REDISDELAY_CHAOS_PRECISE_IN_WORKER"
#: ``worker_max_tasks_per_child`` of the workers (0: none): their pool processes are replaced, forked anew.
ENV_MAX_TASKS_PER_CHILD = "REDISDELAY_CHAOS_MAX_TASKS_PER_CHILD"
#: ``redisdelay_queue_timeout`` of every process: the runner's ``--queue-timeout``, which its verdicts assume.
ENV_QUEUE_TIMEOUT = "REDISDELAY_CHAOS_QUEUE_TIMEOUT"

KEY_PREFIX = "chaos"
QUEUE = "chaos"
TICK_QUEUE = "chaos-tick"
TICK_INTERVAL = 0.2
CLAIM_TIMEOUT = 5.0
#: kombu's visibility timeout: messages a killed worker had prefetched (unacknowledged in kombu's
#: sense) go back to their queue this long after their delivery, found by a scan every
#: RESTORE_INTERVAL seconds.
BROKER_VISIBILITY_TIMEOUT = 30
RESTORE_INTERVAL = 5

#: The soak's other tasks: a consumer under a lock (one of LOCK_SLOTS locks), and a batched one.
LOCKED_TASK = "chaos.locked"
BATCH_TASK = "chaos.batch"
LOCK_SLOTS = 4
LOCK_TIMEOUT = 10.0
LOCK_RETRY = 1.0
BATCH_SIZE = 10
BATCH_MAX_WAIT = 3.0
