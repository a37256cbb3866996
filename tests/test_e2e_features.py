"""End to end, real worker and beat: keyed batches, lock deferral, debounce, unique parking, reschedule.

The tasks are in ``tests.proj``: ``bind_truck`` (parcels batched per delivery area), ``update_order`` and
``hold_order`` (an order update under the order's lock).
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest

from celery_redisdelay.testing import wait_for

from .conftest import Cluster
from .test_e2e import marks, runs

pytestmark = pytest.mark.e2e


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def trucks(proj: Any, area: str) -> list[list[Any]]:
    return [json.loads(raw) for raw in marks(proj).lrange(f"trucks:{area}", 0, -1)]


def wait_for_items(proj: Any, areas: list[str], count: int, timeout: float = 60) -> dict[str, list[list[Any]]]:
    def loaded() -> dict[str, list[list[Any]]] | None:
        batches = {area: trucks(proj, area) for area in areas}
        total = sum(len(batch) for per_area in batches.values() for batch in per_area)
        return batches if total >= count else None

    return wait_for(loaded, timeout, f"{count} parcels bound to trucks")


def wait_until_forgotten(proj: Any, call_id: str, timeout: float = 30) -> None:
    wait_for(lambda: proj.rd.find(call_id) is None, timeout, f"the acknowledgement of {call_id}")


# -- keyed batches ---------------------------------------------------------------------------------


def test_a_full_group_runs_as_one_call_with_its_items_in_order(proj: Any) -> None:
    area = unique("area-size")
    results = [proj.bind_truck.add(area, {"parcel": n}) for n in range(10)]
    assert results[:9] == [None] * 9
    assert results[9] is not None
    assert results[9].get(timeout=30) == 10
    assert trucks(proj, area) == [[{"parcel": n} for n in range(10)]]
    wait_until_forgotten(proj, results[9].id)


def test_a_group_runs_when_its_first_item_has_waited_max_wait(proj: Any) -> None:
    area = unique("area-time")
    for n in range(3):
        assert proj.bind_truck.add(area, n) is None
    batches = wait_for_items(proj, [area], 3, timeout=30)
    assert batches[area] == [[0, 1, 2]]


def test_items_from_eight_producers_each_land_in_exactly_one_batch(proj: Any) -> None:
    areas = [unique(f"area-{n}") for n in range(3)]
    items = list(range(1000))

    def produce(part: list[int]) -> None:
        for item in part:
            proj.bind_truck.add(areas[item % 3], item)

    threads = [threading.Thread(target=produce, args=(items[n::8],)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    batches = wait_for_items(proj, areas, len(items), timeout=90)
    seen = [item for area, per_area in batches.items() for batch in per_area for item in batch]
    assert sorted(seen) == items, "an item was lost or bound twice"
    for area, per_area in batches.items():
        assert all(areas[item % 3] == area for batch in per_area for item in batch)
        assert all(len(batch) <= 10 for batch in per_area)
        # All but the last batch of an area filled up; the last may have been flushed by time.
        assert all(len(batch) == 10 for batch in per_area[:-1])
    assert proj.rd.stats()["batch_items"] == 0


# -- lock deferral ---------------------------------------------------------------------------------


def order_log(proj: Any, order: str) -> tuple[list[str], list[int]]:
    statuses = [s.decode() for s in marks(proj).lrange(f"order:{order}:statuses", 0, -1)]
    concurrency = [int(n) for n in marks(proj).lrange(f"order:{order}:concurrency", 0, -1)]
    return statuses, concurrency


def test_calls_on_one_lock_all_run_one_at_a_time(proj: Any) -> None:
    order = unique("order")
    deferrals_before = int(proj.rd.client.hget(proj.rd.keys.counters, "lock_deferrals") or 0)
    results = [proj.update_order.delay(order, f"status-{n}") for n in range(20)]
    wait_for(lambda: len(order_log(proj, order)[0]) >= 20, 90, "20 order updates")
    statuses, concurrency = order_log(proj, order)
    assert sorted(statuses) == sorted(f"status-{n}" for n in range(20)), "an update was dropped or ran twice"
    assert max(concurrency) == 1, f"two updates of one order ran at once: {concurrency}"
    for result in results:
        wait_until_forgotten(proj, result.id)
    deferrals = int(proj.rd.client.hget(proj.rd.keys.counters, "lock_deferrals") or 0) - deferrals_before
    print(f"20 updates of one order on 2 worker processes: {deferrals} deferrals")


def test_waiters_run_after_the_lock_of_a_killed_holder_expires(proj: Any, cluster: Cluster) -> None:
    order = unique("order-kill")
    holder = proj.hold_order.delay(order, 600)
    wait_for(lambda: marks(proj).get(f"order:{order}:holding"), 30, "the holder to take the lock")
    # A waiter the killed worker had prefetched is stuck in kombu's unacknowledged set until the
    # broker's visibility timeout (an hour); a short queue timeout lets the sweep send it again sooner.
    waiters = [proj.update_order.apply_async((order, f"after-{n}"), queue_timeout=10) for n in range(3)]

    def deferred_once() -> bool:
        entries = [proj.rd.find(waiter.id) for waiter in waiters]
        return any(entry is not None and entry.meta.get("w", 0) >= 1 for entry in entries)

    wait_for(deferred_once, 30, "a waiter to find the lock busy and be deferred")
    cluster.restart_worker_after_kill()  # SIGKILL: the holder never releases the lock
    wait_for(lambda: len(order_log(proj, order)[0]) >= 3, 60, "the waiters to run after the lock expired")
    statuses, concurrency = order_log(proj, order)
    assert sorted(statuses) == ["after-0", "after-1", "after-2"]
    assert max(concurrency) == 1
    # The killed holder is delivered again once its visibility timeout passes, and finishes.
    wait_for(lambda: int(marks(proj).get(f"order:{order}:holds") or 0) >= 2, 60, "the holder's redelivery")
    wait_until_forgotten(proj, holder.id, timeout=60)


# -- debounce, unique parking, reschedule ----------------------------------------------------------


def test_ten_debounced_calls_run_once_with_the_last_arguments(proj: Any) -> None:
    key = unique("debounce")
    results = [proj.record.apply_async((key, n), countdown=1, debounce_key=key) for n in range(10)]
    assert len({result.id for result in results}) == 1
    wait_until_forgotten(proj, results[0].id)
    assert [value for _, _, value in runs(proj, key)] == ["9"]


def test_ten_unique_calls_run_once_with_the_first_arguments(proj: Any) -> None:
    key = unique("unique")
    results = [proj.record.apply_async((key, n), countdown=1, unique_key=key) for n in range(10)]
    assert len({result.id for result in results}) == 1
    assert results[0].get(timeout=30) == 0
    wait_until_forgotten(proj, results[0].id)
    assert [value for _, _, value in runs(proj, key)] == ["0"]


def test_reschedule_earlier_runs_the_call_at_the_new_time(proj: Any) -> None:
    key = unique("earlier")
    result = proj.record.apply_async((key, "early"), countdown=3600)
    assert proj.rd.reschedule(result.id, countdown=0.5) is True
    new_due = proj.rd.find(result.id).score_ms
    [(call_id, started_ms, _)] = runs(proj, key, timeout=30)
    assert call_id == result.id
    assert int(started_ms) >= new_due
    assert proj.rd.reschedule(result.id, countdown=1) is False  # released: no longer parked


def test_reschedule_later_holds_the_call_back(proj: Any) -> None:
    key = unique("later")
    result = proj.record.apply_async((key, "late"), countdown=2)
    assert proj.rd.reschedule(result.id, countdown=4) is True
    new_due = proj.rd.find(result.id).score_ms
    [(_, started_ms, _)] = runs(proj, key, timeout=30)
    assert int(started_ms) >= new_due, "ran at the old due time"
