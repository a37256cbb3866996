"""The extension's own promises: one per app, when a delivery counts as finished, the tick's budget."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore, Reject, Retry
from celery.states import FAILURE, IGNORED, REJECTED, RETRY, SUCCESS

from celery_redisdelay import Abandon, RedisDelay, RedisDelayError
from celery_redisdelay.worker.tracking import finishes_call


def test_park_and_find(rd: RedisDelay) -> None:
    @rd.delayed
    def charge(order_id: int) -> int:
        return order_id

    result = charge.apply_async((42,), countdown=0)
    entry = rd.find(result.id)
    assert entry is not None
    assert entry.state == "delayed"


def test_one_extension_per_app(make_app: Any) -> None:
    app, rd = make_app()
    assert RedisDelay.of(app) is rd
    with pytest.raises(RedisDelayError, match="already bound"):
        RedisDelay(app)
    with pytest.raises(RedisDelayError, match="has no RedisDelay"):
        RedisDelay.of(Celery("bare", set_as_current=False))


@pytest.mark.parametrize(
    ("state", "retval", "finished"),
    [
        (SUCCESS, 42, True),
        (FAILURE, ValueError("boom"), True),
        (RETRY, Retry(), False),  # the retry parked the same id again
        (IGNORED, Ignore(), True),
        (IGNORED, Abandon(), False),  # left in flight on purpose: the sweep delivers it again
        (REJECTED, Reject(requeue=False), True),
        (REJECTED, Reject(requeue=True), False),  # the broker delivers it again
    ],
)
def test_which_endings_acknowledge_the_call(state: str, retval: object, finished: bool) -> None:
    assert finishes_call(state, retval) is finished


def test_a_tick_stops_when_its_budget_is_spent(rd: RedisDelay) -> None:
    @rd.delayed
    def due_now() -> None: ...

    result = due_now.delay()
    assert rd.releaser.tick(budget=0).released == 0
    assert rd.find(result.id).state == "delayed"  # type: ignore[union-attr]
    assert rd.tick()["released"] == 1
