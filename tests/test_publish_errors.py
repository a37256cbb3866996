"""A store that is down fails a call as Celery's own publish fails when its Redis broker is down (issue 51).

Measured side by side, each against a real address where nothing answers (a port nothing listens on, or a
redis-server that answered once and was then stopped by its PID): plain Celery with a Redis broker, the
extension's parked call (a delayed task's, and in app mode a plain task's with a countdown) and, in app mode, the
extension's tracked call due now (``send.lua``). Each must

* raise what ``except kombu.exceptions.OperationalError`` catches (the extension's error stays a
  ``StoreUnavailableError``, a ``RedisDelayError`` and a ``ConnectionError``);
* with ``retry=False`` (the call's, or ``task_publish_retry = False``), try once: one attempt, no wait, even under
  a policy that would wait minutes;
* under a retry policy (the call's ``retry_policy``, ``task_publish_retry_policy``, or Celery's default), make
  as many attempts as Celery, waiting the same intervals between them.

An attempt of Celery's is a connection to its broker (nothing else reaches a closed port); one of the extension is
a store write of the call (``CallStore.park_keyed``, or ``CallStore.send`` for a tracked call due now). The waits
are what kombu's ``retry_over_time`` and the extension hand ``sleep``, recorded instead of slept: no test sleeps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import kombu
import kombu.utils.functional
import pytest
import redis
import redis.connection
from celery import Celery
from kombu.exceptions import OperationalError

from celery_redisdelay import RedisDelay, RedisDelayError, StoreUnavailableError
from celery_redisdelay.producer import parking
from celery_redisdelay.store.calls import CallStore
from celery_redisdelay.testing import RedisServer, free_port

#: How each kind of call reaches Redis: Celery's publish, the extension's park, its send of a tracked call due now.
KINDS = ("celery", "parked", "parked-app", "tracked")
EXTENSION_KINDS = KINDS[1:]
#: The store write each extension kind makes.
WRITE = {"parked": "park_keyed", "parked-app": "park_keyed", "tracked": "send"}
#: A policy under which a call that does not try once would wait a minute, then another, ...
SLOW_POLICY = {"max_retries": 3, "interval_start": 60, "interval_step": 60, "interval_max": 60}
#: Whether kombu's publish hands its retry policy to the connection it makes first (kombu 5.5, celery/kombu#2148).
#: Before, a broker that is down when Celery connects fails the call after kombu's own connection retries (2 s,
#: then 4 s, within ``broker_connection_timeout``): three attempts whatever the policy says.
KOMBU_POLICY_CONNECTS = tuple(kombu.VERSION[:2]) >= (5, 5)


def add(x: int, y: int) -> int:
    return x + y


class Call:
    """One kind of call on an app whose broker (and store: the broker's Redis) is at ``url``."""

    def __init__(self, kind: str, url: str, **conf: Any) -> None:
        self.kind = kind
        self.app = Celery(f"publish-errors-{kind}", broker=url, set_as_current=False)
        self.app.conf.update(task_default_queue="publish-errors", redisdelay_key_prefix="publish-errors", **conf)
        if kind == "celery":
            self.task = self.app.task(name="publish_errors.add")(add)
            return
        if kind != "parked":
            self.app.conf.update(redisdelay_all_tasks=True, redisdelay_track_due_now=kind == "tracked")
        self.rd = RedisDelay(self.app)
        if kind == "parked":
            self.task = self.rd.delayed(name="publish_errors.add")(add)
        else:
            self.task = self.app.task(name="publish_errors.add")(add)

    def __call__(self, **options: Any) -> Any:
        """The call: due now for Celery and for a tracked call, in a minute for a parked one."""
        due = {"countdown": 60} if self.kind.startswith("parked") else {}
        return self.task.apply_async((1, 2), **due, **options)

    def close(self) -> None:
        self.app.close()


class Attempts:
    """What reaches Redis at ``port`` while it is down: connections opened (redis-py's ``_connect``, Celery's and
    the store's alike), the store writes of calls, and the waits in between, recorded, not slept: kombu's
    ``retry_over_time`` runs on a clock of its own (``kombu_clock``, seconds) that only its waits move on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, port: int) -> None:
        self.connects = 0
        self.writes: list[str] = []
        self.waits: list[float] = []
        self.kombu_clock = 0.0
        connect: Callable[..., Any] = redis.connection.Connection._connect

        def counted_connect(connection: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(connection, "port", None) == port:
                self.connects += 1
            return connect(connection, *args, **kwargs)

        monkeypatch.setattr(redis.connection.Connection, "_connect", counted_connect)
        for name in set(WRITE.values()):
            monkeypatch.setattr(CallStore, name, self._counted(name, getattr(CallStore, name)))
        monkeypatch.setattr(kombu.utils.functional, "sleep", self._kombu_sleep)  # kombu's retry_over_time
        monkeypatch.setattr(kombu.utils.functional, "time", lambda: self.kombu_clock)
        monkeypatch.setattr(parking, "sleep", self.waits.append)  # the extension's

    def _kombu_sleep(self, seconds: float) -> None:
        self.kombu_clock += seconds
        self.waits.append(seconds)

    def _counted(self, name: str, write: Callable[..., Any]) -> Callable[..., Any]:
        def counted(store: CallStore, *args: Any, **kwargs: Any) -> Any:
            self.writes.append(name)
            return write(store, *args, **kwargs)

        return counted

    def reset(self) -> None:
        self.connects = 0
        self.writes.clear()
        self.waits.clear()
        self.kombu_clock = 0.0


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on: every connection to it is refused."""
    return free_port()


@pytest.fixture
def calls() -> Iterator[list[Call]]:
    made: list[Call] = []
    yield made
    for call in made:
        call.close()


def spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[tuple[Any, ...]]:
    """The arguments of every call of ``module.name`` from now on."""
    seen: list[tuple[Any, ...]] = []
    real = getattr(module, name)

    def spied(*args: Any, **kwargs: Any) -> Any:
        seen.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spied)
    return seen


def failed(call: Call, **options: Any) -> OperationalError:
    """The error of a call that cannot reach Redis, caught as an app catches Celery's."""
    try:
        call(**options)
    except OperationalError as exc:
        return exc
    raise AssertionError(f"{call.kind}: the call did not fail")


def measured(attempts: Attempts, call: Call, **options: Any) -> tuple[int, list[float]]:
    """(attempts, waits between them) of one failing call: connections for Celery, store writes for the extension."""
    attempts.reset()
    failed(call, **options)
    if call.kind == "celery":
        assert not attempts.writes
        return attempts.connects, list(attempts.waits)
    assert attempts.writes, f"{call.kind}: no store write was tried"
    assert set(attempts.writes) == {WRITE[call.kind]}, f"{call.kind} went another way: {attempts.writes}"
    # Every write reached the network: a retry is a real attempt, not one answered from a cache.
    assert attempts.connects >= len(attempts.writes)
    return len(attempts.writes), list(attempts.waits)


# -- the error: what except OperationalError catches --------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_error_is_celerys_publish_error(
    kind: str, closed_port: int, monkeypatch: pytest.MonkeyPatch, calls: list[Call]
) -> None:
    call = Call(kind, f"redis://127.0.0.1:{closed_port}/0")
    calls.append(call)
    Attempts(monkeypatch, closed_port)  # kombu's waits (its connection retries) recorded, not slept
    error = failed(call, retry_policy={"max_retries": 0})
    cause = error.__cause__
    # Celery's: kombu's OperationalError, from redis-py's ConnectionError; the extension's says the same.
    assert isinstance(cause, redis.ConnectionError), repr(cause)
    assert f"127.0.0.1:{closed_port}" in str(error) and "Connection refused" in str(error)
    if kind == "celery":
        assert type(error) is OperationalError
        return
    assert isinstance(error, StoreUnavailableError)
    assert isinstance(error, RedisDelayError) and isinstance(error, ConnectionError)
    assert str(cause) in str(error)
    verb = "send" if kind == "tracked" else "park"
    assert f"celery-redisdelay could not {verb} call " in str(error)


def test_the_error_class_is_both() -> None:
    assert issubclass(StoreUnavailableError, OperationalError)
    assert issubclass(StoreUnavailableError, RedisDelayError)
    assert issubclass(StoreUnavailableError, ConnectionError)


# -- retry=False: one attempt ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["call", "app"])
def test_no_retry_tries_once(setting: str, monkeypatch: pytest.MonkeyPatch, calls: list[Call]) -> None:
    """A Redis that answered and then stopped (by its PID): ``retry=False`` on the call, or
    ``task_publish_retry = False``, fails at the first failure, for Celery as for the extension, though
    ``task_publish_retry_policy`` would wait a minute between attempts.

    Measured, Celery's ``retry=False`` is not the whole story: with kombu 5.7, once the broker connection is known
    lost, kombu connects again before each publish with its own retries (2 s, then 4 s, until
    ``broker_connection_timeout``, 4 s), whatever ``retry`` says: three attempts in 6 s (kombu 5.3 tries once).
    That is not the publish's retry policy, and the store has no connection step of its own to retry: the extension
    tries once every time."""
    conf: dict[str, Any] = {"task_publish_retry_policy": SLOW_POLICY}
    if setting == "app":
        conf["task_publish_retry"] = False
    options = {"retry": False} if setting == "call" else {}
    server = RedisServer().start()
    try:
        made = [Call(kind, f"{server.url}/0", **conf) for kind in KINDS]
        calls.extend(made)
        for call in made:
            for _ in range(3):  # Redis answers: the call goes; its third is rendered from a kept template
                call(**options)
    finally:
        server.stop()
    attempts = Attempts(monkeypatch, server.port)
    rendered = spy(monkeypatch, parking, "park_from")
    for call in made:
        for failure in ("first", "again"):  # the first failure of the connection the call had, then another
            tries, waits = measured(attempts, call, **options)
            if call.kind == "celery" and failure == "again":
                # kombu 5.7's connection retries (kombu 5.3 tries once): never the policy's minute.
                assert tries in (1, 3) and attempts.kombu_clock in (0, 6), (tries, waits, attempts.kombu_clock)
            else:
                assert (tries, waits) == (1, []), f"{call.kind}, {failure} failure"
    if setting == "app":
        # Calls without options are rendered from their template (no Celery in the way): tried once all the same.
        assert rendered, "no call was rendered from a template"


# -- a retry policy: as many attempts as Celery, the same waits ---------------------------------------------------


POLICIES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # name: (the app's settings, the call's options)
    "call's retry_policy": ({}, {"retry_policy": {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.1}}),
    "task_publish_retry_policy": (
        {"task_publish_retry_policy": {"max_retries": 1, "interval_start": 0.3, "interval_step": 0.5}},
        {},
    ),
    "both": (
        {
            "task_publish_retry_policy": {
                "max_retries": 4,
                "interval_start": 0.1,
                "interval_step": 0.2,
                "interval_max": 0.4,
            }
        },
        {"retry_policy": {"max_retries": 3}},  # over the app's: its intervals stay
    ),
    "Celery's default": ({}, {}),  # max_retries 3, intervals 0, 0.2, 0.4 (no wait for the 0)
}

EXPECTED = {
    "call's retry_policy": (3, [0.1, 0.2]),
    "task_publish_retry_policy": (2, [0.3]),
    "both": (4, [0.1, 0.3, 0.4]),
    "Celery's default": (4, [0.2, 0.4]),
}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_retry_policy_makes_as_many_attempts_as_celery(
    policy: str, closed_port: int, monkeypatch: pytest.MonkeyPatch, calls: list[Call]
) -> None:
    conf, options = POLICIES[policy]
    attempts = Attempts(monkeypatch, closed_port)
    made = {kind: Call(kind, f"redis://127.0.0.1:{closed_port}/0", **conf) for kind in KINDS}
    calls.extend(made.values())
    celery = measured(attempts, made["celery"], **options)
    tries, waits = EXPECTED[policy]
    if KOMBU_POLICY_CONNECTS:
        assert celery[0] == tries and celery[1] == pytest.approx(waits), f"Celery: {celery}"
    else:  # the policy never reaches Celery's first connection: kombu's connection retries do
        assert celery[0] == 3 and sum(celery[1]) == 6, f"Celery: {celery}"
    for kind in EXTENSION_KINDS:
        for _ in range(2):  # every call, not the first alone
            got = measured(attempts, made[kind], **options)
            assert got[0] == tries, f"{kind}: {got[0]} attempts, Celery {celery[0]}, the policy {tries}"
            assert got[1] == pytest.approx(waits), f"{kind} waited {got[1]}, Celery {celery[1]}, the policy {waits}"


def test_a_call_rendered_from_a_template_is_retried_alike(monkeypatch: pytest.MonkeyPatch, calls: list[Call]) -> None:
    """A call like one parked before is rendered from the kept template, without Celery: the app's retry policy
    applies to it as to a call Celery builds (``task_publish_retry_policy`` here)."""
    policy = {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.1}
    server = RedisServer().start()
    try:
        made = [Call(kind, f"{server.url}/0", task_publish_retry_policy=policy) for kind in EXTENSION_KINDS]
        calls.extend(made)
        for call in made:
            for _ in range(3):  # the third is rendered from the template the second left
                call()
    finally:
        server.stop()
    attempts = Attempts(monkeypatch, server.port)
    rendered = spy(monkeypatch, parking, "park_from")
    for call in made:
        rendered.clear()
        tries, waits = measured(attempts, call)
        assert tries == 3 and waits == pytest.approx([0.1, 0.2]), call.kind
        assert len(rendered) == 1, f"{call.kind} was not rendered from its template"


def test_a_publish_celery_retries_itself_is_not_retried_twice(
    closed_port: int, monkeypatch: pytest.MonkeyPatch, calls: list[Call]
) -> None:
    """A worker's callback (``link``, a chord's body) is published under Celery's own retry loop (Celery 5.7), which
    hands the publish ``retry=False``: the store write then tries once per turn of Celery's loop, so the call makes
    the policy's attempts, not the policy's squared."""
    import celery.app.amqp

    flag = getattr(celery.app.amqp, "_callback_publish_retry", None)
    if flag is None:
        pytest.skip("this Celery has no retry loop of its own for callbacks")
    policy = {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.1}
    made = {kind: Call(kind, f"redis://127.0.0.1:{closed_port}/0", task_publish_retry_policy=policy) for kind in KINDS}
    calls.extend(made.values())
    attempts = Attempts(monkeypatch, closed_port)
    token = flag.set(True)
    try:
        for kind in EXTENSION_KINDS:
            tries, waits = measured(attempts, made[kind])
            assert tries == 3 and waits == pytest.approx([0.1, 0.2]), (kind, tries, waits)
    finally:
        flag.reset(token)


def test_a_refusal_is_not_retried(monkeypatch: pytest.MonkeyPatch, calls: list[Call]) -> None:
    """Redis that answers with an error (here: a key of ours holding another type) is not unreachable: the call
    fails at once, as kombu retries only connection errors."""
    with RedisServer() as server:
        call = Call("parked", f"{server.url}/0")
        calls.append(call)
        store = call.rd.depot.shards.home("x")
        with server.client() as client:
            client.set(store.keys.delayed, "not a zset")
        attempts = Attempts(monkeypatch, server.port)
        with pytest.raises(StoreUnavailableError, match="WRONGTYPE") as caught:
            call()
        assert isinstance(caught.value, OperationalError)
        assert attempts.writes == ["park_keyed"] and attempts.waits == []


def test_the_store_coming_back_lets_the_retried_call_through(
    monkeypatch: pytest.MonkeyPatch, calls: list[Call]
) -> None:
    """The policy's retries are real: a store that answers again before they run out takes the call, once."""
    server = RedisServer()
    port = server.port
    policy = {"max_retries": 5, "interval_start": 0.1, "interval_step": 0}
    call = Call("parked", f"{server.url}/0", task_publish_retry_policy=policy)
    calls.append(call)
    attempts = Attempts(monkeypatch, port)
    waits: list[float] = []

    def wait(seconds: float) -> None:  # the second wait: Redis is up by the next attempt
        waits.append(seconds)
        if len(waits) == 2:
            server.start()

    monkeypatch.setattr(parking, "sleep", wait)
    try:
        result = call()
        assert len(attempts.writes) == 3 and waits == pytest.approx([0.1, 0.1])
        found = call.rd.find(result.id)
        assert found is not None and found.state == "delayed"
    finally:
        server.stop()
