"""The operator's command line, ``celery -A proj redisdelay ...``, and the functions behind it (``admin``).

The commands run in-process through click's ``CliRunner`` against the session's real redis-server (each
test on its own key prefix), a few through ``python -m celery`` as an operator runs them, and the paging
and bulk operations once more on a local 3-master Redis Cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner, Result

from celery_redisdelay import RedisDelay, RedisDelayError
from celery_redisdelay.cli import redisdelay
from celery_redisdelay.operations import admin
from celery_redisdelay.store.keys import group_id
from celery_redisdelay.testing import RedisServer, free_port
from celery_redisdelay.testing.topologies import LocalCluster
from tests.conftest import ROOT

MakeApp = Callable[..., tuple[Celery, RedisDelay]]
HOUR_MS = 3_600_000


# -- helpers ------------------------------------------------------------------------------------


def invoke(rd: RedisDelay, *args: str, input: str | None = None) -> Result:
    """Run ``celery -A <app> redisdelay ARGS`` in this process, as Celery's CLI would (``ctx.obj.app``)."""
    return CliRunner().invoke(redisdelay, list(args), obj=SimpleNamespace(app=rd.app), input=input)


def ok(rd: RedisDelay, *args: str, input: str | None = None) -> Result:
    result = invoke(rd, *args, input=input)
    assert result.exit_code == 0, f"redisdelay {' '.join(args)} exited {result.exit_code}:\n{result.output}"
    return result


def as_json(rd: RedisDelay, *args: str) -> Any:
    return json.loads(ok(rd, *args, "--json").stdout)


def redis_ms(rd: RedisDelay) -> int:
    seconds, micros = rd.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def ago(rd: RedisDelay, seconds: float) -> datetime:
    """An eta ``seconds`` before the Redis server's now."""
    return datetime.fromtimestamp(redis_ms(rd) / 1000, UTC) - timedelta(seconds=seconds)


def task_on(rd: RedisDelay, name: str = "", **options: Any) -> Any:
    @rd.delayed(name=name or f"tests.cli.echo.{uuid.uuid4().hex[:6]}", **options)
    def echo(*args: Any, **kwargs: Any) -> Any:
        return args

    return echo


def park(task: Any, count: int, countdown: float = 600) -> list[str]:
    return [result.id for result in task.park_many([(n,) for n in range(count)], countdown=countdown)]


def spread(rd: RedisDelay, task: Any, count: int) -> list[str]:
    """Park ``count`` calls one by one, homed in each shard in turn, due at five times (so ids break ties)."""
    stores = rd.shards.stores
    return [
        task.apply_async((n,), countdown=600 + n % 5, task_id=rd.shards.new_id(stores[n % len(stores)])).id
        for n in range(count)
    ]


def bury_all(rd: RedisDelay, ids: list[str]) -> None:
    for call_id in ids:
        assert rd.shards.home(call_id).bury(call_id, "buried by the test")


def held(rd: RedisDelay, hash_name: str) -> set[str]:
    """The ids held in one hash (payloads or meta) over all shards."""
    found: set[str] = set()
    for store in rd.shards.all():
        found |= {field.decode() for field in rd.client.hkeys(getattr(store.keys, hash_name))}
    return found


def every_page(rd: RedisDelay, *args: str) -> tuple[list[dict[str, Any]], int]:
    """Follow the cursors of ``list ARGS --json`` to the end: every call listed, and how many pages."""
    calls: list[dict[str, Any]] = []
    cursor: list[str] = []
    for pages in range(1, 1000):
        found = as_json(rd, "list", *args, *cursor)
        calls.extend(found["calls"])
        if found["next_cursor"] is None:
            return calls, pages
        cursor = ["--cursor", found["next_cursor"]]
    raise AssertionError("the cursors never ended")


@pytest.fixture
def make_rd(make_app: MakeApp) -> Callable[..., RedisDelay]:
    def make(**conf: Any) -> RedisDelay:
        return make_app(**conf)[1]

    return make


# -- status ---------------------------------------------------------------------------------------


def test_status_counts_every_state_and_the_oldest_late_calls(rd: RedisDelay) -> None:
    echo = task_on(rd)
    claimed = [echo.apply_async((n,), eta=ago(rd, 120 - n)).id for n in range(3)]
    assert {call.id for call in rd.store.claim(10, 600_000)} == set(claimed)
    overdue = [echo.apply_async((n,), eta=ago(rd, seconds)).id for n, seconds in enumerate((60, 20))]
    park(echo, 3)
    bury_all(rd, park(echo, 2))
    now = redis_ms(rd)
    rd.client.zadd(rd.keys.inflight, {claimed[0]: now - 30_000, claimed[1]: now - 10_000}, xx=True)

    @rd.batched(name=f"tests.cli.bind.{uuid.uuid4().hex[:6]}", size=10, max_wait=600)
    def bind(key: str, items: list[Any]) -> None: ...

    bind.add("area-7", 1)
    bind.add("area-7", 2)

    found = as_json(rd, "status")
    counts = {name: found[name] for name in ("delayed", "due", "inflight", "inflight_expired", "dead")}
    assert counts == {"delayed": 5, "due": 2, "inflight": 3, "inflight_expired": 2, "dead": 2}
    assert (found["shards"], found["batch_groups"], found["batch_items"]) == (1, 1, 2)
    assert found["oldest_overdue"]["id"] == overdue[0]
    assert found["oldest_overdue"]["task"] == echo.name
    assert 60 <= found["oldest_overdue"]["late_seconds"] < 90
    assert found["oldest_expired"]["id"] == claimed[0]
    assert 30 <= found["oldest_expired"]["late_seconds"] < 60
    assert found["memory_bytes_estimate"] > 1000
    # status says what is paused in its own line (``paused``: the pauses), stats counts the calls waiting on them.
    stats = {key: value for key, value in rd.stats().items() if key != "paused"}
    assert {key: value for key, value in found.items() if key in stats} == stats

    table = ok(rd, "status").stdout
    assert "  past deadline   2\n" in table
    assert f"  oldest overdue  {overdue[0]} ({echo.name}), due " in table
    assert "estimate" in table


def test_status_of_an_empty_store(rd: RedisDelay) -> None:
    found = as_json(rd, "status")
    assert found["delayed"] == found["inflight"] == found["dead"] == 0
    assert found["oldest_overdue"] is None and found["oldest_expired"] is None
    assert "  oldest overdue  -\n" in ok(rd, "status").stdout


def test_status_says_who_releases_and_when_nothing_does(make_rd: Callable[..., RedisDelay]) -> None:
    workers = make_rd()
    assert as_json(workers, "status")["releasing"] == {"workers": True, "last_seconds_ago": None, "problem": None}
    assert "\nreleasing         every worker, last release never\n" in ok(workers, "status").stdout

    alone = make_rd(redisdelay_precise_release=False)
    found = as_json(alone, "status")["releasing"]
    assert not found["workers"] and found["last_seconds_ago"] is None
    assert "nothing releases" in found["problem"] and found["problem"] in alone.check_server()
    assert "NOTHING RELEASES" in ok(alone, "status").stdout
    alone.tick()  # beat's tick, say
    found = as_json(alone, "status")["releasing"]
    assert found["problem"] is None and 0 <= found["last_seconds_ago"] < 5
    assert not [problem for problem in alone.check_server() if "nothing releases" in problem]


# -- list -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 3])
def test_list_pages_reach_every_call_exactly_once(make_rd: Callable[..., RedisDelay], shards: int) -> None:
    rd = make_rd(redisdelay_shards=shards)
    echo = task_on(rd)
    ids = spread(rd, echo, 2500)
    sizes = [store.client.zcard(store.keys.delayed) for store in rd.shards.stores]
    assert sizes == [len(range(i, 2500, shards)) for i in range(shards)]

    calls, pages = every_page(rd, "--state", "delayed", "--limit", "1000")

    listed = [call["id"] for call in calls]
    assert pages == 3
    assert len(listed) == len(set(listed)) == 2500
    assert set(listed) == set(ids)
    order = [(call["score_ms"], call["id"]) for call in calls]
    assert order == sorted(order), "oldest first over all shards, across pages"
    assert {call["task"] for call in calls} == {echo.name}
    assert all(
        call["state"] == "delayed" and call["deliveries"] == 0 and call["seconds_from_now"] > 500 for call in calls
    )


def test_list_table_prints_the_next_cursor_and_a_bad_cursor_is_refused(make_rd: Callable[..., RedisDelay]) -> None:
    rd = make_rd(redisdelay_shards=3)
    echo = task_on(rd)
    park(echo, 5)
    first = ok(rd, "list", "--limit", "2").stdout.splitlines()
    assert first[0].split() == ["ID", "TASK", "DUE", "WHEN", "DELIVERIES", "PHASE"]
    assert len(first) == 4 and first[-1].startswith("next page: --cursor ")
    assert all(echo.name in line and "in 9m" in line and "0/10" in line for line in first[1:3])
    cursor = first[-1].split()[-1]
    offsets = [int(offset) for offset in cursor.split(".")]
    assert sum(offsets) == 2 and len(offsets) == len(rd.shards.all()) == 4, "3 shards and the unsharded layout"
    rest = ok(rd, "list", "--limit", "3", "--cursor", cursor).stdout.splitlines()
    assert len(rest) == 4 and "next page" not in rest[-1]

    wrong = invoke(rd, "list", "--cursor", "1.2")
    assert wrong.exit_code == 1 and "has 2 offsets but there are 4 shards to read now" in wrong.output
    garbage = invoke(rd, "list", "--cursor", "x.y.z.w")
    assert garbage.exit_code == 1 and "is not one that list printed" in garbage.output
    assert ok(rd, "list", "--state", "dead").stdout.strip() == "no dead calls"


def test_list_by_task_scans_past_other_tasks_within_bounds(make_rd: Callable[..., RedisDelay]) -> None:
    rd = make_rd(redisdelay_shards=2)
    wanted, other = task_on(rd), task_on(rd)
    mine = []
    for round_ in range(5):
        park(other, 10, countdown=600 + round_)
        mine.append(wanted.apply_async((round_,), countdown=600.5 + round_).id)

    calls, _ = every_page(rd, "--task", wanted.name, "--limit", "2")
    assert [call["id"] for call in calls] == mine

    page = as_json(rd, "list", "--task", wanted.name, "--limit", "5", "--scan", "15")
    assert [call["id"] for call in page["calls"]] == mine[:1]
    assert page["scan_stopped"] and page["scanned"] == 15 and page["next_cursor"] is not None
    table = ok(rd, "list", "--task", wanted.name, "--limit", "5", "--scan", "15").stdout
    assert "stopped after reading 15 entries (--scan)" in table and "next page: --cursor " in table
    calls, _ = every_page(rd, "--task", wanted.name, "--limit", "5", "--scan", "15")
    assert [call["id"] for call in calls] == mine
    assert as_json(rd, "list", "--task", "no.such.task")["calls"] == []


def test_list_of_dead_calls_shows_the_reason(rd: RedisDelay) -> None:
    ids = park(task_on(rd), 2)
    assert rd.store.bury(ids[0], "payload missing at sweep")
    lines = ok(rd, "list", "--state", "dead").stdout.splitlines()
    assert lines[0].split()[-1] == "REASON" and "DEAD SINCE" in lines[0]
    assert ids[0] in lines[1] and lines[1].endswith("payload missing at sweep")
    assert re.search(r"Z  (now|\d+ms ago|\d+s ago) +0/10  dead ", lines[1]), lines[1]
    [call] = as_json(rd, "list", "--state", "dead")["calls"]
    assert (call["id"], call["why"], call["phase"]) == (ids[0], "payload missing at sweep", "dead")


# -- show -----------------------------------------------------------------------------------------


def test_show_a_fast_path_call(rd: RedisDelay) -> None:
    assert rd.fast_release
    call = task_on(rd).apply_async((1, "two"), {"three": [3]}, countdown=300)
    found = as_json(rd, "show", call.id)
    assert (found["state"], found["score_meaning"], found["phase"], found["deliveries"]) == (
        "delayed",
        "due",
        "delayed",
        0,
    )
    assert 250 < found["seconds_from_now"] <= 300
    payload = found["payload"]
    assert payload["format"] == "broker message" and payload["decoded"]
    assert (payload["args"], payload["kwargs"]) == ([1, "two"], {"three": [3]})
    assert found["broker_list"] == rd.app.conf.task_default_queue

    table = ok(rd, "show", call.id).stdout
    assert "payload            broker message" in table
    assert "args               [1, 'two']" in table
    assert "deliveries         0 of 10" in table
    assert "no event log is kept per call" in table


def test_show_a_kombu_path_call_with_its_history(make_rd: Callable[..., RedisDelay]) -> None:
    rd = make_rd(redisdelay_fast_release=False)
    echo = task_on(rd, max_deliveries=3)
    call = echo.apply_async((7,), eta=ago(rd, 1))
    [claimed] = rd.store.claim(10, 600_000)
    assert claimed.id == call.id
    found = as_json(rd, "show", call.id)
    assert (found["state"], found["score_meaning"], found["phase"]) == ("inflight", "deadline", "claimed")
    assert (found["deliveries"], found["max_deliveries"]) == (1, 3)
    assert found["payload"]["format"] == "envelope" and found["payload"]["args"] == [7]
    assert found["payload"]["headers"]["argsrepr"] == "(7,)"

    assert rd.store.bury(call.id, "not acknowledged after 3 deliveries (last seen running)")
    table = ok(rd, "show", call.id).stdout
    assert "dead because       not acknowledged after 3 deliveries" in table
    assert "deliveries         1 of 3" in table and "payload            envelope" in table


def test_show_a_batch(rd: RedisDelay) -> None:
    @rd.batched(name=f"tests.cli.bind.{uuid.uuid4().hex[:6]}", size=2, max_wait=600)
    def bind(key: str, items: list[Any]) -> None: ...

    assert bind.add("area-7", {"parcel": 1}) is None
    call = bind.add("area-7", {"parcel": 2})
    assert call is not None
    found = as_json(rd, "show", call.id)
    payload = found["payload"]
    assert (payload["format"], payload["task"], payload["batch_key"], payload["items"]) == (
        "batch",
        bind.name,
        "area-7",
        2,
    )
    assert payload["args"] == ["area-7", [{"parcel": 1}, {"parcel": 2}]]
    lines = ok(rd, "show", call.id).stdout.splitlines()
    assert [line.split(None, 1) for line in lines if line.startswith("batch ")] == [["batch", "key 'area-7', 2 items"]]


def test_show_decodes_pickle_only_where_accept_content_allows_it(make_app: MakeApp) -> None:
    conf = {"task_serializer": "pickle", "redisdelay_key_prefix": f"test-{uuid.uuid4().hex[:8]}"}
    _, trusting = make_app(accept_content=["pickle", "json"], **conf)
    _, careful = make_app(accept_content=["json"], **conf)  # the same store, a stricter app
    name = f"tests.cli.pickled.{uuid.uuid4().hex[:6]}"
    call = task_on(trusting, name).apply_async((42, ("a", b"b")), countdown=300)
    task_on(careful, name)

    assert admin.describe(trusting.depot, call.id)["payload"]["args"] == (42, ("a", b"b"))  # type: ignore[index]
    refused = as_json(careful, "show", call.id)["payload"]
    assert not refused["decoded"] and refused["note"] == "(pickle; not decoded)" and "args" not in refused
    table = ok(careful, "show", call.id).stdout
    assert "arguments          (pickle; not decoded)" in table
    assert "header argsrepr" in table, "Celery's argsrepr header still says what the arguments were"


def test_show_a_call_without_payload_and_an_unknown_id(rd: RedisDelay) -> None:
    [call_id] = park(task_on(rd), 1)
    rd.client.hdel(rd.keys.payloads, call_id)
    assert as_json(rd, "show", call_id)["payload"] is None
    assert "none stored" in ok(rd, "show", call_id).stdout
    missing = invoke(rd, "show", "no-such-call")
    assert missing.exit_code == 1
    assert "Error: no call no-such-call in the store" in missing.output
    assert missing.exception is None or isinstance(missing.exception, SystemExit)


# -- cancel, requeue, purge -----------------------------------------------------------------------


def test_cancel_and_requeue_one_call(rd: RedisDelay) -> None:
    first, second = park(task_on(rd), 2)
    assert as_json(rd, "cancel", first) == {"cancelled": first}
    again = invoke(rd, "cancel", first)
    assert again.exit_code == 1 and "is not parked" in again.output
    rd.store.bury(second, "by hand")
    assert ok(rd, "requeue", second).stdout.strip() == f"requeued {second}"
    assert invoke(rd, "requeue", second).exit_code == 1
    for wrong in ((), (second, "--all-dead")):
        usage = invoke(rd, "requeue", *wrong)
        assert usage.exit_code == 2 and "give either TASK_ID or --all-dead" in usage.output


def test_requeue_all_dead_in_steps_leaves_calls_without_payload_dead(rd: RedisDelay) -> None:
    ids = park(task_on(rd, max_deliveries=4), 2500)
    bury_all(rd, ids)  # oldest first: ids[0] is the first entry every step sees
    rd.client.hdel(rd.keys.payloads, ids[0])
    for call_id in ids[1:3]:
        meta = json.loads(rd.client.hget(rd.keys.meta, call_id))
        rd.client.hset(rd.keys.meta, call_id, json.dumps({**meta, "d": 4}))

    report = as_json(rd, "requeue", "--all-dead")

    assert report == {"requeued": 2499, "without_payload": 1, "without_payload_ids": [ids[0]]}
    assert [member.decode() for member in rd.client.zrange(rd.keys.dead, 0, -1)] == [ids[0]]
    assert rd.client.zcard(rd.keys.delayed) == 2499
    for call_id in (ids[1], ids[-1]):
        entry = rd.find(call_id)
        assert entry is not None and entry.state == "delayed"
        assert (entry.meta["d"], entry.meta["s"], "why" in entry.meta) == (0, "delayed", False)
    assert rd.stats()["due"] == 2499, "due at once"
    assert "requeued                0\nleft dead (no payload)  1\n" in ok(rd, "requeue", "--all-dead").stdout


def test_requeue_all_dead_over_shards_in_small_steps(make_rd: Callable[..., RedisDelay]) -> None:
    rd = make_rd(redisdelay_shards=3)
    ids = park(task_on(rd), 60)
    bury_all(rd, ids)
    empty = ids[::7]
    for call_id in empty:
        rd.client.hdel(rd.shards.home(call_id).keys.payloads, call_id)
    report = admin.requeue_all_dead(rd.depot, step=4)
    assert (report.requeued, report.without_payload) == (60 - len(empty), len(empty))
    assert set(report.without_payload_ids) == set(empty)
    assert admin.dead_count(rd.depot) == len(empty)
    with pytest.raises(RedisDelayError, match="step must be an integer from 1 to 1000"):
        admin.requeue_all_dead(rd.depot, step=1001)


def test_purge_dead_removes_everything_stored_for_them_and_nothing_else(rd: RedisDelay) -> None:
    echo = task_on(rd)
    kept = park(echo, 10)
    dead = park(echo, 1200)
    keyed = echo.apply_async((0,), countdown=600, unique_key="order:42").id
    bury_all(rd, [*dead, keyed])
    rd.client.hset(rd.keys.index, group_id(echo.name, "order:42"), keyed)  # as if the key still named it
    rd.client.hset(rd.keys.index, group_id(echo.name, "order:43"), kept[0])
    dead.append(keyed)

    refused = invoke(rd, "purge", input="n\n")
    assert refused.exit_code == 1 and "delete 1,201 dead-lettered calls for good?" in refused.output
    assert admin.dead_count(rd.depot) == 1201

    assert ok(rd, "purge", input="y\n").stdout.strip().endswith("purged 1,201 dead-lettered calls")

    assert rd.client.zcard(rd.keys.dead) == 0
    assert held(rd, "payloads") == held(rd, "meta") == set(kept)
    assert {member.decode() for member in rd.client.zrange(rd.keys.delayed, 0, -1)} == set(kept)
    assert rd.client.hgetall(rd.keys.index) == {group_id(echo.name, "order:43").encode(): kept[0].encode()}
    assert as_json(rd, "purge", "-f") == {"purged": 0}
    assert as_json(rd, "purge", "--force") == as_json(rd, "purge", "--yes") == {"purged": 0}
    assert ok(rd, "purge").stdout.strip() == "no dead-lettered calls"


def test_purge_keeps_calls_dead_lettered_after_the_count(make_rd: Callable[..., RedisDelay]) -> None:
    rd = make_rd(redisdelay_shards=2)
    ids = park(task_on(rd), 5)
    bury_all(rd, ids[:3])
    now = admin.server_ms(rd.depot)
    for call_id in ids[3:]:
        store = rd.shards.home(call_id)
        store.bury(call_id, "later")
        store.client.zadd(store.keys.dead, {call_id: now + HOUR_MS}, xx=True)
    assert admin.purge_dead(rd.depot, step=1, before_ms=now) == 3
    assert held(rd, "payloads") == set(ids[3:])


# -- errors and the real command ------------------------------------------------------------------


def test_an_unreachable_redis_is_a_clear_error(make_app: MakeApp) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    _, rd = make_app(redisdelay_url=url, broker_url=url)
    for args in (("status",), ("list", "--state", "dead"), ("show", "some-id"), ("purge", "--force")):
        result = invoke(rd, *args)
        assert result.exit_code == 1, result.output
        assert "Redis is unreachable" in result.output and "Traceback" not in result.output
        assert isinstance(result.exception, SystemExit)


def run_celery(url: str, *args: str, before: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.proj [before...] redisdelay args...`` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.proj", *before, "redisdelay", *args],
        env={**os.environ, "REDISDELAY_TEST_URL": url, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_status_through_the_celery_command(redis_server: RedisServer) -> None:
    completed = run_celery(redis_server.url, "status", "--json")
    assert completed.returncode == 0, completed.stderr
    found = json.loads(completed.stdout)
    assert found["shards"] == 1 and {"delayed", "due", "inflight", "dead", "memory_bytes_estimate"} <= found.keys()
    table = run_celery(redis_server.url, "status")
    assert table.returncode == 0 and "memory" in table.stdout and "(estimate" in table.stdout

    down = run_celery(f"redis://127.0.0.1:{free_port()}", "status")
    assert down.returncode == 1
    assert "Error: celery-redisdelay could not" in down.stderr and "Redis is unreachable" in down.stderr
    assert "Traceback" not in down.stderr


def test_celerys_global_options_quiet_and_the_apps_preload_options(redis_server: RedisServer) -> None:
    quiet = run_celery(redis_server.url, "purge", "--force", before=("--quiet",))
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "", "--quiet prints nothing, as Celery's own commands"
    loud = run_celery(redis_server.url, "purge", "--force", before=("--no-color",))
    assert loud.returncode == 0 and loud.stdout.strip().startswith("purged"), loud.stderr
    # Celery adds the app's preload options to every sub-command, this group among them.
    tenant = run_celery(redis_server.url, "--proj-tenant", "acme", "status", "--json")
    assert tenant.returncode == 0, tenant.stderr
    assert "tests.proj preload option: tenant acme" in tenant.stderr, "the app's preload option reached its receiver"
    assert json.loads(tenant.stdout)["shards"] == 1


def test_quiet_in_process(rd: RedisDelay) -> None:
    result = CliRunner().invoke(redisdelay, ["status"], obj=SimpleNamespace(app=rd.app, quiet=True))
    assert result.exit_code == 0 and result.output == ""


# -- a Redis Cluster ------------------------------------------------------------------------------


def test_the_commands_work_on_a_redis_cluster(
    make_rd: Callable[..., RedisDelay], local_cluster: LocalCluster, redis_server: RedisServer
) -> None:
    rd = make_rd(redisdelay_url=local_cluster.url.replace("redis://", "redis+cluster://"), redisdelay_shards=3)
    echo = task_on(rd)
    ids = park(echo, 1500)
    overdue = echo.apply_async((0,), eta=ago(rd, 30)).id

    found = as_json(rd, "status")
    assert (found["shards"], found["retired_shards"], found["delayed"], found["due"]) == (3, 1, 1501, 1)
    assert found["oldest_overdue"]["id"] == overdue and found["memory_bytes_estimate"] > 0
    calls, pages = every_page(rd, "--limit", "1000")
    assert pages == 2 and sorted(call["id"] for call in calls) == sorted([*ids, overdue])
    assert as_json(rd, "show", ids[0])["payload"]["args"] == [0]

    bury_all(rd, ids[:1200])
    assert as_json(rd, "requeue", "--all-dead")["requeued"] == 1200
    bury_all(rd, ids[:1100])
    assert as_json(rd, "purge", "--force") == {"purged": 1100}
    assert held(rd, "payloads") == set(ids[1100:]) | {overdue}


def test_releaser_refuses_a_shard_it_does_not_have(make_app: MakeApp) -> None:
    _, rd = make_app(redisdelay_shards=2)
    result = invoke(rd, "releaser", "--shard", "0", "--shard", "2")
    assert result.exit_code == 1
    assert "shard indexes must be 0 to 1 (redisdelay_shards is 2), not [0, 2]" in result.output
