"""History: every total counted per minute in the same script, read back over the last hour and day,
pruned a few minutes per sweep, and shown by ``status --history``, the dashboard and its JSON."""

from __future__ import annotations

import itertools
import json
import re
import threading
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner

from celery_redisdelay import RedisDelay
from celery_redisdelay.cli import redisdelay
from celery_redisdelay.operations.history import (
    EVENTS,
    KEPT_MINUTES,
    LATENESS_FIELDS,
    lateness_quantile,
    per_bucket,
    read_history,
)
from celery_redisdelay.operations.metrics import snapshot
from celery_redisdelay.store.layout import LATENESS_BOUNDS_MS
from celery_redisdelay.web import create_app

MakeApp = Callable[..., tuple[Celery, RedisDelay]]
#: Fields a minute can hold (history.lua's HISTORY_NAMES): what pruning deletes per minute.
NAMES_PER_MINUTE = len(EVENTS) + len(LATENESS_FIELDS)


def redis_minute(client: redis.Redis) -> int:
    seconds, _ = client.time()
    return int(seconds) // 60


def run_every_kind_of_change(rd: RedisDelay, client: redis.Redis) -> dict[str, int]:
    """Park, release (some late), acknowledge, discard, dead-letter, sweep and cancel calls; returns what the
    counters say happened."""

    @rd.delayed(name=f"tests.history.echo.{uuid.uuid4().hex[:6]}")
    def echo(n: int) -> int:
        return n

    # the last two may be delivered once: past their deadline, they are dead-lettered instead of swept back
    ids = [echo.apply_async((n,), countdown=3600, max_deliveries=1 if n >= 10 else 0).id for n in range(12)]
    seconds, micros = client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    for call_id, late in zip(ids, (0, 0, 0, 7, 7, 300, 300, 300, 4000, 90_000, 0, 0), strict=True):
        client.zadd(rd.shards.home(call_id).keys.delayed, {call_id: now - late})
    assert rd.tick()["released"] == 12
    for call_id in ids[:4]:
        assert rd.shards.first(call_id, lambda store, i=call_id: store.ack(i))
    for call_id, outcome in ((ids[4], "revoked"), (ids[5], "expired")):
        assert rd.shards.first(call_id, lambda store, i=call_id, o=outcome: store.ack(i, o))
    for call_id in ids[8:]:  # past their deadline: two are swept back, two are out of deliveries
        client.zadd(rd.shards.home(call_id).keys.inflight, {call_id: 0})
    assert rd.cancel(echo.apply_async((99,), countdown=3600).id)
    rd.tick()
    return snapshot(rd.depot).totals


def test_every_total_is_counted_in_its_minute_over_all_shards(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app(redisdelay_shards=2)
    first = redis_minute(client)
    totals = run_every_kind_of_change(rd, client)
    last = redis_minute(client)
    history = read_history(rd.depot, 5)
    assert history.totals() == {name: totals[name] for name in EVENTS}
    assert totals["parked"] == 13 and totals["released"] == 14 and totals["acked"] == 4
    assert totals["cancelled"] == 1 and totals["revoked"] == totals["expired"] == 1
    assert totals["dead_lettered"] == 2 and totals["swept"] == 2
    busy = [minute for minute in history.minutes if any(minute.counts.values())]
    assert {minute.start // 60 for minute in busy} <= {first, last}, "counted in the minute it happened"
    assert [m.start // 60 for m in history.minutes] == list(range(last - 4, last + 1)), "every minute, oldest first"
    # Lateness per minute is the counters' histogram, so its quantiles are the exporter's.
    shot = snapshot(rd.depot)
    cumulative = [count for _, count in shot.lateness_buckets]
    per_bucket_counts = [cumulative[0]] + [b - a for a, b in itertools.pairwise(cumulative)]
    for quantile in (0.5, 0.99):
        assert history.lateness_ms(quantile) == lateness_quantile(quantile, per_bucket_counts)
    p99 = history.lateness_ms(0.99)
    assert p99 is not None and p99 == LATENESS_BOUNDS_MS[-1], "the call 90 s late is beyond the last bound"
    assert history.last_release is not None and abs(history.now - history.last_release) < 30


def test_quantiles_interpolate_within_a_bucket_as_prometheus_does() -> None:
    counts = [0] * (len(LATENESS_BOUNDS_MS) + 1)
    assert lateness_quantile(0.5, counts) is None
    counts[0] = 10  # ten calls released within 5 ms
    assert lateness_quantile(0.5, counts) == 2.5
    counts[2] = 10  # and ten between 10 and 25 ms
    assert lateness_quantile(0.5, counts) == 5.0
    assert lateness_quantile(0.75, counts) == 10 + 15 * 0.5
    counts[-1] = 1_000  # the unbounded bucket reports the highest finite bound, as histogram_quantile does
    assert lateness_quantile(0.99, counts) == LATENESS_BOUNDS_MS[-1]


def test_minutes_older_than_a_day_are_forgotten_a_few_per_sweep(rd: RedisDelay, client: redis.Redis) -> None:
    key = rd.store.keys.history
    now = redis_minute(client)
    horizon = now - KEPT_MINUTES  # the newest minute to forget
    old = range(horizon - 24, horizon + 1)
    kept = range(horizon + 1, horizon + 4)
    client.hset(key, mapping={f"{m}:{name}": 1 for m in (*old, *kept) for name in ("parked", "late_le_inf")})
    client.hset(key, "pruned", horizon - 25)
    rd.tick()
    assert int(client.hget(key, "pruned") or 0) == horizon - 15, "ten minutes per sweep, no more"
    assert not client.hexists(key, f"{horizon - 16}:parked") and client.hexists(key, f"{horizon - 14}:parked")
    for _ in range(3):
        rd.tick()
    assert int(client.hget(key, "pruned") or 0) == horizon, "never past the last day"
    left = {field.decode() for field in client.hkeys(key)}
    assert not any(field.split(":")[0] in {str(m) for m in old} for field in left)
    assert {f"{m}:parked" for m in kept} <= left, "the last day is kept"


def test_the_first_sweep_starts_forgetting_a_day_back(rd: RedisDelay, client: redis.Redis) -> None:
    key = rd.store.keys.history
    rd.tick()
    assert abs(int(client.hget(key, "pruned") or 0) - (redis_minute(client) - KEPT_MINUTES)) <= 1
    client.hset(key, "pruned", 0)  # as after a day without a sweep: the next ones catch up, ten minutes each
    rd.tick()
    assert client.hget(key, "pruned") == b"10"


def test_a_day_of_minutes_fits_the_bound(rd: RedisDelay, client: redis.Redis) -> None:
    """The hash holds at most a day of minutes: a minute's fields are forgotten all at once, so the size
    stays under KEPT_MINUTES x the names a minute can hold (plus 'pruned', 'released_at' and the sweep's two cursors,
    'unacked_seen' and 'queued_seen')."""
    key = rd.store.keys.history
    now = redis_minute(client)
    names = [*EVENTS, *LATENESS_FIELDS]
    assert len(names) == NAMES_PER_MINUTE
    client.hset(key, mapping={f"{m}:{name}": 1 for m in range(now - KEPT_MINUTES - 5, now + 1) for name in names})
    client.hset(key, "pruned", now - KEPT_MINUTES - 6)
    rd.tick()
    assert client.hlen(key) <= KEPT_MINUTES * NAMES_PER_MINUTE + 4


def test_a_store_that_never_counted_reads_as_empty(rd: RedisDelay) -> None:
    history = read_history(rd.depot, 3)
    assert len(history.minutes) == 3 and history.last_release is None
    assert set(history.totals().values()) == {0} and history.lateness_ms(0.99) is None
    with pytest.raises(ValueError, match="minutes must be 1 to 1440"):
        read_history(rd.depot, KEPT_MINUTES + 1)


def test_per_bucket_adds_up_consecutive_minutes(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app()
    run_every_kind_of_change(rd, client)
    history = read_history(rd.depot, 25)
    buckets = per_bucket(history.minutes, 10)
    assert [b.start for b in buckets] == [history.minutes[i].start for i in (0, 10, 20)]
    assert sum(b.counts["parked"] for b in buckets) == history.totals()["parked"]


def test_status_history_prints_the_hour_the_day_and_each_minute(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app()
    totals = run_every_kind_of_change(rd, client)
    runner = CliRunner()
    out = runner.invoke(redisdelay, ["status", "--history", "--minutes", "3"], obj=SimpleNamespace(app=rd.app))
    assert out.exit_code == 0, out.output
    hour = re.search(r"^parked\s+(\S+)\s+(\S+)$", out.output, re.M)
    assert hour and hour.groups() == (str(totals["parked"]), str(totals["parked"])), out.output
    assert re.search(r"^lateness p99\s+60,000 ms", out.output, re.M), out.output
    assert "last release:" in out.output and "ago" in out.output
    rows = re.findall(r"^\d\d:\d\d\s", out.output, re.M)
    assert len(rows) == 3, out.output
    plain = runner.invoke(redisdelay, ["status"], obj=SimpleNamespace(app=rd.app))
    assert "last hour" not in plain.output
    found = json.loads(
        runner.invoke(redisdelay, ["status", "--history", "--json"], obj=SimpleNamespace(app=rd.app)).output
    )
    assert found["history"]["totals"] == {name: totals[name] for name in EVENTS}
    assert len(found["history"]["minutes"]) == 15
    bad = runner.invoke(redisdelay, ["status", "--history", "--minutes", "0"], obj=SimpleNamespace(app=rd.app))
    assert bad.exit_code == 2 and "--minutes" in bad.output


def test_the_dashboard_draws_and_serves_the_history(make_app: MakeApp, client: redis.Redis) -> None:
    _, rd = make_app()
    totals = run_every_kind_of_change(rd, client)
    web = create_app(rd).test_client()
    page = web.get("/").get_data(as_text=True)
    assert 'id="history"' in page and "last hour, per minute" in page
    assert page.count('<polyline class="line') == 9, "4 flow lines, 3 trouble lines, p50 and p99"
    assert f'data-summary="parked">{totals["parked"]}<' in page
    fragment = web.get("/history?window=24h")
    assert fragment.status_code == 200
    html = fragment.get_data(as_text=True)
    assert "{#" not in html and 'id="history"' in html and "per 10 minutes" in html
    assert 'data-refresh="/history?window=24h"' in html
    api = web.get("/api/history?minutes=7").get_json()
    assert len(api["minutes"]) == 7 and api["totals"] == {name: totals[name] for name in EVENTS}
    assert api["lateness_ms"]["p99"] == LATENESS_BOUNDS_MS[-1]
    for bad in ("/api/history?minutes=0", "/api/history?minutes=1441", "/api/history?minutes=x", "/?window=2h"):
        assert web.get(bad).status_code == 400, bad


def test_every_script_counts_in_the_same_step_as_its_change(make_app: MakeApp, client: redis.Redis) -> None:
    """No history write of its own: the park, the release and the ack each count inside their one script."""
    _, rd = make_app()

    @rd.delayed(name=f"tests.history.one.{uuid.uuid4().hex[:6]}")
    def one() -> None:
        pass

    history_key = rd.store.keys.history
    seen: list[dict[str, Any]] = []
    done = f"done-{uuid.uuid4().hex}"
    with client.monitor() as monitor:
        reader = threading.Thread(target=lambda: seen.extend(_until(monitor, done)), daemon=True)
        reader.start()
        call = one.apply_async(countdown=0.001)
        rd.tick()
        assert rd.shards.first(call.id, lambda store: store.ack(call.id))
        client.echo(done)
        reader.join(30)
    on_history = [entry for entry in seen if _writes(entry["command"], history_key)]
    assert on_history, "the scripts count in the history"
    assert {entry["client_type"] for entry in on_history} == {"lua"}, "only scripts write it"
    counted = " ".join(entry["command"] for entry in on_history)
    assert ":parked 1" in counted and ":released 1" in counted and ":acked 1" in counted
    assert read_history(rd.depot, 2).totals()["acked"] == 1


def _writes(command: str, key: str) -> bool:
    words = command.split(" ")
    return words[0].upper() in {"HINCRBY", "HSET", "HSETNX", "HDEL"} and words[1:2] == [key]


def _until(monitor: Any, marker: str) -> list[dict[str, Any]]:
    seen = []
    for entry in monitor.listen():
        if marker in entry["command"]:
            return seen
        seen.append(entry)
    return seen  # pragma: no cover - the connection closed
