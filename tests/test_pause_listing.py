"""The calls waiting on a pause, in the operator's views: ``redisdelay list --state paused`` (its filters and
pages), ``status`` and ``show``, and the dashboard's "Paused" list, tab, overview and call page (escaped, behind its
credentials, without actions in read-only mode); once more in a real browser. Against the session's redis-server."""

from __future__ import annotations

import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from celery import Celery
from flask.testing import FlaskClient
from werkzeug.serving import make_server

from celery_redisdelay import RedisDelay
from celery_redisdelay.store.calls import CallStore
from celery_redisdelay.testing import wait_for
from celery_redisdelay.web import create_app
from tests.test_cli import as_json, every_page, invoke
from tests.test_pause import tasks_of

MakeApp = Callable[..., tuple[Celery, RedisDelay]]
CSRF = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')


# -- helpers ------------------------------------------------------------------------------------------------------


def park_due(task: Any, count: int, *, first: int = 0, task_ids: list[str] | None = None, **options: Any) -> list[str]:
    """Park ``count`` calls already due, in due order (their etas a second apart, in the past), under ``task_ids``
    if given (:meth:`ShardSet.new_id` homes one in a chosen shard)."""
    now = datetime.now(UTC)
    ids: list[str | None] = [*task_ids] if task_ids else [None] * count
    return [
        str(task.apply_async((first + i,), eta=now - timedelta(seconds=count + 1 - i), task_id=ids[i], **options).id)
        for i in range(count)
    ]


def dues_of(rd: RedisDelay, ids: list[str]) -> dict[str, int]:
    """The due time (ms) each parked call has in its shard's delay set now."""
    dues = {}
    for call_id in ids:
        store = rd.shards.home(call_id)
        score = store.client.zscore(store.keys.delayed, call_id)
        assert score is not None, f"{call_id} is not parked"
        dues[call_id] = int(score)
    return dues


def set_aside(rd: RedisDelay, expected: int) -> None:
    """Release until ``expected`` calls wait on pauses (the release moves the due calls of a paused target aside)."""
    wait_for(lambda: rd.tick() is not None and rd.stats()["paused"] == expected, 10, f"{expected} calls set aside")


def ok(rd: RedisDelay, *args: str) -> str:
    result = invoke(rd, *args)
    assert result.exit_code == 0, f"redisdelay {' '.join(args)} exited {result.exit_code}:\n{result.output}"
    return result.stdout


def client_of(rd: RedisDelay, **options: Any) -> FlaskClient:
    return create_app(rd, **options).test_client()


def page(client: FlaskClient, url: str, code: int = 200, **options: Any) -> str:
    response = client.get(url, **options)
    assert response.status_code == code, (url, response.status_code, response.get_data(as_text=True)[:2000])
    return response.get_data(as_text=True)


def ids_on(html: str) -> list[str]:
    return re.findall(r'<tr data-id="([^"]+)"', html)


def cells(html: str, css: str) -> list[str]:
    """The text of the table cells of one class, in the order shown."""
    return re.findall(rf'<td class="{css}">([^<]*)</td>', html)


class Shop(NamedTuple):
    """Two shards; task ``pause.alpha`` paused, with 3 calls set aside (``alpha``); queue ``held`` paused, with 2
    calls of ``pause.beta`` routed to it set aside (``queued``); 1 call of ``pause.beta`` still delayed, due in
    10 minutes (``later``). ``dues``: the due time (ms) each paused call was parked with.

    The first shard holds the queued calls and the earliest alpha call (its paused set: the queue's calls first, by
    name), the second the other two: merged by due time alone, alpha's calls would come out of order."""

    rd: RedisDelay
    alpha: list[str]
    queued: list[str]
    later: str
    held: str
    dues: dict[str, int]


@pytest.fixture
def shop(make_app: MakeApp) -> Shop:
    _, rd = make_app(redisdelay_shards=2)
    alpha, beta = tasks_of(rd)
    held = f"held-{uuid.uuid4().hex[:8]}"
    rd.pause(task="pause.alpha", reason="provider down")
    rd.pause(queue=held)
    stores = rd.shards.stores
    alpha_ids = park_due(alpha, 3, task_ids=[rd.shards.new_id(stores[shard]) for shard in (0, 1, 1)])
    queued = park_due(beta, 2, first=10, queue=held, task_ids=[rd.shards.new_id(stores[0]) for _ in range(2)])
    later = beta.apply_async((99,), countdown=600).id
    dues = dues_of(rd, alpha_ids + queued)
    set_aside(rd, 5)
    return Shop(rd, alpha_ids, queued, later, held, dues)


# -- the command line ---------------------------------------------------------------------------------------------


def test_list_shows_the_paused_calls_with_their_due_time_and_pause(
    shop: Shop,
) -> None:
    rd = shop.rd
    found = as_json(rd, "list", "--state", "paused")
    calls = {call["id"]: call for call in found["calls"]}
    assert set(calls) == set(shop.alpha + shop.queued)
    assert found["state"] == "paused" and found["next_cursor"] is None
    for call_id, call in calls.items():
        assert call["state"] == "paused" and call["phase"] == "paused", call
        assert call["score_ms"] == shop.dues[call_id], "listed at the due time it was parked with"
        assert call["seconds_from_now"] < 0
    assert {calls[i]["paused_on"] for i in shop.alpha} == {"task:pause.alpha"}
    assert {calls[i]["paused_on"] for i in shop.queued} == {f"queue:{shop.held}"}
    assert {calls[i]["queue"] for i in shop.queued} == {shop.held}
    order = [(call["paused_on"], call["score_ms"]) for call in found["calls"]]
    assert order == sorted(order), "by pause, then due time, over both shards"
    assert [call["id"] for call in found["calls"]] == shop.queued + shop.alpha
    newest = as_json(rd, "list", "--state", "paused", "--newest")["calls"]
    assert [call["id"] for call in newest] == (shop.queued + shop.alpha)[::-1]

    table = ok(rd, "list", "--state", "paused").splitlines()
    assert table[0].split() == ["ID", "TASK", "DUE", "WHEN", "DELIVERIES", "PHASE", "PAUSED", "BY"]
    rows = {line.split()[0]: line for line in table[1:]}
    assert set(rows) == set(shop.alpha + shop.queued)
    assert all(rows[i].endswith("paused  task pause.alpha") for i in shop.alpha)
    assert all(rows[i].endswith(f"paused  queue {shop.held}") for i in shop.queued)

    # The delayed list is the delay set's: it says the paused calls are elsewhere.
    delayed = ok(rd, "list")
    assert shop.later in delayed and not any(call_id in delayed for call_id in calls)
    assert "5 calls wait on pauses, not in this list: see --state paused" in delayed
    assert "(of any task or queue)" in ok(rd, "list", "--task", "pause.beta"), "the count is not filtered"
    assert [call["id"] for call in as_json(rd, "list")["calls"]] == [shop.later]


def test_the_filters_of_list_reach_the_paused_calls(
    shop: Shop,
) -> None:
    rd = shop.rd

    def listed(*args: str) -> list[str]:
        return [call["id"] for call in as_json(rd, "list", "--state", "paused", *args)["calls"]]

    assert listed("--task", "pause.alpha") == shop.alpha
    assert sorted(listed("--task", "pause.beta")) == sorted(shop.queued)
    assert sorted(listed("--queue", shop.held)) == sorted(shop.queued)
    assert listed("--queue", rd.app.conf.task_default_queue) == shop.alpha
    assert listed("--search", "11") == [shop.queued[1]], "the arguments of a paused call are searched"
    assert listed("--task", "pause.alpha", "--newest") == shop.alpha[::-1]
    assert listed("--task", "no.such.task") == []
    assert "no paused calls matching task no.such.task" in ok(rd, "list", "--state", "paused", "--task", "no.such.task")


def test_paused_pages_are_bounded_and_reach_every_call_once(make_app: MakeApp, monkeypatch: pytest.MonkeyPatch) -> None:
    _, rd = make_app(redisdelay_shards=3)
    alpha, _ = tasks_of(rd)
    rd.pause(task="pause.alpha")
    ids = park_due(alpha, 40)
    set_aside(rd, 40)
    reads: list[tuple[str, int]] = []
    read = CallStore.read

    def counted(self: CallStore, state: str, offset: int, count: int, **options: Any) -> Any:
        reads.append((state, count))
        return read(self, state, offset, count, **options)

    monkeypatch.setattr(CallStore, "read", counted)
    calls, pages = every_page(rd, "--state", "paused", "--limit", "7")
    assert sorted(call["id"] for call in calls) == sorted(ids) and len(calls) == 40, "each once"
    assert pages == 6, "40 calls, 7 a page"
    assert reads and all(state == "paused" and count <= 7 for state, count in reads), "at most a page per read"


def test_status_counts_the_calls_waiting_on_pauses_as_stats_does(
    shop: Shop,
) -> None:
    rd = shop.rd
    stats = rd.stats()
    found = as_json(rd, "status")
    assert found["paused_calls"] == stats["paused"] == 5
    assert found["delayed"] == stats["delayed"] == 6, "counted among the delayed calls"
    assert found["due"] == stats["due"] == 0, "not among the due ones: no releaser is behind with them"
    assert sorted((one["kind"], one["waiting"]) for one in found["paused"]) == [("queue", 2), ("task", 3)]

    table = ok(rd, "status")
    assert re.search(r"^  held by pauses +5$", table, re.M)
    assert re.search(r"^paused +queue held-\w+ \(2 waiting\); task pause.alpha \(3 waiting\)$", table, re.M)

    rd.resume(task="pause.alpha")
    wait_for(lambda: rd.tick() is not None and as_json(rd, "status")["paused_calls"] == 2, 10, "alpha's calls back")
    assert re.search(r"^  held by pauses +2$", ok(rd, "status"), re.M)


def test_cancel_all_reaches_the_paused_calls_its_filter_matches(shop: Shop) -> None:
    rd = shop.rd
    done = as_json(rd, "cancel", "--all", "--task", "pause.alpha", "--force")
    assert done["done"] == len(shop.alpha)
    assert all(rd.find(call_id) is None for call_id in shop.alpha), "dropped, not left to go out on resume"
    assert all(rd.find(call_id) is not None for call_id in shop.queued), "the other pause's calls are untouched"
    assert rd.stats()["paused"] == len(shop.queued)


def test_show_names_the_pause_a_call_waits_on(
    shop: Shop,
) -> None:
    rd = shop.rd
    shown = ok(rd, "show", shop.alpha[0])
    assert re.search(r"^phase +paused$", shown, re.M)
    assert re.search(r"^paused by +task pause.alpha \(waits in the store until it is resumed\)$", shown, re.M)
    assert as_json(rd, "show", shop.queued[0])["paused_on"] == f"queue:{shop.held}"
    assert as_json(rd, "show", shop.later)["paused_on"] is None
    assert "paused by" not in ok(rd, "show", shop.later)


# -- the dashboard ------------------------------------------------------------------------------------------------


def test_the_dashboard_lists_the_paused_calls_in_their_own_tab(
    shop: Shop,
) -> None:
    rd = shop.rd
    client = client_of(rd)

    listed = page(client, "/calls/paused")
    assert "<h1>Calls waiting on pauses</h1>" in listed
    assert sorted(ids_on(listed)) == sorted(shop.alpha + shop.queued)
    assert re.search(r'href="/calls/paused"[^>]*>Paused <span class="pill">5</span>', listed), "the tab counts them"
    assert listed.count('<span class="phase phase-paused">paused</span>') == 5
    shown = dict(zip(ids_on(listed), cells(listed, "paused-on"), strict=True))
    assert {shown[i] for i in shop.alpha} == {"task pause.alpha"}
    assert {shown[i] for i in shop.queued} == {f"queue {shop.held}"}
    assert "Apply to selected" in listed and 'value="cancel"' in listed, "a bulk cancel reaches paused calls"
    assert 'value="run-now"' not in listed and 'value="reschedule"' not in listed, "these move the delay set only"

    assert ids_on(page(client, "/calls/paused?task=pause.alpha")) == shop.alpha
    assert sorted(ids_on(page(client, f"/calls/paused?queue={shop.held}"))) == sorted(shop.queued)
    assert ids_on(page(client, "/calls/paused?task=pause.alpha&limit=25&order=newest")) == shop.alpha[::-1]

    delayed = page(client, "/calls/delayed")
    assert ids_on(delayed) == [shop.later]
    assert re.search(r'Delayed <span class="pill">1</span>', delayed), "the delayed tab counts its own list"
    assert "5 more calls wait on pauses, not in this list" in delayed

    overview = page(client, "/")
    assert re.search(r"Delayed</span>\s*<span class=\"card-value\">6<", overview)
    assert "0 due now, 5 paused" in overview
    assert f'href="/calls/paused?queue={shop.held}">2</a>' in overview, "each pause links to its calls"
    assert 'href="/calls/paused?task=pause.alpha">3</a>' in overview
    assert 'href="/calls/paused">the calls waiting</a>' in overview, "the banner of every page too"


def test_a_paused_call_page_says_so_and_only_cancel_is_offered(
    shop: Shop,
) -> None:
    rd = shop.rd
    client = client_of(rd)
    call_id = shop.alpha[0]
    shown = page(client, f"/call/{call_id}")
    assert '<span class="state state-paused">Paused</span>' in shown
    assert '<a class="muted back" href="/calls/paused">« all paused calls</a>' in shown
    assert re.search(r'<dd class="paused-on">task pause.alpha <span class="muted">', shown)
    assert re.search(r'<span class="">\([^)]* ago\)</span>', shown), "due, but not late: no releaser is behind"
    assert f"/call/{call_id}/cancel" in shown
    assert f"/call/{call_id}/run-now" not in shown and f"/call/{call_id}/reschedule" not in shown

    csrf = CSRF.search(shown)
    assert csrf is not None
    response = client.post(f"/call/{call_id}/cancel", data={"csrf_token": csrf.group(1), "confirmed": "1"})
    assert response.status_code == 302
    assert rd.find(call_id) is None and rd.stats()["paused"] == 4
    assert call_id not in ids_on(page(client, "/calls/paused"))


def test_the_paused_list_is_read_only_guarded_and_escaped(make_app: MakeApp) -> None:
    _, rd = make_app()
    name = "pause.<b>bold</b>&co"

    @rd.delayed(name=name)
    def odd(n: int) -> int:
        return n

    rd.pause(task=name)
    [call_id] = park_due(odd, 1)
    set_aside(rd, 1)

    listed = page(client_of(rd), "/calls/paused")
    assert ids_on(listed) == [call_id]
    assert "<b>bold</b>" not in listed and "pause.&lt;b&gt;bold&lt;/b&gt;&amp;co" in listed
    assert cells(listed, "paused-on") == ["task pause.&lt;b&gt;bold&lt;/b&gt;&amp;co"]
    assert "<b>bold</b>" not in page(client_of(rd), f"/call/{call_id}")

    read_only = client_of(rd, read_only=True)
    assert ids_on(page(read_only, "/calls/paused")) == [call_id]
    shown = page(read_only, f"/call/{call_id}")
    assert "/cancel" not in shown and "Read-only: this dashboard changes nothing." in shown
    assert read_only.post(f"/call/{call_id}/cancel", data={"confirmed": "1"}).status_code == 403
    assert rd.find(call_id) is not None

    guarded = client_of(rd, auth="ops:s3cret")
    assert guarded.get("/calls/paused").status_code == 401
    assert ids_on(page(guarded, "/calls/paused", auth=("ops", "s3cret"))) == [call_id]


def test_an_unknown_list_is_still_refused(make_app: MakeApp) -> None:
    _, rd = make_app()
    assert "the lists are delayed, limited, paused, inflight, dead" in page(client_of(rd), "/calls/sleeping", 404)
    assert invoke(rd, "list", "--state", "sleeping").exit_code == 2


# -- in a real browser ----------------------------------------------------------------------------------------------

CHROMIUM = os.environ.get("REDISDELAY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


@pytest.fixture
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the test extra has it)")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.mark.e2e
def test_the_paused_calls_in_a_browser(shop: Shop, browser: Any, tmp_path: Path) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    rd = shop.rd
    server = make_server("127.0.0.1", 0, create_app(rd), threaded=True)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        tab = browser.new_page(viewport={"width": 1360, "height": 600})
        tab.set_default_timeout(15_000)
        problems: list[str] = []
        tab.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
        tab.goto(url + "/calls/delayed")
        expect(tab.locator("p.note")).to_contain_text("5 more calls wait on pauses")
        tab.locator("nav.tabs").get_by_role("link", name=re.compile("^Paused")).click()
        expect(tab.locator("h1")).to_have_text("Calls waiting on pauses")
        expect(tab.locator("tr[data-id]")).to_have_count(5)
        expect(tab.locator("tr[data-id] .phase")).to_have_text(["paused"] * 5)
        assert sorted(tab.locator("tr[data-id] td.paused-on").all_inner_texts()) == sorted(
            ["task pause.alpha"] * 3 + [f"queue {shop.held}"] * 2
        )
        tab.screenshot(path=str(tmp_path / "dashboard-paused.png"), full_page=True)
        tab.locator(f'tr[data-id="{shop.alpha[0]}"] td.id a').click()
        expect(tab.locator(".state")).to_have_text("Paused")
        expect(tab.locator("dd.paused-on")).to_contain_text("task pause.alpha")
        expect(tab.locator("form button")).to_have_text(["Find", "Cancel…"])  # the only action on a paused call
        tab.screenshot(path=str(tmp_path / "call-paused.png"), full_page=True)
        assert problems == [], "no script errors, nothing refused by the Content-Security-Policy"
    finally:
        server.shutdown()
        serving.join(timeout=10)
