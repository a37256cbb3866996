"""The dashboard over HTTP: every page and action through Flask's test client against the session's real
redis-server, its guards (CSRF, read-only, basic auth, headers), mounting under a path of another WSGI
app, and ``celery -A ... redisdelay web`` serving it with waitress."""

from __future__ import annotations

import functools
import inspect
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner, Result
from flask.testing import FlaskClient
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.test import Client

from celery_redisdelay import RedisDelay
from celery_redisdelay.cli import redisdelay
from celery_redisdelay.testing import RedisServer, free_port, wait_for
from celery_redisdelay.web import create_app, overview
from celery_redisdelay.web.board import ACTION_BUDGET
from celery_redisdelay.web.security import CONTENT_SECURITY_POLICY
from tests.conftest import ROOT
from tests.web_proj import shop_tasks

MakeApp = Callable[..., tuple[Celery, RedisDelay]]
CSRF = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')


@pytest.fixture
def shop(make_app: MakeApp, redis_server: RedisServer) -> tuple[RedisDelay, dict[str, Any]]:
    _, rd = make_app(result_backend=f"{redis_server.url}/1", redisdelay_shards=2)
    return rd, shop_tasks(rd)


def client_of(rd: RedisDelay, **options: Any) -> FlaskClient:
    return create_app(rd, **options).test_client()


def page(client: FlaskClient | Client, url: str, code: int = 200, **options: Any) -> str:
    response = client.get(url, **options)
    assert response.status_code == code, (url, response.status_code, response.get_data(as_text=True)[:2000])
    return response.get_data(as_text=True)


def token(client: FlaskClient | Client, url: str = "/calls/delayed") -> str:
    found = CSRF.search(page(client, url))
    assert found, "every page with a form carries the CSRF token"
    return found.group(1)


def post(client: FlaskClient | Client, url: str, data: dict[str, Any], code: int = 302) -> Any:
    response = client.post(url, data=data)
    assert response.status_code == code, (url, response.status_code, response.get_data(as_text=True)[:2000])
    return response


def ids_on(html: str) -> list[str]:
    return re.findall(r'<tr data-id="([^"]+)"', html)


def park(tasks: dict[str, Any]) -> dict[str, list[str]]:
    """Invoices due over the next hour, order updates over the next day, reminders for the mail queue."""
    return {
        "invoice": [
            tasks["invoice"].apply_async((n,), {"amount": n * 1.5}, countdown=60 + n * 300).id for n in range(8)
        ],
        "order": [tasks["order"].apply_async((500 + n, "shipped"), countdown=3600 * (n + 1)).id for n in range(5)],
        "reminder": [tasks["reminder"].apply_async((n, "cart-abandoned"), countdown=7200).id for n in range(3)],
    }


def score(rd: RedisDelay, call_id: str) -> float | None:
    entry = rd.find(call_id)
    return None if entry is None else entry.score_ms


# -- pages ------------------------------------------------------------------------------------------


def test_every_page_shows_the_store_and_loads_nothing_from_outside(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    rd, tasks = shop
    ids = park(tasks)
    rd.reschedule(ids["invoice"][0], countdown=0)
    [claimed] = rd.shards.home(ids["invoice"][0]).claim(1, 60_000)
    rd.reschedule(ids["invoice"][1], countdown=0)
    assert rd.shards.home(ids["reminder"][0]).bury(ids["reminder"][0], "not acknowledged after 10 deliveries")
    client = client_of(rd)

    overview = page(client, "/")
    assert re.search(r"Delayed</span>\s*<span class=\"card-value\">14<", overview)
    assert "1 due now" in overview and "<svg" in overview
    assert all(name in overview for name in ("billing.tasks.send_invoice", "orders.tasks.update_order"))
    assert "all 14 parked calls" in overview, "the split by task is exact for a small store"

    delayed = page(client, "/calls/delayed")
    assert len(ids_on(delayed)) == 14 and ids_on(delayed)[0] == ids["invoice"][1], "oldest due first"
    assert ">mail<" in delayed, "the queue column"
    inflight = page(client, "/calls/inflight")
    assert ids_on(inflight) == [claimed.id] and "Apply to selected" not in inflight, "no actions in flight"
    dead = page(client, "/calls/dead")
    assert ids_on(dead) == [ids["reminder"][0]] and "not acknowledged after 10 deliveries" in dead

    order = page(client, f"/call/{ids['order'][0]}")
    assert "order:500 (free, 0 waiting)" in order, "the lock the call takes"
    assert "[500, &#34;shipped&#34;]" in order and "Reschedule" in order
    assert client.get(f"/find?id={ids['order'][0]}").location.endswith(f"/call/{ids['order'][0]}")
    assert "No call nope in the store" in page(client, "/call/nope", 404)
    assert "no list of" in page(client, "/calls/sleeping", 404)
    assert "is not one that list printed" in page(client, "/calls/delayed?cursor=x", 400)
    assert "limit must be from 1 to 500" in page(client, "/calls/delayed?limit=100000", 400)

    for url in ("/", "/calls/delayed", "/calls/dead", f"/call/{ids['order'][0]}", "/call/nope"):
        response = client.get(url)
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
        assert response.headers["X-Frame-Options"] == "DENY"
        loaded = re.findall(r'(?:src|href)="([^"]+)"', response.get_data(as_text=True))
        assert loaded and not [link for link in loaded if "//" in link], f"{url} links only inside the app"
    assert client.get("/static/dashboard.css").status_code == 200
    assert client.get("/static/dashboard.js").status_code == 200


def test_filters_orders_and_pages_are_bookmarkable_links(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    rd, tasks = shop
    ids = park(tasks)
    client = client_of(rd)

    orders = page(client, "/calls/delayed?task=orders.tasks.update_order&order=newest")
    assert ids_on(orders) == ids["order"][::-1]
    assert sorted(ids_on(page(client, "/calls/delayed?queue=mail"))) == sorted(ids["reminder"])
    found = ids_on(page(client, "/calls/delayed?q=cart-ABANDONED&task=mail.tasks.send_reminder"))
    assert sorted(found) == sorted(ids["reminder"])
    assert ids_on(page(client, "/calls/delayed?q=%22amount%22%3A+6.0")) == [ids["invoice"][4]], "kwargs too"

    seen: list[str] = []
    url: str | None = "/calls/delayed?limit=3&task=billing.tasks.send_invoice"
    while url is not None:
        html = page(client, url)
        seen += ids_on(html)
        link = re.search(r'href="([^"]+)" rel="next"', html)
        url = link.group(1).replace("&amp;", "&") if link else None
        assert url is None or ("task=billing.tasks.send_invoice" in url and "cursor=" in url)
    assert seen == ids["invoice"]

    few = page(client, "/calls/delayed?limit=3")
    following = re.search(r'href="([^"]+)" rel="next"', few)
    assert following and ids_on(page(client, following.group(1).replace("&amp;", "&")))[0] == ids["invoice"][3]
    stopped = page(client, "/calls/delayed?q=nowhere&scan=5")
    assert "stopped at its bound of 5 entries" in stopped and "read on" in stopped


# -- actions ----------------------------------------------------------------------------------------


def test_actions_on_one_call(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    rd, tasks = shop
    ids = park(tasks)
    client = client_of(rd)
    csrf = token(client)
    invoice, order, reminder = ids["invoice"][3], ids["order"][0], ids["reminder"][0]
    before = score(rd, invoice)

    post(client, f"/call/{invoice}/run-now", {"csrf_token": csrf})
    assert score(rd, invoice) < before  # type: ignore[operator]
    assert "made due now" in page(client, f"/call/{invoice}")
    post(client, f"/call/{invoice}/reschedule", {"csrf_token": csrf, "delay": "2", "unit": "h"})
    later = score(rd, invoice)
    post(client, f"/call/{order}/reschedule", {"csrf_token": csrf, "eta": "2099-01-01T00:00", "delay": "10"})
    assert score(rd, order) == 4070908800000, "a naive eta is in the app's timezone (UTC)"
    assert later is not None and later > before + 6_000_000  # type: ignore[operator]
    assert "A reschedule needs a delay" in post(client, f"/call/{order}/reschedule", {"csrf_token": csrf}, 400).text

    asked = post(client, f"/call/{order}/cancel", {"csrf_token": csrf}, 200).text
    assert "Cancel call" in asked and 'name="confirmed" value="1"' in asked and score(rd, order) is not None
    post(client, f"/call/{order}/cancel", {"csrf_token": csrf, "confirmed": "1"})
    assert score(rd, order) is None and rd.app.AsyncResult(order).state == "REVOKED"
    again = client.post(f"/call/{order}/cancel", data={"csrf_token": csrf, "confirmed": "1"}, follow_redirects=True)
    assert "is no longer delayed: nothing was done" in again.text

    assert rd.shards.home(reminder).bury(reminder, "buried by the test")
    post(client, f"/call/{reminder}/requeue", {"csrf_token": csrf})
    assert rd.find(reminder).state == "delayed"  # type: ignore[union-attr]
    assert rd.shards.home(reminder).bury(reminder, "buried again")
    post(client, f"/call/{reminder}/purge", {"csrf_token": csrf, "confirmed": "1"})
    assert rd.find(reminder) is None
    assert client.post(f"/call/{reminder}/explode", data={"csrf_token": csrf}).status_code == 404


def test_actions_on_a_selection_and_on_everything_matching(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    rd, tasks = shop
    ids = park(tasks)
    client = client_of(rd)
    csrf = token(client)
    chosen = ids["invoice"][:3]

    form = {"csrf_token": csrf, "action": "cancel", "scope": "selected", "ids": chosen}
    asked = post(client, "/calls/delayed/act", form, 200).text
    assert "Cancel 3 selected delayed calls?" in asked and asked.count('name="ids"') == 3
    done = client.post("/calls/delayed/act", data={**form, "confirmed": "1"}, follow_redirects=True)
    assert "3 of 3 selected calls cancelled" in done.text
    assert [score(rd, call_id) for call_id in chosen] == [None] * 3
    assert {rd.app.AsyncResult(call_id).state for call_id in chosen} == {"REVOKED"}
    empty = client.post("/calls/delayed/act", data={**form, "ids": []}, follow_redirects=True)
    assert "Select some calls first" in empty.text

    matching = {
        "csrf_token": csrf,
        "action": "reschedule",
        "scope": "matching",
        "task": "orders.tasks.update_order",
        "delay": "3",
        "unit": "d",
    }
    asked = post(client, "/calls/delayed/act", matching, 200).text
    assert "every delayed call matching task orders.tasks.update_order (of 13)" in asked
    moved = client.post("/calls/delayed/act", data={**matching, "confirmed": "1"}, follow_redirects=True)
    assert "5 calls rescheduled" in moved.text
    assert len({score(rd, call_id) for call_id in ids["order"]}) == 1
    assert score(rd, ids["order"][0]) > score(rd, ids["reminder"][0])  # type: ignore[operator]

    for call_id in ids["reminder"]:
        assert rd.shards.home(call_id).bury(call_id, "buried by the test")
    wrong = {"csrf_token": csrf, "action": "requeue", "scope": "matching", "confirmed": "1"}
    assert client.post("/calls/delayed/act", data=wrong).status_code == 400, "requeue is for dead calls"
    requeued = client.post("/calls/dead/act", data={**wrong, "q": "cart"}, follow_redirects=True)
    assert "3 calls requeued" in requeued.text and rd.stats()["dead"] == 0
    assert rd.stats()["delayed"] == 13


# -- guards -----------------------------------------------------------------------------------------


def test_csrf_read_only_and_basic_auth(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    rd, tasks = shop
    call_id = park(tasks)["invoice"][0]
    client = client_of(rd)
    assert client.post(f"/call/{call_id}/run-now").status_code == 400
    assert client.post(f"/call/{call_id}/run-now", data={"csrf_token": "0" * 64}).status_code == 400
    assert client.post(f"/call/{call_id}/run-now", data={"csrf_token": token(client)}).status_code == 302

    viewer = client_of(rd, read_only=True)
    listed = page(viewer, "/calls/delayed")
    assert call_id in listed and "read-only" in listed
    assert "<button" not in listed.split("<main>")[1].split("</form>", 1)[1], "no action buttons"
    assert "Cancel…" not in page(viewer, f"/call/{call_id}")
    forbidden = viewer.post(f"/call/{call_id}/cancel", data={"csrf_token": token(viewer), "confirmed": "1"})
    assert forbidden.status_code == 403 and "read-only" in forbidden.text
    assert score(rd, call_id) is not None

    guarded = client_of(rd, auth="ops:s3cret:with:colons")
    for url in ("/", "/calls/dead", "/static/dashboard.css"):
        refused = guarded.get(url)
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Basic")
    assert guarded.get("/", auth=("ops", "wrong")).status_code == 401
    assert guarded.get("/", auth=("other", "s3cret:with:colons")).status_code == 401
    assert guarded.get("/", auth=("ops", "s3cret:with:colons")).status_code == 200
    with pytest.raises(ValueError, match="user:password"):
        create_app(rd, auth="no-colon")


def test_mounted_under_a_path_of_another_wsgi_app(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    rd, tasks = shop
    call_id = park(tasks)["invoice"][0]

    def host(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"the host app"]

    mounted = Client(DispatcherMiddleware(host, {"/ops/redisdelay": create_app(rd)}))
    assert mounted.get("/").get_data() == b"the host app"
    listed = page(mounted, "/ops/redisdelay/calls/delayed")
    assert f'href="/ops/redisdelay/call/{call_id}"' in listed
    assert 'href="/ops/redisdelay/static/dashboard.css' in listed
    moved = mounted.post(
        f"/ops/redisdelay/call/{call_id}/run-now", data={"csrf_token": token(mounted, "/ops/redisdelay/calls/delayed")}
    )
    assert moved.status_code == 302 and moved.location.endswith(f"/ops/redisdelay/call/{call_id}")


def test_the_web_command_serves_until_sigterm(redis_server: RedisServer) -> None:
    port = free_port()
    env = {
        **os.environ,
        "REDISDELAY_TEST_URL": redis_server.url,
        "REDISDELAY_WEB_PREFIX": f"web-{uuid.uuid4().hex[:8]}",
    }
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "celery", "-A", "tests.web_proj", "redisdelay", "web", "--port", str(port)]
    bad = subprocess.run([*command, "--auth", "nopassword"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "user:password" in bad.stderr
    server = subprocess.Popen(
        [*command, "--read-only"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/calls/delayed", timeout=5) as response:
                    return bool(response.status == 200 and b"read-only" in response.read())
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_for(answers, 60, "the dashboard to answer")
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, output
    assert f"serving on http://127.0.0.1:{port}/" in output and "redisdelay web: stopped" in output


# -- README promises: headers, cookie, shared secret, the command's guards, bulk limits --------------


def test_every_response_carries_the_security_headers(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    """Pages, error pages, confirmation pages, redirects after an action, and the refusals of the guards."""
    rd, tasks = shop
    call_id = park(tasks)["invoice"][0]
    client = client_of(rd)
    csrf = token(client)
    responses = {
        "overview": client.get("/"),
        "list": client.get("/calls/delayed"),
        "call": client.get(f"/call/{call_id}"),
        "404": client.get("/call/nope"),
        "400": client.get("/calls/delayed?limit=0"),
        "redirect": client.get(f"/find?id={call_id}"),
        "confirm": client.post(f"/call/{call_id}/cancel", data={"csrf_token": csrf}),
        "action": client.post(f"/call/{call_id}/run-now", data={"csrf_token": csrf}),
        "csrf refused": client.post(f"/call/{call_id}/run-now"),
        "read-only refused": client_of(rd, read_only=True).post(f"/call/{call_id}/run-now"),
        "auth refused": client_of(rd, auth="ops:s3cret").get("/"),
    }
    assert [response.status_code for response in responses.values()] == [
        200,
        200,
        200,
        404,
        400,
        302,
        200,
        302,
        400,
        403,
        401,
    ]
    for name, response in responses.items():
        assert response.headers.get("Content-Security-Policy") == CONTENT_SECURITY_POLICY, name
        assert response.headers.get("X-Frame-Options") == "DENY", name
        assert response.headers.get("Cache-Control") == "no-store", name
    for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self'", "img-src 'self' data:"):
        assert directive in CONTENT_SECURITY_POLICY
    assert "form-action 'self'" in CONTENT_SECURITY_POLICY and "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY


def test_static_files_carry_the_security_headers_too(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    rd, _ = shop
    client = client_of(rd)
    for url in ("/static/dashboard.css", "/static/dashboard.js", "/static/favicon.svg"):
        response = client.get(url)
        assert response.status_code == 200, url
        assert response.headers.get("Content-Security-Policy") == CONTENT_SECURITY_POLICY, url
        assert response.headers.get("X-Frame-Options") == "DENY", url
        assert response.headers.get("Cache-Control") == "no-store", url


def test_the_flash_cookie_is_samesite_strict_and_httponly(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    rd, _ = shop
    client = client_of(rd)
    form = {"csrf_token": token(client), "action": "cancel", "scope": "selected", "confirmed": "1"}
    flashed = post(client, "/calls/delayed/act", form)
    [cookie] = flashed.headers.getlist("Set-Cookie")
    attributes = {part.strip().split("=", 1)[0].lower(): part.strip() for part in cookie.split(";")}
    assert cookie.startswith("redisdelay_session="), "its own name, not the session cookie of a host app"
    assert attributes.get("samesite") == "SameSite=Strict" and "httponly" in attributes, cookie
    assert "Select some calls first" in page(client, flashed.location)


def test_apps_with_the_same_secret_accept_each_others_token_and_cookie(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    """Several processes behind one address: a form from one, posted to another."""
    rd, tasks = shop
    ids = park(tasks)["invoice"]
    first, second, other = (client_of(rd, secret=secret) for secret in ("shared", "shared", "another"))
    before = score(rd, ids[0])
    csrf = token(first)
    assert csrf == token(second) != token(other) != token(client_of(rd))
    assert other.post(f"/call/{ids[0]}/run-now", data={"csrf_token": csrf}).status_code == 400
    assert client_of(rd).post(f"/call/{ids[0]}/run-now", data={"csrf_token": csrf}).status_code == 400, "random"
    assert score(rd, ids[0]) == before, "refused: nothing was done"

    moved = post(second, f"/call/{ids[0]}/run-now", {"csrf_token": csrf})
    assert score(rd, ids[0]) < before  # type: ignore[operator]
    cookie = second.get_cookie("redisdelay_session")
    assert cookie is not None
    first.set_cookie("redisdelay_session", cookie.value)
    other.set_cookie("redisdelay_session", cookie.value)
    assert "made due now" in page(first, moved.location), "the flash cookie is signed with the same secret"
    assert "made due now" not in page(other, moved.location)


def test_the_web_command_refuses_an_auth_without_colon_and_warns_off_loopback(
    shop: tuple[RedisDelay, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    rd, _ = shop
    served: list[tuple[Any, str, int, int]] = []

    def serve(app: Any, host: str, port: int, threads: int, say: Callable[[str], None]) -> None:
        served.append((app, host, port, threads))

    monkeypatch.setattr("celery_redisdelay.web.serve", serve)
    monkeypatch.delenv("REDISDELAY_WEB_AUTH", raising=False)

    def web(*args: str, **env: str) -> Result:
        # Click before 8.2 mixes stderr into the output unless told not to; 8.2 always keeps it apart.
        separate = {"mix_stderr": False} if "mix_stderr" in inspect.signature(CliRunner).parameters else {}
        runner = CliRunner(**separate)
        return runner.invoke(redisdelay, ["web", *args], obj=SimpleNamespace(app=rd.app), env=env)

    refused = web(REDISDELAY_WEB_AUTH="nopassword")
    assert refused.exit_code == 2 and "user:password" in refused.stderr and "--auth" in refused.stderr
    assert not served, "nothing is served with a bad --auth"

    everywhere = web("--host", "0.0.0.0", "--port", "0")
    assert everywhere.exit_code == 0, everywhere.output
    assert "WARNING: listening on 0.0.0.0 without --auth" in everywhere.stderr
    assert "WARNING" not in everywhere.stdout, "the warning goes to stderr"
    assert served[-1][1:] == ("0.0.0.0", 0, 4)

    guarded = web("--host", "0.0.0.0", REDISDELAY_WEB_AUTH="ops:s3cret")
    loopback = web()
    assert guarded.exit_code == loopback.exit_code == 0 and "WARNING" not in guarded.stderr + loopback.stderr
    assert [call[1:] for call in served[-2:]] == [("0.0.0.0", 5556, 4), ("127.0.0.1", 5556, 4)]
    assert page(served[-2][0].test_client(), "/", 401, auth=("ops", "wrong")) and page(
        served[-2][0].test_client(), "/", auth=("ops", "s3cret")
    ), "the auth came from REDISDELAY_WEB_AUTH"


def test_everything_matching_stops_when_its_time_budget_is_spent(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    rd, tasks = shop
    invoices = park(tasks)["invoice"]
    assert inspect.signature(create_app).parameters["budget"].default == ACTION_BUDGET == 20, "README: 20 seconds"
    client = client_of(rd, budget=0)
    form = {
        "csrf_token": token(client),
        "action": "cancel",
        "scope": "matching",
        "task": "billing.tasks.send_invoice",
        "scan": "3",
        "confirmed": "1",
    }
    first = client.post("/calls/delayed/act", data=form, follow_redirects=True).text
    assert re.search(r"\d+ calls cancelled \(\d+ entries read\); stopped after 0 s with \d+ calls done; run it", first)
    left = [call_id for call_id in invoices if score(rd, call_id) is not None]
    assert 0 < len(left) < len(invoices), "it stopped part of the way"

    for _ in range(len(invoices)):  # each run carries on where the last stopped
        again = client.post("/calls/delayed/act", data=form, follow_redirects=True).text
        if "stopped after" not in again:
            break
    assert [score(rd, call_id) for call_id in invoices] == [None] * len(invoices)
    assert rd.stats()["delayed"] == 8, "the other tasks' calls are untouched"


def test_the_flash_after_a_selection_says_how_many_had_left(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    rd, tasks = shop
    ids = park(tasks)
    client = client_of(rd)
    csrf = token(client)
    gone, kept = ids["invoice"][0], ids["invoice"][1]
    assert rd.cancel(gone)

    form = {"csrf_token": csrf, "action": "cancel", "scope": "selected", "ids": [gone, kept], "confirmed": "1"}
    done = client.post("/calls/delayed/act", data=form, follow_redirects=True).text
    assert "1 of 2 selected calls cancelled; 1 had left the delayed set." in done
    assert score(rd, kept) is None

    reminders = ids["reminder"]
    for call_id in reminders:
        assert rd.shards.home(call_id).bury(call_id, "buried by the test")
    post(client, f"/call/{reminders[0]}/purge", {"csrf_token": csrf, "confirmed": "1"})
    form = {"csrf_token": csrf, "action": "requeue", "scope": "selected", "ids": reminders, "confirmed": "1"}
    requeued = client.post("/calls/dead/act", data=form, follow_redirects=True).text
    assert "2 of 3 selected calls requeued; 1 had left the dead set." in requeued


def test_the_split_by_task_is_estimated_from_a_sample_above_its_size(
    shop: tuple[RedisDelay, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    rd, tasks = shop
    park(tasks)  # 8 invoices, 5 orders, 3 reminders: 16 parked calls over two shards
    assert overview.SAMPLE == 2000 and inspect.signature(overview.tasks_sample).parameters["sample"].default == 2000
    client = client_of(rd)
    sampled = overview.tasks_sample

    monkeypatch.setattr(overview, "tasks_sample", functools.partial(sampled, sample=16))
    exact = page(client, "/")
    assert "all 16 parked calls" in exact and "estimated from" not in exact, "exact up to the sample size"
    assert re.search(r">8</text>", exact) and "~" not in re.sub(r"<(script|style)[^>]*>.*?</\1>", "", exact)

    monkeypatch.setattr(overview, "tasks_sample", functools.partial(sampled, sample=6))
    estimated = page(client, "/")
    found = re.search(r"estimated from (\d+) of 16 parked calls, sampled evenly", estimated)
    assert found and 0 < int(found.group(1)) < 16, "above it, a sample of each shard, and the page says so"
    assert "all 16 parked calls" not in estimated and re.search(r">~\d+</text>", estimated)


def test_purging_one_dead_call_asks_first(shop: tuple[RedisDelay, dict[str, Any]]) -> None:
    rd, tasks = shop
    call_id = park(tasks)["reminder"][0]
    assert rd.shards.home(call_id).bury(call_id, "buried by the test")
    client = client_of(rd)
    csrf = token(client)

    asked = post(client, f"/call/{call_id}/purge", {"csrf_token": csrf}, 200).text
    assert f"Purge call {call_id}?" in asked and 'name="confirmed" value="1"' in asked
    assert f'action="/call/{call_id}/purge"' in asked, "the button posts the same action again"
    assert rd.find(call_id).state == "dead"  # type: ignore[union-attr]
    assert "purged" not in page(client, f"/call/{call_id}"), "nothing done, nothing flashed"

    done = client.post(f"/call/{call_id}/purge", data={"csrf_token": csrf, "confirmed": "1"}, follow_redirects=True)
    assert f"Call {call_id} purged." in done.text and rd.find(call_id) is None
