"""Conformance: each Celery feature run on a real worker and beat twice, as ``@app.task`` and as
``@rd.delayed``, and the observable outcome compared.

The tasks are in ``tests/conformance_app.py`` (broker with kombu's ``global_keyprefix``, the store on
another database, task events on). A run records the request the worker gave it; the comparison is
of those records (ids and times aside), of the result state and value, of callbacks and events. A run's
``eta`` is computed at the call from the producer's clock: two calls made at different instants are compared
by its form, and calls made with the app's clock stopped (``frozen_clock``, ``ConformanceApp.clock_at``) by
its value, which must be the same.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery.exceptions import TaskRevokedError, TimeLimitExceeded
from celery.result import AsyncResult
from kombu import Producer

from celery_redisdelay.testing import beat, wait_for, worker

from .conftest import ROOT

pytestmark = pytest.mark.e2e

#: The worker's pool (``REDISDELAY_CONFORMANCE_POOL``; ``tests/test_conformance_pools.py`` runs the suite with others).
POOL = os.environ.get("REDISDELAY_CONFORMANCE_POOL", "prefork")
#: The tests of what only a pool of processes has: time limits, and a pool process that dies.
prefork_only = pytest.mark.skipif(
    POOL != "prefork", reason=f"Celery's {POOL} pool has no time limits or pool processes"
)

#: Record fields that differ between two runs by nature: when, and the ids in them.
VOLATILE = ("at_ms",)
TIMEOUT = 45


@pytest.fixture(scope="module")
def conf(redis_server: Any) -> Iterator[Any]:
    """``tests.conformance_app`` with a worker (all its queues) and beat running it."""
    os.environ["REDISDELAY_TEST_URL"] = redis_server.url
    from tests import conformance_app as module

    env = {"REDISDELAY_TEST_URL": redis_server.url, "PYTHONPATH": str(ROOT), module.MODE_ENV: module.MODE}
    queues = ",".join(module.QUEUES)
    processes = [
        worker("tests.conformance_app", concurrency=4, pool=POOL, queues=queues, env=env, cwd=str(ROOT)),
        beat("tests.conformance_app", env=env, cwd=str(ROOT)),
    ]
    for process in processes:
        process.start()
    try:
        wait_for(lambda: "ready." in processes[0].output(), 60, "the conformance worker to be ready")
        yield module
    finally:
        for process in processes:
            process.stop()
        print("\n".join(p.output()[-3000:] for p in processes))  # shown by pytest only when a test failed
        for process in processes:
            process.remove_files()


def runs(conf: Any, call_id: str, count: int = 1) -> list[dict[str, Any]]:
    """The runs of a call, once there are ``count`` of them."""

    def recorded() -> list[dict[str, Any]] | None:
        found = [json.loads(raw) for raw in conf.marks.lrange(f"runs:{call_id}", 0, -1)]
        return found if len(found) >= count else None

    found: list[dict[str, Any]] = wait_for(recorded, TIMEOUT, f"{count} run(s) of {call_id}")
    return found


def ran(conf: Any, call_id: str) -> int:
    return int(conf.marks.llen(f"runs:{call_id}"))


def settled(result: AsyncResult, state: str) -> AsyncResult:
    wait_for(lambda: result.state == state, TIMEOUT, f"{result.id} to be {state} (it is {result.state})")
    return result


def untracked(conf: Any, call_id: str) -> None:
    """The extension no longer tracks the call: acknowledged, discarded or dropped."""
    wait_for(lambda: conf.rd.find(call_id) is None, TIMEOUT, f"the store to forget {call_id}")


def eta_form(eta: str | None) -> Any:
    """What the etas of two calls made at different instants share: none, or ISO 8601 text with one UTC offset."""
    return None if eta is None else ("ISO 8601", datetime.fromisoformat(eta).utcoffset())


def same(records: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Assert the two variants' runs are alike (their etas by form); return the plain ones."""
    plain, delayed = (
        [
            {**{k: v for k, v in run.items() if k not in VOLATILE}, "eta": eta_form(run["eta"])}
            for run in records[variant]
        ]
        for variant in ("plain", "delayed")
    )
    assert delayed == plain
    return plain


def launch(conf: Any, task: str, start: Callable[[Any], AsyncResult]) -> dict[str, AsyncResult]:
    """Start the same call on both variants of ``task``."""
    return {variant: start(getattr(conf, task)[variant]) for variant in conf.VARIANTS}


def barrier(conf: Any, countdown: float) -> None:
    """Wait until a call due ``countdown`` seconds from now has run on the same worker: whatever was due
    before it and was going to run has run by then."""
    result = conf.barrier.apply_async(countdown=countdown, queue="conf")
    runs(conf, result.id)


# -- timing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "when", [{"countdown": 1}, {"countdown": -0.2}, {"eta": "soon"}], ids=["countdown", "negative", "eta"]
)
def test_a_call_runs_once_after_its_due_time(conf: Any, when: dict[str, Any]) -> None:
    due_ms = conf.server_ms() + max(0, round(when.get("countdown", 1) * 1000))
    if "eta" in when:
        when = {"eta": datetime.fromtimestamp(due_ms / 1000, UTC)}
    results = launch(conf, "echo", lambda task: task.apply_async((1,), {"k": "v"}, **when))
    records = {}
    for variant, result in results.items():
        assert result.get(timeout=TIMEOUT) == 1
        records[variant] = runs(conf, result.id)
        assert records[variant][0]["at_ms"] >= due_ms - 50, f"{variant} ran early"
    same(records)
    untracked(conf, results["delayed"].id)


@pytest.mark.usefixtures("frozen_clock")  # both calls at one instant: a countdown gives both one eta
@pytest.mark.parametrize(
    "when",
    [{"countdown": 1}, {"countdown": -0.2}, {"eta": "aware"}, {"eta": "naive"}, {"eta": "text"}, {}],
    ids=["countdown", "negative", "eta", "naive-eta", "eta-text", "none"],
)
def test_the_running_task_sees_the_eta_celery_gives_it(conf: Any, when: dict[str, Any]) -> None:
    """``self.request.eta`` is the text Celery puts in the message, though the released message has none (the
    worker does not hold a parked call on its timer: it is due when it arrives)."""
    at = datetime.now(UTC) + timedelta(seconds=1)
    given = {"aware": at, "naive": at.replace(tzinfo=None), "text": at.isoformat()}
    if "eta" in when:
        when = {"eta": given[when["eta"]]}
    results = launch(conf, "echo", lambda task: task.apply_async((1,), **when))
    etas = {variant: runs(conf, result.id)[0]["eta"] for variant, result in results.items()}
    assert etas["delayed"] == etas["plain"]
    assert (etas["plain"] is None) == (when == {}), etas
    untracked(conf, results["delayed"].id)


def test_a_retry_with_a_countdown_sees_the_eta_celery_gives_it(conf: Any) -> None:
    at = datetime.now(UTC).isoformat()  # the app's clock at the retry, in each variant's run
    results = launch(conf, "retry_once", lambda task: task.apply_async((at, 1)))
    assert {variant: r.get(timeout=TIMEOUT) for variant, r in results.items()} == {"plain": 1, "delayed": 1}
    etas = {variant: [run["eta"] for run in runs(conf, r.id, 2)] for variant, r in results.items()}
    assert etas["delayed"] == etas["plain"] and etas["plain"][0] is None and etas["plain"][1] is not None, etas
    untracked(conf, results["delayed"].id)


@pytest.mark.usefixtures("frozen_clock")  # both messages at one instant: one eta
def test_an_eta_message_from_a_producer_without_the_extension_runs_with_its_eta(conf: Any) -> None:
    """A message with an eta sent by Celery alone (another service, the deploy before the extension): in
    all-tasks mode the worker parks it when it receives it, and the task still sees the eta it came with."""
    alone = Celery("alone", broker=conf.app.conf.broker_url, set_as_current=False)
    alone.conf.update(broker_transport_options={"global_keyprefix": conf.PREFIX}, task_default_queue="conf")
    try:
        sent = {v: alone.send_task(f"{v}.echo", (10,), countdown=3) for v in conf.VARIANTS}
        if conf.ALL_TASKS:
            wait_for(lambda: conf.rd.find(sent["delayed"].id), TIMEOUT, "the worker to park the eta message")
        etas = {variant: runs(conf, r.id)[0]["eta"] for variant, r in sent.items()}
    finally:
        alone.close()
    assert etas["delayed"] == etas["plain"] is not None
    untracked(conf, sent["delayed"].id)


def test_send_task_by_name_parks_a_delayed_task(conf: Any) -> None:
    results = {variant: conf.app.send_task(f"{variant}.echo", args=(2,), countdown=1) for variant in conf.VARIANTS}
    entry = conf.rd.find(results["delayed"].id)
    assert entry is not None and entry.state == "delayed", "a call by name waits in Redis, not in a worker"
    assert conf.rd.find(results["plain"].id) is None
    assert {variant: r.get(timeout=TIMEOUT) for variant, r in results.items()} == {"plain": 2, "delayed": 2}
    same({variant: runs(conf, r.id) for variant, r in results.items()})


# -- expiry, revoke, cancel -----------------------------------------------------------------------


def test_a_call_past_its_expiry_is_revoked_unrun(conf: Any) -> None:
    expired_before = int(conf.rd.client.hget(conf.rd.keys.counters, "expired") or 0)
    results = launch(conf, "echo", lambda task: task.apply_async((3,), countdown=1, expires=0.5))
    for result in results.values():
        settled(result, "REVOKED")
    untracked(conf, results["delayed"].id)
    barrier(conf, 0.5)
    assert {variant: ran(conf, r.id) for variant, r in results.items()} == {"plain": 0, "delayed": 0}
    assert int(conf.rd.client.hget(conf.rd.keys.counters, "expired") or 0) == expired_before + 1


def test_revoke_of_a_waiting_call(conf: Any) -> None:
    results = launch(conf, "echo", lambda task: task.apply_async((4,), countdown=2))
    for result in results.values():
        result.revoke()
    # Every worker that hears the revoke drops a parked call from the store for good.
    untracked(conf, results["delayed"].id)
    for result in results.values():
        settled(result, "REVOKED")
        with pytest.raises(TaskRevokedError):
            result.get(timeout=TIMEOUT)
    barrier(conf, 2.5)
    assert {variant: ran(conf, r.id) for variant, r in results.items()} == {"plain": 0, "delayed": 0}


class Events:
    """Task events as a monitor (Flower) receives them, in a thread."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[dict[str, Any]] = []
        self.receiver: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.app.connection_for_read() as connection:
            self.receiver = self.app.events.Receiver(connection, handlers={"*": self.seen.append})
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> Events:
        self.thread.start()
        token = str(uuid.uuid4())

        def warm() -> bool:  # the subscription is live once an event sent now comes back
            with self.app.events.default_dispatcher() as dispatcher:
                dispatcher.send("conformance-ping", uuid=token)
            return self.of("conformance-ping", token) is not None

        wait_for(warm, 30, "the event receiver", interval=0.2)
        return self

    def of(self, kind: str, task_id: str) -> dict[str, Any] | None:
        return next((e for e in list(self.seen) if e.get("type") == kind and e.get("uuid") == task_id), None)

    def wait(self, kind: str, task_id: str) -> dict[str, Any]:
        event: dict[str, Any] = wait_for(lambda: self.of(kind, task_id), TIMEOUT, f"a {kind} event of {task_id}")
        return event

    def __exit__(self, *exc: object) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.thread.join(5)


def test_cancel_records_the_call_revoked_as_a_revoke_does(conf: Any) -> None:
    with Events(conf.app) as events:
        plain = conf.echo["plain"].apply_async((5,), countdown=1)
        plain.revoke()
        delayed = conf.echo["delayed"].apply_async((5,), countdown=60)
        assert conf.rd.cancel(delayed.id) is True
        assert conf.rd.cancel(delayed.id) is False
        for result in (plain, delayed):
            with pytest.raises(TaskRevokedError):
                settled(result, "REVOKED").get(timeout=TIMEOUT)
        fields = ("type", "uuid", "terminated", "signum", "expired")
        sent = {name: events.wait("task-revoked", r.id) for name, r in (("plain", plain), ("delayed", delayed))}
        assert {k: sent["delayed"][k] for k in fields} == {**{k: sent["plain"][k] for k in fields}, "uuid": delayed.id}
        # Events of one process reach a monitor in order: a ping sent after both cancels comes after theirs.
        with conf.app.events.default_dispatcher() as dispatcher:
            dispatcher.send("conformance-ping", uuid=delayed.id)
        events.wait("conformance-ping", delayed.id)
        revoked = [e for e in list(events.seen) if e.get("type") == "task-revoked" and e.get("uuid") == delayed.id]
        assert len(revoked) == 1, "the cancel again announced the call again"
    assert ran(conf, delayed.id) == 0


# -- the task-sent event ------------------------------------------------------------------------

#: Fields of two task-sent events that differ by nature: the call's id, when and from where in the sequence.
SENT_VOLATILE = ("uuid", "root_id", "name", "timestamp", "clock", "local_received")


class RecordingProducer(Producer):  # type: ignore[misc]  # kombu's Producer is untyped
    """The caller's producer: records what goes through it, and fails each publish of ``failing`` routing keys
    (a broker gone while the event is sent) at the channel, under kombu's retries, as Celery's own test does."""

    def __init__(self, connection: Any, failing: tuple[str, ...] = ()) -> None:
        super().__init__(connection)
        self.published: list[tuple[str, dict[str, Any]]] = []  # (routing key, retry policy)
        self.failed: list[str] = []
        channel_publish = self.channel.basic_publish

        def basic_publish(*args: Any, **kwargs: Any) -> Any:
            if kwargs["routing_key"] in failing:
                self.failed.append(kwargs["routing_key"])
                raise OSError("broker connection lost")
            return channel_publish(*args, **kwargs)

        self.channel.basic_publish = basic_publish

    def publish(self, body: Any, routing_key: str | None = None, **kwargs: Any) -> Any:
        self.published.append((routing_key or "", kwargs.get("retry_policy") or {}))
        return super().publish(body, routing_key=routing_key, **kwargs)


def sent_alike(events: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Assert the two variants' task-sent events are alike; return the plain one's fields that compare."""
    plain, delayed = (
        {k: v for k, v in events[variant].items() if k not in SENT_VOLATILE} for variant in ("plain", "delayed")
    )
    assert delayed == plain
    assert {variant: e["name"] for variant, e in events.items()} == {v: f"{v}.echo" for v in events}
    return plain


@pytest.mark.usefixtures("frozen_clock")  # both calls at one instant: one eta
@pytest.mark.parametrize("via", ["apply_async", "send_task"])
def test_the_task_sent_event_goes_through_the_callers_producer(
    conf: Any, monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    """With ``task_send_sent_event`` a parked call's task-sent event is Celery's: published through the producer
    the caller gave, with the caller's ``retry_policy`` over ``task_publish_retry_policy``, as the monitor sees it."""
    monkeypatch.setitem(conf.app.conf, "task_send_sent_event", True)
    policy = {"max_retries": 1, "interval_max": 0.5}
    producers, results = {}, {}
    with Events(conf.app) as events, conf.app.connection_for_write() as connection:
        for variant in conf.VARIANTS:
            producers[variant] = producer = RecordingProducer(connection)
            options = {"countdown": 1, "producer": producer, "retry_policy": policy}
            if via == "send_task":
                results[variant] = conf.app.send_task(f"{variant}.echo", (6,), **options)
            else:
                results[variant] = conf.echo[variant].apply_async((6,), **options)
        sent = {variant: events.wait("task-sent", r.id) for variant, r in results.items()}
    fields = sent_alike(sent)
    assert fields["eta"] is not None and fields["queue"] == "conf", fields
    # Celery's own: the caller's policy over task_publish_retry_policy (Celery 5.3.0: the caller's policy alone).
    [(_, plain_policy)] = [p for p in producers["plain"].published if p[0] == "task.sent"]
    assert plain_policy.items() >= policy.items()
    assert plain_policy.items() <= {**conf.app.conf.task_publish_retry_policy, **policy}.items()
    # The message itself is parked: only the event goes through the caller's producer, as Celery publishes it.
    assert producers["delayed"].published == [("task.sent", plain_policy)]
    assert {variant: r.get(timeout=TIMEOUT) for variant, r in results.items()} == {"plain": 6, "delayed": 6}
    untracked(conf, results["delayed"].id)


@pytest.mark.usefixtures("frozen_clock")  # both calls at one instant: one eta
def test_a_call_given_a_connection_is_parked_and_its_event_goes_through_it(
    conf: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``connection=``: Celery makes a producer on it for the call; the extension too, for the task-sent event,
    while the message is parked."""
    monkeypatch.setitem(conf.app.conf, "task_send_sent_event", True)
    with Events(conf.app) as events, conf.app.connection_for_write() as connection:
        results = launch(conf, "echo", lambda task: task.apply_async((8,), countdown=1, connection=connection))
        entry = conf.rd.find(results["delayed"].id)
        assert entry is not None and entry.state == "delayed", "the call waits in Redis"
        sent_alike({variant: events.wait("task-sent", r.id) for variant, r in results.items()})
    assert {variant: r.get(timeout=TIMEOUT) for variant, r in results.items()} == {"plain": 8, "delayed": 8}
    untracked(conf, results["delayed"].id)


def test_a_task_sent_event_that_cannot_be_published_is_buffered_as_celery_buffers_it(
    conf: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery's ``test_task_sent_event_respects_publish_retry_limit``, both ways: the caller's producer cannot
    publish the event, it is tried as often as the caller's retry policy says, and the event waits in
    Celery's buffer of events to send again; the call runs."""
    monkeypatch.setitem(conf.app.conf, "task_send_sent_event", True)
    buffered = conf.app.amqp._event_dispatcher._outbound_buffer
    monkeypatch.setattr(conf.app.amqp._event_dispatcher, "_outbound_buffer", type(buffered)())
    producers, results = {}, {}
    for variant in conf.VARIANTS:
        with conf.app.connection_for_write() as connection:
            producers[variant] = producer = RecordingProducer(connection, failing=("task.sent",))
            options = {"countdown": 0.5, "producer": producer, "retry_policy": {"max_retries": 0}}
            results[variant] = conf.echo[variant].apply_async((7,), **options)
    assert {variant: p.failed for variant, p in producers.items()} == {v: ["task.sent"] for v in conf.VARIANTS}
    # (event, routing key), and the error before Celery 5.5
    events = {entry[0]["uuid"]: entry[:2] for entry in conf.app.amqp._event_dispatcher._outbound_buffer}
    assert set(events) == {r.id for r in results.values()}
    assert {variant: events[r.id][1] for variant, r in results.items()} == dict.fromkeys(conf.VARIANTS, "task.sent")
    sent_alike(
        {variant: {**events[r.id][0], "eta": eta_form(events[r.id][0]["eta"])} for variant, r in results.items()}
    )
    assert {variant: r.get(timeout=TIMEOUT) for variant, r in results.items()} == {"plain": 7, "delayed": 7}
    untracked(conf, results["delayed"].id)


# -- retries, failures, callbacks ---------------------------------------------------------------


def test_autoretry_with_backoff_runs_until_it_succeeds(conf: Any) -> None:
    token = str(uuid.uuid4())
    results = launch(conf, "flaky", lambda task: task.apply_async((token, 2), countdown=0.5))
    records = {}
    for variant, result in results.items():
        assert result.get(timeout=TIMEOUT) == 2
        records[variant] = runs(conf, result.id, 3)
        gaps = [b["at_ms"] - a["at_ms"] for a, b in zip(records[variant], records[variant][1:], strict=False)]
        assert gaps[0] >= 1000 - 50 and gaps[1] >= 2000 - 50, f"{variant}: retry_backoff 1 s then 2 s, got {gaps}"
    assert [run["retries"] for run in same(records)] == [0, 1, 2]
    untracked(conf, results["delayed"].id)


def test_autoretry_that_runs_out_of_retries_fails(conf: Any) -> None:
    token = str(uuid.uuid4())
    results = launch(conf, "flaky", lambda task: task.apply_async((token, 99)))
    for result in results.values():
        settled(result, "FAILURE")
        assert isinstance(result.result, ValueError)
    same({variant: runs(conf, r.id, 4) for variant, r in results.items()})
    untracked(conf, results["delayed"].id)


def test_link_and_link_error_are_called(conf: Any) -> None:
    tokens = {variant: f"{variant}-{uuid.uuid4().hex[:8]}" for variant in conf.VARIANTS}
    ok = {
        v: conf.echo[v].apply_async((6,), countdown=0.5, link=conf.callback.s(tokens[v], "ok")) for v in conf.VARIANTS
    }
    bad = {
        v: conf.fail[v].apply_async(("x",), countdown=0.5, link_error=conf.callback.s(tokens[v], "error"))
        for v in conf.VARIANTS
    }

    def called(variant: str, kind: str) -> list[dict[str, Any]]:
        calls = [json.loads(r) for key in conf.marks.scan_iter("runs:*") for r in conf.marks.lrange(key, 0, -1)]
        return [c for c in calls if c["args"] and c["args"][-2:] == [tokens[variant], kind]]

    for variant in conf.VARIANTS:
        assert ok[variant].get(timeout=TIMEOUT) == 6
        settled(bad[variant], "FAILURE")
        for kind in ("ok", "error"):
            wait_for(lambda v=variant, k=kind: called(v, k), TIMEOUT, f"the {kind} callback of {variant}")
    shape = {
        v: [[type(a).__name__ for a in c["args"][:-2]] for k in ("ok", "error") for c in called(v, k)]
        for v in conf.VARIANTS
    }
    assert shape["delayed"] == shape["plain"]
    assert called("delayed", "ok")[0]["args"][0] == called("plain", "ok")[0]["args"][0] == 6


@pytest.mark.parametrize(
    ("canvas", "expected"),
    [
        (lambda add, total: chain(add.s(1, 2), add.s(10)), 13),
        (lambda add, total: group(add.s(i, i) for i in range(3)), [0, 2, 4]),
        (lambda add, total: chord((add.s(i, i) for i in range(3)), total.s()), 6),
    ],
    ids=["chain", "group", "chord"],
)
@pytest.mark.usefixtures("frozen_clock")  # both canvases at one instant: the same etas
def test_canvas_with_a_countdown(conf: Any, canvas: Callable[[Any, Any], Any], expected: Any) -> None:
    results = {v: canvas(conf.add[v], conf.total[v]).apply_async(countdown=1) for v in conf.VARIANTS}
    assert {v: r.get(timeout=TIMEOUT) for v, r in results.items()} == {"plain": expected, "delayed": expected}
    # The tasks that waited for the countdown see its eta, the others none, as with Celery: the ones sent with it
    # (from Celery 5.7, a chord's header too: Celery's test_group_or_task_countdown_delays_header) see the eta of
    # the call, the same in both; Celery before 5.7 passes a chord's countdown to its body, whose eta a worker
    # computes when the header is done.
    etas = {v: etas_of(conf, r) for v, r in results.items()}
    of_the_call = (conf.app.now() + timedelta(seconds=1)).isoformat()
    assert [eta_form(eta) for eta in etas["delayed"]] == [eta_form(eta) for eta in etas["plain"]], etas
    assert [eta == of_the_call for eta in etas["delayed"]] == [eta == of_the_call for eta in etas["plain"]], etas
    assert any(etas["plain"]), etas


def etas_of(conf: Any, result: Any) -> list[str | None]:
    """The etas the tasks of a canvas saw: its result's, a group's members', then its parents' in turn."""
    found = []
    while result is not None:
        for member in getattr(result, "results", None) or [result]:
            found.append(runs(conf, member.id)[0]["eta"])
        result = result.parent
    return found


# -- routing and message options ------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"priority": 7},
        {"queue": "conf.routed"},
        {"exchange": "conf.exchange", "routing_key": "conf.key"},
        {"headers": {"tenant": "t1", "trace": [1, 2]}},
        {"shadow": "conformance.shadowed"},
        {"time_limit": 30, "soft_time_limit": 20},
        {"expires": 600},
        {"argsrepr": "(hidden)", "kwargsrepr": "{}"},
        {"compression": "zlib"},
    ],
    ids=["priority", "queue", "exchange", "headers", "shadow", "time-limits", "expires-later", "argsrepr", "zlib"],
)
def test_message_options_reach_the_worker_alike(conf: Any, options: dict[str, Any]) -> None:
    results = launch(conf, "echo", lambda task: task.apply_async((7,), countdown=0.5, **options))
    records = {variant: runs(conf, r.id) for variant, r in results.items()}
    for record in (*records["plain"], *records["delayed"]):
        record["expires"] = record["expires"] is not None  # an instant computed at call time
    plain = same(records)
    if "queue" in options or "exchange" in options:
        assert (plain[0]["exchange"], plain[0]["routing_key"]) == (
            options.get("exchange", ""),
            options.get("routing_key", options.get("queue")),
        )
    untracked(conf, results["delayed"].id)


# -- acknowledgement, lost workers, limits, results ---------------------------------------------------


def test_acks_late(conf: Any) -> None:
    results = launch(conf, "late", lambda task: task.apply_async((8,), countdown=0.5))
    assert {v: r.get(timeout=TIMEOUT) for v, r in results.items()} == {"plain": 8, "delayed": 8}
    same({variant: runs(conf, r.id) for variant, r in results.items()})
    untracked(conf, results["delayed"].id)


def test_a_late_failure_not_acknowledged_is_rejected_and_runs_no_more(conf: Any) -> None:
    """``acks_on_failure_or_timeout = False`` (``task_acks_on_failure_or_timeout``): Celery rejects the failed
    message without requeue, and the call is not run again; nor is it by the store."""
    token = str(uuid.uuid4())
    results = launch(conf, "late_failing", lambda task: task.apply_async((token,), countdown=0.5))
    for result in results.values():
        settled(result, "FAILURE")
    untracked(conf, results["delayed"].id)
    assert {variant: ran(conf, r.id) for variant, r in results.items()} == {"plain": 1, "delayed": 1}


@prefork_only
def test_reject_on_worker_lost_runs_the_call_again(conf: Any) -> None:
    token = str(uuid.uuid4())
    results = launch(conf, "lost_then_requeued", lambda task: task.apply_async((token,), countdown=0.5))
    assert {v: r.get(timeout=TIMEOUT) for v, r in results.items()} == {"plain": "second", "delayed": "second"}
    records = {variant: runs(conf, r.id, 2) for variant, r in results.items()}
    if conf.TRACKED:
        # The store is the broker there: the requeue goes back through the store (redisdelay_skip_unacked), whose
        # next delivery counts the deliveries before it too (docs/differences.rst).
        headers = records["delayed"][1]["headers"]
        assert headers.pop("x-delivery-count") == 1, headers
    same(records)
    untracked(conf, results["delayed"].id)


@prefork_only
def test_a_lost_pool_process_fails_the_call_once(conf: Any) -> None:
    token = str(uuid.uuid4())
    results = launch(conf, "lost", lambda task: task.apply_async((token,), countdown=0.5))
    for result in results.values():
        settled(result, "FAILURE")
        assert type(result.result).__name__ == "WorkerLostError"
    untracked(conf, results["delayed"].id)  # finished as Celery sees it: not delivered again
    assert {variant: ran(conf, r.id) for variant, r in results.items()} == {"plain": 1, "delayed": 1}


@prefork_only
def test_soft_time_limit(conf: Any) -> None:
    results = launch(conf, "soft_limited", lambda task: task.apply_async(countdown=0.5))
    assert {v: r.get(timeout=TIMEOUT) for v, r in results.items()} == {"plain": "soft limit", "delayed": "soft limit"}
    untracked(conf, results["delayed"].id)


@prefork_only
def test_hard_time_limit_fails_the_call_once(conf: Any) -> None:
    results = launch(conf, "hard_limited", lambda task: task.apply_async(countdown=0.5))
    for result in results.values():
        settled(result, "FAILURE")
        assert isinstance(result.result, TimeLimitExceeded)
    untracked(conf, results["delayed"].id)  # not delivered again after its visibility timeout
    assert {variant: ran(conf, r.id) for variant, r in results.items()} == {"plain": 1, "delayed": 1}


def test_reject_without_requeue_ends_the_call(conf: Any) -> None:
    results = launch(conf, "rejects", lambda task: task.apply_async((False,), countdown=0.5))
    wait_for(lambda: all(ran(conf, r.id) for r in results.values()), TIMEOUT, "both runs")
    untracked(conf, results["delayed"].id)
    barrier(conf, 0.5)
    assert results["delayed"].state == results["plain"].state
    assert {variant: ran(conf, r.id) for variant, r in results.items()} == {"plain": 1, "delayed": 1}


def test_ignore_result(conf: Any) -> None:
    results = launch(conf, "no_result", lambda task: task.apply_async((9,), countdown=0.5))
    assert {v: r.get(timeout=5) for v, r in results.items()} == {"plain": None, "delayed": None}, "not waited for"
    same({variant: runs(conf, r.id) for variant, r in results.items()})
    untracked(conf, results["delayed"].id)
    assert {v: r.state for v, r in results.items()} == {"plain": "PENDING", "delayed": "PENDING"}
