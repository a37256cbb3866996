"""The Celery app the dashboard's tests serve with ``celery -A tests.web_proj redisdelay web``: a shop's
delayed tasks on the Redis of ``$REDISDELAY_TEST_URL``, under the key prefix ``$REDISDELAY_WEB_PREFIX``.
The tests park calls through an app of their own with :func:`shop_tasks` on the same prefix."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from celery_redisdelay import RedisDelay


def shop_tasks(rd: RedisDelay) -> dict[str, Any]:
    """The shop's delayed tasks, by short name: an invoice, an order update under the order's lock, a
    reminder routed to its own queue, and parcels bound to a truck ten at a time."""

    @rd.delayed(name="billing.tasks.send_invoice")
    def send_invoice(order_id: int, amount: float = 0.0) -> None: ...

    @rd.delayed(name="orders.tasks.update_order", lock="order:{order_id}")
    def update_order(order_id: int, status: str) -> None: ...

    @rd.delayed(name="mail.tasks.send_reminder", queue="mail")
    def send_reminder(user_id: int, template: str) -> None: ...

    @rd.batched(name="shipping.tasks.bind_truck", size=10, max_wait=600)
    def bind_truck(area: str, parcels: list[Any]) -> None: ...

    return {"invoice": send_invoice, "order": update_order, "reminder": send_reminder, "truck": bind_truck}


url = os.environ.get("REDISDELAY_TEST_URL", "redis://127.0.0.1:6379")
app = Celery("shop", broker=f"{url}/0", backend=f"{url}/1", set_as_current=False)
app.conf.redisdelay_key_prefix = os.environ.get("REDISDELAY_WEB_PREFIX", "web-test")
rd = RedisDelay(app)
tasks = shop_tasks(rd)
