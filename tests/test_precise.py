"""The precise releaser against a real redis-server: it releases without any tick, an earlier call
wakes it from its sleep towards a later one, it survives dropped connections, and two of them
never publish a call twice. No timing is asserted: only what was released and what was not."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redisdelay import RedisDelay
from celery_redisdelay.bootsteps import PreciseReleaseStep
from celery_redisdelay.release.precise import PreciseReleaser
from celery_redisdelay.testing import wait_for

MakeApp = Callable[..., tuple[Celery, RedisDelay]]


def task_on(rd: RedisDelay) -> Any:
    @rd.delayed(name="tests.precise.ping")
    def ping(n: int) -> int:
        return n

    return ping


def published(client: redis.Redis, rd: RedisDelay) -> list[str]:
    queue = rd.app.conf.task_default_queue
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)]


@contextmanager
def running(rd: RedisDelay, longest_sleep: float = 30.0, **options: Any) -> Iterator[PreciseReleaser]:
    releaser = PreciseReleaser(rd.releasers, longest_sleep=longest_sleep, retry_after=0.05, **options)
    thread = threading.Thread(target=releaser.run, daemon=True)
    thread.start()
    try:
        yield releaser
    finally:
        releaser.stop()
        thread.join(10)
        assert not thread.is_alive()


def test_a_due_call_is_released_without_a_tick(rd: RedisDelay, client: redis.Redis) -> None:
    ping = task_on(rd)
    with running(rd):
        result = ping.apply_async((1,), countdown=0.2)
        wait_for(lambda: published(client, rd) == [result.id], 10, "the release")
    assert rd.find(result.id).state == "inflight"  # type: ignore[union-attr]


def test_an_earlier_call_wakes_a_releaser_sleeping_towards_a_later_one(rd: RedisDelay, client: redis.Redis) -> None:
    ping = task_on(rd)
    later = ping.apply_async((1,), countdown=3600)
    # With nothing due for an hour and a 30 s cap, only the wake marker can make it look again soon.
    with running(rd, longest_sleep=30.0):
        wait_for(lambda: blocked(client), 10, "the releaser to sleep in BZPOPMIN")
        sooner = ping.apply_async((2,), countdown=0)
        wait_for(lambda: published(client, rd) == [sooner.id], 10, "the earlier call to be released")
    assert rd.find(later.id).state == "delayed"  # type: ignore[union-attr]


def test_calls_parked_due_within_a_rounds_spacing_go_out_in_the_next_round(rd: RedisDelay, client: redis.Redis) -> None:
    """Each call parked due now wakes the releaser; the calls parked within the spacing after a round wait for
    the next one together (one script for the two here, where each went alone before)."""
    ping = task_on(rd)
    with running(rd, round_spacing=2.0) as releaser:
        wait_for(lambda: blocked(client), 10, "the releaser to sleep in BZPOPMIN")
        first = ping.apply_async((1,), countdown=0)
        wait_for(lambda: published(client, rd) == [first.id], 10, "the first call's release")
        second, third = ping.apply_async((2,), countdown=0), ping.apply_async((3,), countdown=0)
        wait_for(lambda: len(published(client, rd)) == 3, 10, "the next two calls' release")
        # The releaser's thread counts a round after its script returned: wait for the count, not the list.
        wait_for(lambda: releaser.released == 3, 10, "the releaser to count its round")
        assert releaser.rounds == 2
    assert {second.id, third.id} < set(published(client, rd))


def blocked(client: redis.Redis) -> bool:
    return any(entry.get("cmd") == "bzpopmin" for entry in client.client_list())


def test_the_releaser_carries_on_after_its_connections_are_dropped(rd: RedisDelay, client: redis.Redis) -> None:
    ping = task_on(rd)
    with running(rd, longest_sleep=30.0):
        wait_for(lambda: blocked(client), 10, "the releaser to sleep in BZPOPMIN")
        client.client_kill_filter(_type="normal", skipme=True)  # as a server that drops idle clients does
        result = ping.apply_async((1,), countdown=0)
        wait_for(lambda: published(client, rd) == [result.id], 15, "a release after the reconnect")


def test_two_releasers_never_publish_a_call_twice(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_release_batch=7)
    ping = task_on(rd)
    with running(rd, longest_sleep=0.05), running(rd, longest_sleep=0.05):
        ids = [ping.apply_async((n,), countdown=(n % 5) / 10).id for n in range(300)]
        wait_for(lambda: len(published(client, rd)) >= 300, 30, "300 releases")
    assert sorted(published(client, rd)) == sorted(ids)


class Worker:
    """Stands for the worker the bootstep is given: all the step reads is its app."""

    def __init__(self, app: Celery) -> None:
        self.app = app


@pytest.mark.parametrize("setting", [None, True], ids=["by-default", "asked"])
def test_the_worker_bootstep_runs_a_releaser_unless_the_setting_is_false(
    make_app: MakeApp, client: redis.Redis, setting: bool | None
) -> None:
    app, rd = make_app(redisdelay_precise_release=setting)
    ping = task_on(rd)
    worker = Worker(app)
    step = PreciseReleaseStep(worker)
    step.start(worker)
    try:
        assert step.thread is not None and step.thread.is_alive()
        result = ping.apply_async((1,), countdown=0.1)
        wait_for(lambda: published(client, rd) == [result.id], 10, "the release by the worker's releaser")
    finally:
        step.stop(worker)
    assert not step.thread.is_alive()

    off_app, _ = make_app(redisdelay_precise_release=False)
    idle = PreciseReleaseStep(Worker(off_app))
    idle.start(Worker(off_app))
    assert idle.thread is None, "off when the setting is False"


def test_the_release_script_says_when_to_look_again(rd: RedisDelay, client: redis.Redis) -> None:
    # The precise releaser sleeps on what the release script answers, instead of asking Redis again.
    ping = task_on(rd)
    releaser = rd.releaser
    lists = releaser.lists
    assert lists is not None
    nothing = rd.store.release(10, 30_000, 60_000, lists)
    assert (nothing.examined, nothing.next_due_ms, nothing.batch_due) == (0, None, False)
    later = ping.apply_async((1,), countdown=3600)
    ping.apply_async((2,), countdown=0)
    released = rd.store.release(10, 30_000, 60_000, lists)
    assert released.pushed == 1
    assert released.next_due_ms == rd.find(later.id).score_ms  # type: ignore[union-attr]
    assert 3590_000 < released.next_due_ms - released.now_ms <= 3600_000  # type: ignore[operator]


def test_a_precise_releaser_flushes_a_batch_group_when_its_wait_is_over(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app()

    @rd.batched(name="tests.precise.batch", size=100, max_wait=0.5)
    def collect(key: str, items: list[Any]) -> None: ...

    with running(rd, longest_sleep=30.0):
        wait_for(lambda: blocked(client), 10, "the releaser to sleep")
        collect.add("k", 1)
        assert rd.stats()["batch_groups"] == 1
        # A new group wakes it, and its next look is when the group's wait is over, not after the 30 s cap.
        wait_for(lambda: published(client, rd), 3, "the batch to be released")
    [call_id] = published(client, rd)
    assert rd.find(call_id).state == "inflight"  # type: ignore[union-attr]


@pytest.mark.parametrize(("chase", "sleeps"), [(True, "until the next call is due"), (False, "a tick")])
def test_a_workers_releaser_sleeps_a_tick_and_a_precise_one_until_the_next_call(
    rd: RedisDelay, chase: bool, sleeps: str
) -> None:
    """By default each worker releases at a tick's pace: it wakes for a marker or each tick, not for every call that
    falls due, which would wake the releaser of every worker for each one (redisdelay_precise_release True chases)."""
    ping = task_on(rd)
    ping.apply_async((1,), countdown=5)
    releaser = PreciseReleaser(rd.releasers, longest_sleep=30.0, chase=chase)
    releaser.release_due()
    wait = releaser.seconds_to_next()
    assert (wait < 6) is chase, f"it sleeps {sleeps}: {wait:.1f} s"
    assert releaser.seconds_to_next() == wait, "from what the release script said, without asking Redis again"


def test_the_worker_step_releases_at_a_ticks_pace_unless_the_setting_is_true(make_app: MakeApp) -> None:
    for setting, chase, sleep in [(None, False, 2.0), (True, True, 1.0)]:
        app, _ = make_app(redisdelay_precise_release=setting, redisdelay_tick_interval=2.0)
        step = PreciseReleaseStep(Worker(app))
        step.start(Worker(app))
        try:
            assert step.releaser is not None
            assert [(r.chase, r.longest_sleep) for r in step.releaser.releasers] == [(chase, sleep)]
        finally:
            step.stop(Worker(app))
