"""The operator's actions on many calls (``operations``, the bulk scripts, ``rd.cancel_many``), the
paginator's filters and orders (``listing``), and the command-line verbs built on them, against the
session's real redis-server, on one shard and on three."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_redisdelay import RedisDelay
from celery_redisdelay.cli import redisdelay
from celery_redisdelay.operations import admin
from celery_redisdelay.operations.actions import act_on, act_on_matching
from celery_redisdelay.operations.listing import Filter
from celery_redisdelay.store.calls import CallStore
from celery_redisdelay.testing import RedisServer

MakeApp = Callable[..., tuple[Celery, RedisDelay]]


def tasks(rd: RedisDelay, count: int = 2) -> list[Any]:
    made = []
    for _ in range(count):

        @rd.delayed(name=f"tests.ops.t{uuid.uuid4().hex[:6]}")
        def echo(*args: Any, **kwargs: Any) -> Any:
            return args

        made.append(echo)
    return made


def interleave(rd: RedisDelay, first: Any, second: Any, count: int) -> tuple[list[str], list[str]]:
    """``count`` calls, every third one of ``second``, each due a second after the one before and homed in
    each shard in turn; the ids of each task's calls."""
    stores = rd.shards.stores
    ids: tuple[list[str], list[str]] = ([], [])
    for n in range(count):
        task, mine = (second, ids[1]) if n % 3 == 2 else (first, ids[0])
        home = rd.shards.new_id(stores[n % len(stores)])
        mine.append(task.apply_async((n, f"order-{n}"), countdown=600 + n, task_id=home).id)
    return ids


def scores(rd: RedisDelay, ids: list[str]) -> list[float | None]:
    return [entry.score_ms if (entry := rd.find(call_id)) else None for call_id in ids]


@pytest.fixture
def three(make_app: MakeApp, redis_server: RedisServer) -> RedisDelay:
    return make_app(redisdelay_shards=3, result_backend=f"{redis_server.url}/1")[1]


# -- the bulk scripts -------------------------------------------------------------------------------


def test_bulk_scripts_change_only_calls_in_their_state(rd: RedisDelay) -> None:
    [echo] = tasks(rd, 1)
    parked = [echo.apply_async((n,), countdown=600).id for n in range(4)]
    dead = [echo.apply_async((n,), countdown=600).id for n in range(3)]
    for call_id in dead:
        assert rd.store.bury(call_id, "buried by the test")
    rd.client.hdel(rd.keys.payloads, dead[2])
    store = rd.store

    payload = rd.client.hget(rd.keys.payloads, parked[0])
    assert store.cancel_many([parked[0], dead[0], "unknown"]) == [(parked[0], payload, True)]
    due, moved = store.reschedule_many([parked[1], dead[0]], countdown_ms=0)
    assert moved == [parked[1]] and scores(rd, [parked[1]]) == [due]
    assert store.requeue_many([dead[0], dead[2], parked[2]]) == ([dead[0]], [dead[2]])
    assert store.purge_many([dead[1], parked[2]]) == [dead[1]]
    assert [rd.find(i) is None for i in (parked[0], dead[1])] == [True, True]
    assert not rd.client.hexists(rd.keys.payloads, parked[0]), "a cancel drops the payload too"
    assert rd.find(dead[0]).state == "delayed"  # type: ignore[union-attr]
    for wrong in ([], [f"id-{n}" for n in range(1001)]):
        with pytest.raises(ValueError, match="1 to 1000 ids"):
            store.cancel_many(wrong)


@pytest.mark.parametrize("how", ["rd.reschedule", "rd.requeue", "run-now", "requeue"])
def test_a_call_made_due_before_every_other_wakes_the_precise_releaser(rd: RedisDelay, how: str) -> None:
    [echo] = tasks(rd, 1)
    later = echo.apply_async((1,), countdown=600).id
    moved = echo.apply_async((2,), countdown=900).id
    if how in ("rd.requeue", "requeue"):
        assert rd.store.bury(moved, "buried by the test")
    rd.client.delete(rd.keys.wake)
    if how == "rd.reschedule":
        assert rd.reschedule(moved, countdown=0) is not None
    elif how == "rd.requeue":
        assert rd.requeue(moved)
    else:
        done, refused = act_on(rd.depot, how, [moved])
        assert (done, refused) == ([moved], [])
    assert rd.client.zrange(rd.keys.wake, 0, -1) == [moved.encode()], "a releaser asleep until the other call"
    assert rd.find(later).state == "delayed"  # type: ignore[union-attr]


def test_a_selection_is_found_in_any_shard_and_cancelled_calls_are_revoked(
    make_app: MakeApp, redis_server: RedisServer
) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    backend = f"{redis_server.url}/1"
    _, before = make_app(redisdelay_key_prefix=prefix, result_backend=backend)
    [old_task] = tasks(before, 1)
    old = [old_task.apply_async((n,), countdown=600).id for n in range(5)]
    _, rd = make_app(redisdelay_key_prefix=prefix, redisdelay_shards=3, result_backend=backend)
    [echo] = tasks(rd, 1)
    new = [echo.apply_async((n,), countdown=600).id for n in range(5)]

    cancelled = rd.cancel_many([*old[:3], *new[:3], "unknown"])
    assert sorted(cancelled) == sorted([*old[:3], *new[:3]]), "calls parked under the old shard count too"
    assert {rd.app.AsyncResult(call_id).state for call_id in cancelled} == {"REVOKED"}
    assert rd.app.AsyncResult(new[4]).state == "PENDING"
    assert rd.stats()["delayed"] == 4


# -- everything matching a filter -------------------------------------------------------------------


@pytest.mark.parametrize("newest_first", [False, True])
def test_cancel_matching_takes_every_match_in_small_steps_and_nothing_else(
    three: RedisDelay, newest_first: bool
) -> None:
    first, second = tasks(three)
    keep, drop = interleave(three, first, second, 60)

    report = act_on_matching(three.depot, "cancel", Filter(task=second.name), newest_first=newest_first, step=4, scan=9)
    assert (report.done, report.stopped) == (len(drop), None)
    assert report.steps >= len(drop) // 4 and report.scanned >= 60
    assert all(score is None for score in scores(three, drop))
    assert all(score is not None for score in scores(three, keep))
    assert {three.app.AsyncResult(call_id).state for call_id in drop} == {"REVOKED"}


@pytest.mark.parametrize(("newest_first", "later"), [(False, True), (True, True), (False, False), (True, False)])
def test_reschedule_matching_moves_each_match_once_wherever_it_lands(
    three: RedisDelay, newest_first: bool, later: bool
) -> None:
    first, second = tasks(three)
    keep, move = interleave(three, first, second, 45)
    kept = scores(three, keep)
    countdown_ms = 3_600_000 if later else 630_000  # after every call, or among them

    report = act_on_matching(
        three.depot,
        "reschedule",
        Filter(task=second.name),
        countdown_ms=countdown_ms,
        newest_first=newest_first,
        step=2,
    )
    assert report.done == len(move), "each call once, none skipped"
    assert len(set(scores(three, move))) == 1
    assert scores(three, keep) == kept

    now = act_on_matching(three.depot, "run-now", Filter(search="order-1"), step=3)  # order-1, order-10..19
    assert now.done == 11
    assert report.as_dict()["action"] == "reschedule" and now.as_dict()["action"] == "run-now"


def test_requeue_and_purge_matching_leave_calls_without_payload_and_other_tasks(three: RedisDelay) -> None:
    first, second = tasks(three)
    keep, dead = interleave(three, first, second, 30)
    for call_id in keep + dead:
        assert three.shards.home(call_id).bury(call_id, "buried by the test")
    three.client.hdel(three.shards.home(dead[0]).keys.payloads, dead[0])

    report = act_on_matching(three.depot, "requeue", Filter(task=second.name), step=3)
    assert (report.done, report.refused, report.refused_ids) == (len(dead) - 1, 1, [dead[0]])
    assert act_on_matching(three.depot, "purge", Filter(task=first.name), step=5).done == len(keep)
    assert (three.stats()["delayed"], three.stats()["dead"]) == (len(dead) - 1, 1)


def test_a_bulk_action_stops_after_most_calls_and_says_so(rd: RedisDelay) -> None:
    [echo] = tasks(rd, 1)
    echo.park_many([(n,) for n in range(25)], countdown=600)
    report = act_on_matching(rd.depot, "cancel", Filter(), step=10, most=10)
    assert (report.done, rd.stats()["delayed"]) == (10, 15)
    assert report.stopped is not None and "run it again" in report.stopped
    assert act_on(rd.depot, "purge", ["unknown"]) == ([], [])


# -- pages: orders and filters ----------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["one shard", "three shards"])
def test_dead_letters_pages_in_order_reading_a_bounded_step(
    request: pytest.FixtureRequest, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target: RedisDelay = request.getfixturevalue("rd" if layout == "one shard" else "three")
    [echo] = tasks(target, 1)
    ids = [echo.apply_async((n,), countdown=600).id for n in range(12)]
    for call_id in ids:
        assert target.shards.home(call_id).bury(call_id, "buried by the test")
    oldest_first = [entry.id for entry in target.dead_letters(100)]
    assert sorted(oldest_first) == sorted(ids)
    reads: list[int] = []
    read = CallStore.read

    def counted(store: CallStore, state: str, offset: int, count: int, **options: Any) -> Any:
        reads.append(count)
        return read(store, state, offset, count, **options)

    monkeypatch.setattr(CallStore, "read", counted)
    assert [entry.id for entry in target.dead_letters(4, 5)] == oldest_first[5:9]
    assert [entry.id for entry in target.dead_letters(4, 10)] == oldest_first[10:]
    assert max(reads) <= (4 if layout == "one shard" else 14), "a page reads what it shows, not the whole set"


def test_pages_newest_first_by_queue_and_by_arguments(make_app: MakeApp) -> None:
    _, rd = make_app(redisdelay_shards=2)
    first, second = tasks(rd)
    ids = [first.apply_async((n, f"order-{n}"), countdown=600 + n).id for n in range(6)]
    routed = second.apply_async(kwargs={"note": "Refund ORDER-9"}, countdown=601.5, queue="billing").id

    newest = admin.page(rd.depot, "delayed", newest_first=True, limit=4)
    assert [entry.id for entry in newest.calls] == [ids[5], ids[4], ids[3], ids[2]] and newest.order == "newest"
    rest = admin.page(rd.depot, "delayed", newest_first=True, limit=4, cursor=newest.next_cursor)
    assert [entry.id for entry in rest.calls] == [routed, ids[1], ids[0]] and rest.next_cursor is None

    billing = admin.page(rd.depot, "delayed", queue="billing")
    assert [(entry.id, entry.queue) for entry in billing.calls] == [(routed, "billing")]
    default = rd.app.conf.task_default_queue
    assert {entry.queue for entry in admin.page(rd.depot, "delayed", task=first.name).calls} == {default}
    found = admin.page(rd.depot, "delayed", search="order-9")
    assert [entry.id for entry in found.calls] == [routed], "any case, in kwargs too"
    assert [entry.id for entry in admin.page(rd.depot, "delayed", search='"order-3"').calls] == [ids[3]]

    stopped = admin.page(rd.depot, "delayed", search="nowhere", scan=3, limit=2)
    assert stopped.scan_stopped and stopped.scanned == 3 and stopped.calls == []
    assert admin.page(rd.depot, "delayed", queue="billing", task=first.name).calls == []


# -- the command line -------------------------------------------------------------------------------


def cli(rd: RedisDelay, *args: str, code: int = 0, input: str | None = None) -> str:
    result = CliRunner().invoke(redisdelay, list(args), obj=SimpleNamespace(app=rd.app), input=input)
    assert result.exit_code == code, result.output
    return result.output


def test_cli_reschedule_run_now_and_cancel_one_call_or_every_match(rd: RedisDelay) -> None:
    first, second = tasks(rd)
    ids = [first.apply_async((n,), countdown=600).id for n in range(3)]
    others = [second.apply_async((n,), countdown=600).id for n in range(4)]

    assert cli(rd, "reschedule", ids[0], "--countdown", "7200").strip() == f"rescheduled {ids[0]}"
    assert json.loads(cli(rd, "run-now", ids[1], "--json")) == {"due_now": ids[1]}
    due = scores(rd, ids)
    assert due[0] > due[2] > due[1]  # type: ignore[operator]
    assert "is not parked" in cli(rd, "run-now", "unknown", code=1)
    assert "give either --countdown or --eta" in cli(rd, "reschedule", ids[0], code=2)
    assert "go with --all" in cli(rd, "cancel", ids[0], "--task", first.name, code=2)

    moved = json.loads(
        cli(rd, "reschedule", "--all", "--task", second.name, "--eta", "2099-01-01T00:00:00Z", "--yes", "--json")
    )
    assert moved["done"] == 4 and moved["stopped"] is None
    assert set(scores(rd, others)) == {4070908800000}
    refused = cli(rd, "cancel", "--all", "--task", second.name, input="n\n", code=1)
    assert "cancel every parked call matching task " in refused and rd.stats()["delayed"] == 7
    assert cli(rd, "cancel", "--all", "--task", second.name, input="y\n").splitlines()[-2].split() == ["cancelled", "4"]
    assert cli(rd, "cancel", ids[2]).strip() == f"cancelled {ids[2]}"
    assert json.loads(cli(rd, "run-now", "--all", "--yes", "--json"))["done"] == 2
    assert rd.stats()["due"] == 2
