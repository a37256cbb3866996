"""Tasks from the source documents' scenarios; each call waits in Redis until it is due."""

from __future__ import annotations

import redis
from celery.utils.log import get_task_logger

from celery_redisdelay import DelayedTask

from .app import URL, rd

logger = get_task_logger(__name__)

#: The project's own data lives in the same Redis (``decode_responses``: strings, not bytes).
db = redis.Redis.from_url(URL, decode_responses=True)

ORDER_LOCK_SECONDS = 10


def order_lock(order_id: int) -> redis.lock.Lock:
    """The lock every writer of an order takes first; it expires, so a crashed holder cannot keep it."""
    lock: redis.lock.Lock = db.lock(f"example:order:{order_id}:lock", timeout=ORDER_LOCK_SECONDS)
    return lock


# max_retries=None: a write is never given up; the lock it waits for expires after ORDER_LOCK_SECONDS.
@rd.delayed(bind=True, timeout=30, max_retries=None)
def update_order(self: DelayedTask, order_id: int, status: str) -> str:
    """Seed 000: write an order's status under the order's lock.

    When another writer holds the lock, the update is not dropped: ``self.retry`` parks it in Redis
    again and it runs a second later.
    """
    lock = order_lock(order_id)
    if not lock.acquire(blocking=False):
        logger.info("order %s is locked; update to %r parked for 1 s", order_id, status)
        raise self.retry(countdown=1)
    try:
        db.hset(f"example:order:{order_id}", "status", status)
    finally:
        lock.release()
    logger.info("order %s is now %r", order_id, status)
    return status


@rd.delayed(countdown=5)
def send_reminder(order_id: int, message: str) -> str:
    """A reminder that goes out 5 s after it is asked for, unless the call gives a countdown or eta."""
    text = f"order {order_id}: {message}"
    db.rpush("example:reminders", text)
    logger.info("reminder sent: %s", text)
    return text
