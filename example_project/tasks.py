"""Tasks from the source documents' scenarios; each call waits in Redis until it is due."""

from __future__ import annotations

import redis
from celery.utils.log import get_task_logger

from .app import URL, rd

logger = get_task_logger(__name__)

#: The project's own data lives in the same Redis (``decode_responses``: strings, not bytes).
db = redis.Redis.from_url(URL, decode_responses=True)

ORDER_LOCK_SECONDS = 10


@rd.delayed(lock="order:{order_id}", lock_timeout=ORDER_LOCK_SECONDS, lock_retry=5, timeout=30)
def update_order(order_id: int, status: str) -> str:
    """Write an order's status under the order's lock (an update that finds it busy waits in Redis).

    The worker takes the lock ``order:<id>`` before the body runs. When another writer holds it, the
    update is not dropped and no worker waits for it: the call goes back to Redis behind the lock and
    runs as soon as the holder releases it (at the latest every ``lock_retry`` seconds, and once the
    lock expires if its holder died).
    """
    db.hset(f"example:order:{order_id}", "status", status)
    logger.info("order %s is now %r", order_id, status)
    return status


@rd.batched(size=10, max_wait=3)
def bind_truck(area: str, parcels: list[int]) -> int:
    """Parcels of one delivery area are bound to a truck ten at a time, or when the first parcel has
    waited 3 s (a real dispatcher might wait minutes)."""
    db.rpush(f"example:trucks:{area}", ",".join(map(str, parcels)))
    logger.info("truck for %s loaded with %d parcels: %s", area, len(parcels), parcels)
    return len(parcels)


@rd.delayed(countdown=5)
def send_reminder(order_id: int, message: str) -> str:
    """A reminder that goes out 5 s after it is asked for, unless the call gives a countdown or eta."""
    text = f"order {order_id}: {message}"
    db.rpush("example:reminders", text)
    logger.info("reminder sent: %s", text)
    return text
