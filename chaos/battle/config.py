"""Names and settings shared by the battle's runner and its app; importing this module starts nothing.

(``chaos.battle.app`` builds the Celery app from the environment when it is imported, so the runner
imports it only once it has set these variables.)
"""

from __future__ import annotations

#: The store's and the broker's URL (one redis-server, as an adopting user runs it).
ENV_URL = "REDISDELAY_BATTLE_URL"
#: The broker's URL when it is not the store's redis-server (``--broker rabbitmq``: ``amqp://...``).
ENV_BROKER_URL = "REDISDELAY_BATTLE_BROKER_URL"
#: The ledger's URL: a redis-server of its own, never faulted.
ENV_LEDGER_URL = "REDISDELAY_BATTLE_LEDGER_URL"
#: ``1``: plain Celery, no extension (the twin run).
ENV_PLAIN = "REDISDELAY_BATTLE_PLAIN"
#: kombu's ``visibility_timeout`` in seconds (``redisdelay_queue_timeout`` is twice it).
ENV_VISIBILITY = "REDISDELAY_BATTLE_VISIBILITY_TIMEOUT"
#: ``redisdelay_lease`` in seconds (its renewal a third of it); empty: the package's default.
ENV_LEASE = "REDISDELAY_BATTLE_LEASE"
#: ``1``: ``redisdelay_skip_unacked`` False (kombu keeps its copy of the store's deliveries too).
ENV_KOMBU_UNACKED = "REDISDELAY_BATTLE_KOMBU_UNACKED"
#: ``1``: ``redisdelay_track_due_now`` True (the calls due now go through the store too, tracked); ``0``: False.
ENV_TRACK = "REDISDELAY_BATTLE_TRACK"
#: ``1``: ``task_acks_late`` (Celery's at-least-once setting; the fair twin of a tracked run).
ENV_ACKS_LATE = "REDISDELAY_BATTLE_ACKS_LATE"
#: The size of a keyed batch and the most its first item waits, ``size,max_wait``.
ENV_BATCH = "REDISDELAY_BATTLE_BATCH"

KEY_PREFIX = "battle"
QUEUE = "battle"
TICK_QUEUE = "battle-tick"

WORK_TASK = "battle.work"
RETRY_TASK = "battle.retrying"
LOCKED_TASK = "battle.locked"
BATCH_TASK = "battle.batch"

#: Locks the locked calls spread over. At 4 % of 300 calls/s, four locks got 3 calls/s each (0.175 s runs): more
#: than a lock serves when each handoff goes through the broker to a prefetching worker (about 2.4/s here), so
#: their lines grew without end. Sixteen get 0.75/s each, and still queue up behind a killed holder.
LOCK_SLOTS = 16
LOCK_TIMEOUT = 30.0
LOCK_RETRY = 2.0
