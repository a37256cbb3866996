"""The dashboard in a real browser: Debian's chromium, headless, driven by Playwright, against
``celery -A tests.web_proj redisdelay web`` on the session's redis-server.

It parks a shop's calls, opens the overview, filters the delayed list, cancels one call, reschedules
another, runs two more now from a selection, and checks each change in Redis. It takes the README's
screenshots; with ``REDISDELAY_SCREENSHOTS=docs`` it writes them to ``docs/`` (else to a temporary
folder). Skipped, saying why, where chromium or Playwright is missing (``.ci/run`` installs chromium
where apt works).
"""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_redisdelay import RedisDelay
from celery_redisdelay.operations.history import read_history
from celery_redisdelay.testing import RedisServer, free_port, wait_for
from tests.conftest import ROOT
from tests.web_proj import shop_tasks

MakeApp = Callable[..., tuple[Celery, RedisDelay]]
CHROMIUM = os.environ.get("REDISDELAY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Without these a headless chromium on a machine without network stalls on first-run work.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1360, "height": 600}  # screenshots take the whole page, however long

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the test extra has it)")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason=f"no chromium at {CHROMIUM} (apt-get install chromium; .ci/run does where apt works)",
    ),
]


class Dashboard:
    """``celery -A tests.web_proj redisdelay web`` on a free port, stopped by PID."""

    def __init__(self, server: RedisServer, prefix: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "REDISDELAY_TEST_URL": server.url, "REDISDELAY_WEB_PREFIX": prefix}
        env["PYTHONPATH"] = str(ROOT)
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.web_proj",
            "redisdelay",
            "web",
            "--port",
            str(self.port),
        ]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=5) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError):
            return False

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            output, _ = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            output, _ = self.process.communicate()
        return output


@pytest.fixture
def shop(make_app: MakeApp, redis_server: RedisServer) -> Iterator[tuple[RedisDelay, dict[str, Any], Dashboard]]:
    prefix = f"web-{uuid.uuid4().hex[:8]}"
    _, rd = make_app(redisdelay_key_prefix=prefix, result_backend=f"{redis_server.url}/1", task_default_queue="celery")
    web = Dashboard(redis_server, prefix)
    try:
        wait_for(web.answers, 60, "the dashboard to answer")
        yield rd, shop_tasks(rd), web
    finally:
        print(web.stop())


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


def park_a_day_of_work(rd: RedisDelay, tasks: dict[str, Any]) -> dict[str, list[str]]:
    """What a shop has parked on a given day, the same every run: invoices mostly due within the hour
    (three already overdue), order updates over the day (one deferred behind its busy lock), reminders
    over three days; two calls in flight, two dead, and a batch of parcels filling up."""
    draw = random.Random(16)
    ids: dict[str, list[str]] = {"invoice": [], "order": [], "reminder": []}
    for n in range(240):
        amount = round(draw.uniform(5, 900), 2)
        call = tasks["invoice"].apply_async((1000 + n,), {"amount": amount}, countdown=draw.expovariate(1 / 2400))
        ids["invoice"].append(call.id)
    for n in range(120):
        call = tasks["order"].apply_async(
            (5000 + n, draw.choice(["paid", "shipped"])), countdown=draw.uniform(60, 86400)
        )
        ids["order"].append(call.id)
    for n in range(60):
        call = tasks["reminder"].apply_async((n, "cart-abandoned"), countdown=draw.uniform(600, 3 * 86400))
        ids["reminder"].append(call.id)
    for n in range(2):
        rd.reschedule(ids["invoice"][n], countdown=0)
    in_flight = rd.store.claim(2, 600_000)
    assert len(in_flight) == 2
    assert rd.store.lease("worker1@shop-7", 30_000, [(call.id, "") for call in in_flight], 2) == []  # a worker has them
    # An order update deferred behind its order's lock, held elsewhere.
    assert rd.lock("order:5003", timeout=3600).acquire(blocking=False)
    rd.reschedule(ids["order"][3], countdown=0)
    assert [call.id for call in rd.store.claim(1, 600_000)] == [ids["order"][3]]
    assert rd.store.lock_take("order:5003", "token", 60_000, ids["order"][3], 1_800_000)[0] == 0
    for call_id in ids["reminder"][-2:]:
        assert rd.store.bury(call_id, "not acknowledged after 10 deliveries (last seen running)")
    for n in range(7):
        tasks["truck"].add("area-7", {"parcel": 9000 + n})
    for n in range(2, 5):
        rd.reschedule(ids["invoice"][n], eta=datetime.now(UTC) - timedelta(seconds=40 + n))  # the tick is behind
    return ids


def open_page(browser: Any) -> tuple[Any, list[str]]:
    """A new page, and the list its script errors and failed loads are written to."""
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(15_000)
    problems: list[str] = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    # A request the browser gave up itself, when the page went on to the next one first (the favicon, on a busy
    # machine), is no failure of the dashboard's.
    page.on(
        "requestfailed",
        lambda request: (
            None
            if request.failure == "net::ERR_ABORTED"
            else problems.append(f"failed: {request.url} ({request.failure})")
        ),
    )
    return page, problems


def screenshots(tmp_path: Path) -> Path:
    if os.environ.get("REDISDELAY_SCREENSHOTS") == "docs":
        (ROOT / "docs").mkdir(exist_ok=True)
        return ROOT / "docs"
    return tmp_path


def test_filter_cancel_reschedule_and_run_now_in_a_browser(
    shop: tuple[RedisDelay, dict[str, Any], Dashboard], browser: Any, tmp_path: Path
) -> None:
    rd, tasks, web = shop
    ids = park_a_day_of_work(rd, tasks)
    expect = sync_api.expect
    shots = screenshots(tmp_path)
    page, problems = open_page(browser)

    page.goto(web.url + "/")
    expect(page.locator(".card").first).to_contain_text("416")
    expect(page.locator("svg.chart")).to_have_count(6)  # three of the parked calls, three of the history
    expect(page.locator("dd .worker")).to_have_text(["worker1@shop-7"])  # the worker holding the calls in flight
    page.screenshot(path=str(shots / "dashboard.png"), full_page=True)

    # Filter the delayed list by task: the URL says so, and every row is a reminder.
    page.locator("nav.tabs").get_by_role("link", name=re.compile("^Delayed")).click()
    page.get_by_label("Task").fill("mail.tasks.send_reminder")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"/calls/delayed\?task=mail\.tasks\.send_reminder$"))
    rows = page.locator("table.calls tbody tr")
    expect(rows).to_have_count(50)
    expect(page.get_by_role("link", name="Next page")).to_have_attribute("href", re.compile("task=mail.tasks"))
    assert set(page.locator("table.calls td.task").all_inner_texts()) == {"mail.tasks.send_reminder"}

    # Cancel the first one: its row's button, then the confirmation.
    doomed = rows.first.get_attribute("data-id")
    rows.first.get_by_role("button", name="Cancel").click()
    expect(page.locator("h1")).to_have_text("Are you sure?")
    page.get_by_role("button", name="Yes, do it").click()
    expect(page.locator(".flash-done")).to_contain_text(f"Call {doomed} cancelled")
    assert rd.find(doomed) is None
    assert rd.app.AsyncResult(doomed).state == "REVOKED"

    # Reschedule an invoice from its page: three hours from now.
    invoice = ids["invoice"][10]
    page.locator("form.find input").fill(invoice)
    page.locator("form.find button").click()
    expect(page.locator("h1")).to_contain_text(invoice)
    page.get_by_label("Delay").fill("3")
    page.get_by_label("Unit").select_option("h")
    before = rd.client.time()
    page.get_by_role("button", name="Reschedule").click()
    expect(page.locator(".flash-done")).to_contain_text("rescheduled to 3 h from now")
    entry = rd.find(invoice)
    assert entry is not None and entry.state == "delayed"
    assert entry.score_ms >= (int(before[0]) + 3 * 3600) * 1000

    # Run two orders now from a selection of the newest-first list.
    page.goto(web.url + "/calls/delayed?task=orders.tasks.update_order&order=newest&limit=25")
    chosen = [page.locator("table.calls tbody tr").nth(n).get_attribute("data-id") for n in (0, 1)]
    for call_id in chosen:
        page.locator(f'tr[data-id="{call_id}"] input[name="ids"]').check()
    expect(page.get_by_role("button", name="Apply to 2 selected")).to_be_enabled()
    page.screenshot(path=str(shots / "dashboard-list.png"), full_page=True)
    page.get_by_role("button", name="Apply to 2 selected").click()
    page.get_by_role("button", name="Yes, do it").click()
    expect(page.locator(".flash-done")).to_contain_text("2 of 2 selected calls made due now")
    now_ms = int(rd.client.time()[0]) * 1000 + 1000
    assert all((found := rd.find(call_id)) is not None and found.score_ms <= now_ms for call_id in chosen)
    assert problems == [], "no script errors, nothing refused by the Content-Security-Policy, no failed load"


def plant_an_hour_of_history(rd: RedisDelay) -> int:
    """The history's last hour before this minute, as the scripts would have counted it (a test cannot wait an
    hour): a busy shop with a lunchtime peak, a few redeliveries and one slow tick. Returns the minutes' parked
    total; this minute is counted by the real scripts."""
    draw = random.Random(25)
    now = int(rd.client.time()[0]) // 60
    fields: dict[str, int] = {}
    parked = 0
    for back in range(59, 0, -1):
        minute = now - back
        rate = 40 + 30 * math.sin(back / 9) ** 2 + draw.randint(0, 12)
        slow = back in (21, 22)
        counts = {
            "parked": int(rate),
            "released": int(rate * draw.uniform(0.9, 1.1)),
            "acked": int(rate * draw.uniform(0.88, 1.05)),
            "swept": draw.choice([0, 0, 0, 1, 2]) + (9 if slow else 0),
            "cancelled": draw.choice([0, 0, 1]),
            "late_le_10": int(rate * 0.3),
            "late_le_25": int(rate * 0.5),
            "late_le_100": int(rate * 0.18),
            "late_le_1000" if not slow else "late_le_2500": max(1, int(rate * 0.02)) + (6 if slow else 0),
        }
        parked += counts["parked"]
        fields.update({f"{minute}:{name}": value for name, value in counts.items() if value})
    rd.client.hset(rd.store.keys.history, mapping=fields)
    rd.client.hsetnx(rd.store.keys.history, "pruned", now - 1441)
    return parked


def test_the_history_charts_follow_what_happens_without_a_reload(
    shop: tuple[RedisDelay, dict[str, Any], Dashboard], browser: Any, tmp_path: Path
) -> None:
    rd, tasks, web = shop
    planted = plant_an_hour_of_history(rd)
    # This minute, by the real scripts: invoices parked, released by a tick and acknowledged as a worker would.
    sent = [tasks["invoice"].apply_async((n,), {"amount": 9.5}, countdown=0.001).id for n in range(50)]
    wait_for(lambda: rd.tick()["released"] > 0 and rd.store.stats()["delayed"] == 0, 30, "the invoices to be released")
    for call_id in sent[:45]:
        assert rd.store.ack(call_id)
    expect = sync_api.expect
    page, problems = open_page(browser)

    page.goto(web.url + "/")
    history = page.locator("#history")
    expect(history.locator("h2")).to_have_text("What happened: last hour, per minute")
    expect(history.locator("svg.chart")).to_have_count(3)
    expect(history.locator("polyline.line")).to_have_count(9)  # 4 flow lines, 3 trouble lines, p50 and p99
    legend = history.locator('[data-summary="parked"]').first

    def legend_shows(window: int) -> bool:
        # Read again on each look: a minute that rolls over between the page's read and this one moves the window
        # (a CI run saw the page's 3,582 against 3,534 read a moment later); the page's next fetch follows it.
        return legend.inner_text() == f"{read_history(rd.depot, window).totals()['parked']:,}"

    wait_for(lambda: legend_shows(60), 30, "the page to show the hour's parked calls")
    parked = read_history(rd.depot, 60).totals()["parked"]
    assert parked >= planted + 50 - 100, "the planted hour (less a minute, if one rolled over), and this minute's calls"
    for chart in history.locator("svg.chart").all():
        width, height = (float(n) for n in (chart.get_attribute("viewBox") or "").split()[2:])
        for line in chart.locator("polyline.line").all():
            points = [tuple(map(float, p.split(","))) for p in (line.get_attribute("points") or "").split()]
            assert len(points) >= 59, "a point per minute"
            assert all(0 <= x <= width and 0 <= y <= height for x, y in points), "drawn inside its chart"
    history.scroll_into_view_if_needed()
    history.screenshot(path=str(screenshots(tmp_path) / "history.png"))

    # Work done elsewhere shows up without a reload: the page fetches the section again.
    page.evaluate("window.notReloaded = true")
    for n in range(25):
        tasks["invoice"].apply_async((7000 + n,), {"amount": 1.0}, countdown=600)
    shown = page.locator('#history [data-summary="parked"]').first
    wait_for(
        lambda: shown.inner_text() == f"{read_history(rd.depot, 60).totals()['parked']:,}" != f"{parked:,}",
        30,
        "the page to show the 25 calls parked since it loaded",
    )
    assert page.evaluate("window.notReloaded") is True

    page.locator("#history nav.switch").get_by_role("link", name="24h").click()
    expect(page).to_have_url(re.compile(r"/\?window=24h$"))
    expect(page.locator("#history h2")).to_have_text("What happened: last 24 hours, per 10 minutes")
    wait_for(lambda: legend_shows(1440), 30, "the page to show the day's parked calls")
    assert problems == [], "no script errors, nothing refused by the Content-Security-Policy, no failed load"


def test_the_overview_shows_what_each_limit_holds(
    shop: tuple[RedisDelay, dict[str, Any], Dashboard], browser: Any, tmp_path: Path
) -> None:
    rd, _, web = shop

    @rd.delayed(name="crm.tasks.sync_account", limit_rate="30/m", limit_concurrency=2, limit_key="account:{account}")
    def sync_account(account: int) -> None: ...

    for account in (7, 7, 7, 9, 9, 9):
        sync_account.delay(account)
    wait_for(lambda: rd.tick() and rd.stats()["limited"] == 4, 10, "four calls held by the limit")
    expect = sync_api.expect
    page, problems = open_page(browser)
    page.goto(web.url + "/")
    expect(page.locator(".card").first).to_contain_text("4 held by limits")
    panel = page.locator("section:has(h2:text('Limits'))")
    row = panel.locator("tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator("td")).to_have_text(
        [
            "task:crm.tasks.sync_account",
            "30/m, 2 at once",
            "code",
            "4",
            "2",
            "2",
            re.compile(r"\d"),
            "2",
            re.compile("Set"),
        ]
    )
    panel.scroll_into_view_if_needed()
    panel.screenshot(path=str(screenshots(tmp_path) / "dashboard-limits.png"))

    # The calls themselves, in their own list: by limit key, then due time; an operator may cancel them there.
    page.get_by_role("link", name=re.compile("Held by limits")).click()
    expect(page.locator("h1")).to_have_text("Calls held by limits")
    expect(page.locator("tr[data-id] td.limits")).to_have_text(
        ["task:crm.tasks.sync_account account:7"] * 2 + ["task:crm.tasks.sync_account account:9"] * 2
    )
    expect(page.locator("tr[data-id]")).to_have_count(4)
    expect(page.locator("tr[data-id] .phase")).to_have_text(["limited"] * 4)
    expect(page.locator("tr[data-id] .row-actions button")).to_have_text(["Cancel"] * 4)
    page.screenshot(path=str(screenshots(tmp_path) / "dashboard-limited.png"), full_page=True)
    page.goto(web.url + "/")

    # An operator changes the limit from the page; a limit that cannot work is refused, naming what is wrong.
    form = row.locator("form")
    form.get_by_label("Rates of task:crm.tasks.sync_account").fill("5/x")
    form.get_by_role("button", name="Set").click()
    expect(page.locator(".flash-error")).to_contain_text("rate='5/x' is not a rate")
    expect(row.locator("td").nth(1)).to_have_text("30/m, 2 at once")
    form.get_by_label("Concurrency of task:crm.tasks.sync_account").fill("3")
    form.get_by_role("button", name="Set").click()
    expect(page.locator(".flash-done")).to_contain_text("3 at once")
    expect(row.locator("td").nth(1)).to_have_text("3 at once")
    expect(row.locator("td").nth(2)).to_have_text("set")
    # Three at once and no rate: each account's two waiting calls go beside the one in flight.
    wait_for(lambda: rd.tick() and rd.stats()["limited"] == 0, 10, "the new limit to let the waiting calls go")
    form.get_by_role("button", name="Reset").click()
    expect(row.locator("td").nth(1)).to_have_text("30/m, 2 at once")
    expect(row.locator("td").nth(2)).to_have_text("code")
    assert problems == [], "no script errors, nothing refused by the Content-Security-Policy, no failed load"
