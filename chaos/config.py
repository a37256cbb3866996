"""Names and settings shared by the runner and the app; importing this module starts nothing.

(``chaos.app`` builds the Celery app from the environment when it is imported, so the runner imports
it only once it has set ``REDISDELAY_CHAOS_URL``.)
"""

from __future__ import annotations

ENV_URL = "REDISDELAY_CHAOS_URL"
ENV_EVENTS = "REDISDELAY_CHAOS_EVENTS"
ENV_SHARDS = "REDISDELAY_CHAOS_SHARDS"

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
