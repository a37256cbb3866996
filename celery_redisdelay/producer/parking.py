"""Parking a call: through Celery's ``send_task`` with a producer that parks instead of publishing, or,
for a call like one parked before, rendered from its template without Celery. :func:`park_call` parks one
call of a task by its rules (:mod:`celery_redisdelay.producer.rules`), with its unique or debounce key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count
from time import sleep
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import redis
from celery.result import AsyncResult
from kombu.utils.functional import fxrange

from ..errors import RedisDelayError, ScheduleError, StoreUnavailableError
from ..message.envelope import Envelope
from ..message.marks import ETA_HEADER
from ..store.calls import CONFLICT, STORED
from ..store.limits import Gate
from ..store.meta import CallMeta, Limits, meta_json, routed
from .kept import Kept, TemplateKey, template_key
from .parking_producer import ParkingProducer
from .schedule import Due, celery_eta, resolve_due
from .templates import CallTemplate

# A debounced park that keeps losing the race for its key (each loss means another producer parked
# or released a call under it in between) gives up after this many attempts.
DEBOUNCE_ATTEMPTS = 8

if TYPE_CHECKING:
    from celery import Celery

    from ..store.depot import Depot
    from .kept import TemplateCache
    from .rules import CallRules

logger = logging.getLogger(__name__)
T = TypeVar("T")


class PublishRetry(NamedTuple):
    """How Celery retries the publish of a call, which a call's store write follows instead: ``retry`` (the call's, else
    ``task_publish_retry``) and ``policy``, ``task_publish_retry_policy`` updated with the call's ``retry_policy``
    (kombu's ``Connection.ensure`` arguments: ``max_retries``, ``interval_start``, ``interval_step``,
    ``interval_max``)."""

    retry: bool
    policy: Mapping[str, Any]

    @classmethod
    def of(cls, app: Celery, options: Mapping[str, Any]) -> PublishRetry:
        """The retry of a call with these options, as Celery's ``send_task_message`` works it out."""
        retry, given = options.get("retry"), options.get("retry_policy")
        default = app.conf.task_publish_retry_policy or {}
        return cls(
            bool(app.conf.task_publish_retry if retry is None else retry),
            dict(default, **given) if given else dict(default),
        )

    @classmethod
    def deferred(cls, app: Celery, options: Mapping[str, Any]) -> Callable[[], PublishRetry]:
        """:meth:`of`, worked out when called: :func:`retrying` calls it after a first write failed, so that a call
        whose write succeeds at once (nearly every one) reads no setting for it."""
        retry, given = options.get("retry"), options.get("retry_policy")
        return lambda: cls.of(app, {"retry": retry, "retry_policy": given})

    @classmethod
    def given(cls, envelope: Envelope) -> PublishRetry:
        """The retry Celery gave the publish of the message in ``envelope`` (worked out already)."""
        return cls(envelope.retry, envelope.retry_policy or {})


#: How a call's store writes are retried: worked out, or deferred (:meth:`PublishRetry.deferred`).
Retry = PublishRetry | Callable[[], PublishRetry]


def retrying(retry: Retry, write: Callable[[], T]) -> T:
    """``write()``, a store call for a call (its store write, the lookup of its key), tried as kombu's
    ``Connection.ensure`` tries Celery's publish: with ``retry``, again while the store is unreachable, up to
    ``max_retries`` times (None: until it answers), after ``interval_start`` seconds, then ``interval_step`` more each
    time up to ``interval_max``; without it, once. A store that answers with a refusal is not tried again.

    This is the one retry of a call's store write. The write runs inside Celery's ``producer.publish``, where kombu
    retries nothing (the parking producer's ``publish`` is not kombu's); where Celery retries the publish itself (a
    worker's callback), it passes ``retry=False`` and this tries once. The store's client retries nothing itself
    when made from a URL (redis-py's retry is off then; a connection the direct EVALSHA path finds broken is tried
    once more through redis-py's path, see store/evalsha.py), unless ``redisdelay_connection_options`` gives it a
    ``retry``, or it is a cluster client (which retries on its own). Parking or sending a call again under its id
    is safe: the scripts count it once (see park.lua and send.lua). ``retry`` may be deferred
    (:meth:`PublishRetry.deferred`): it is worked out after the first write failed."""
    try:
        return write()
    except StoreUnavailableError as exc:
        failure = exc
    how = retry if isinstance(retry, PublishRetry) else retry()
    policy = how.policy
    max_retries = policy.get("max_retries") if how.retry else 0
    start, step = float(policy.get("interval_start", 1)), float(policy.get("interval_step", 1))
    longest = float(policy.get("interval_max", 1))
    intervals = (min(value, longest) for value in fxrange(start, longest + start, step, repeatlast=True))
    for retries in count():
        unreachable = isinstance(failure.__cause__, redis.ConnectionError | redis.TimeoutError)
        if not unreachable or (max_retries is not None and retries >= max_retries):
            if retries:
                failure.add_note(f"celery-redisdelay tried {retries + 1} times (the call's retry_policy)")
            raise failure
        wait = float(next(intervals))
        logger.debug("redisdelay: %s; trying again in %.2fs (retry %d of %s)", failure, wait, retries + 1, max_retries)
        if wait > 0:
            sleep(wait)
        try:
            return write()
        except StoreUnavailableError as exc:
            failure = exc
    raise AssertionError("unreachable")  # count() never ends


@dataclass(slots=True)
class CallRequest:
    """A call to park as its producer made it: ``task``'s call with ``args``, ``kwargs`` and ``options`` (those of
    ``apply_async``, or of ``send_task`` by name), parked by ``rules`` (a delayed task is its own rules).
    ``build(call_id, producer, options)`` makes Celery build and publish its message through the parking producer
    (``apply_async`` and ``app.send_task`` each pass their own) and returns Celery's result; ``built_by`` names the
    call behind ``build`` and the options it takes by name besides ``options``: calls alike in all of it share a
    template. ``send_now``: a call due now goes onto its queue at once, tracked (``redisdelay_track_due_now``),
    instead of waiting for a release. ``result_cls`` makes the result of a call rendered from a template
    (``build`` gives it to Celery for the others), as ``send_task`` would."""

    task: Any
    rules: CallRules
    args: Any
    kwargs: Any
    task_id: str | None
    options: dict[str, Any]
    build: Callable[[str, Any, dict[str, Any]], Any]
    ignore_result: bool
    built_by: tuple[str, dict[str, Any]]
    send_now: bool = False
    result_cls: Callable[[str], AsyncResult] | None = None


@dataclass(slots=True)
class Storing:
    """How one call is stored, worked out once by :func:`park_call` for every attempt (a debounced call may be
    stored several times, under several ids) and either way of building its message (by Celery, or rendered from a
    kept template): when it is due, under which unique or debounce ``key`` (``mode``), behind which limits' ``gate``,
    the ``eta`` text Celery would write in its message, whether it is ``sending`` (due now and tracked: onto its
    queue at once, see :func:`store_call`), and how its store write is retried (``retry``). ``capture``:
    ``park_many`` takes the built messages instead; ``caller``: the producer the caller gave, for the task-sent
    event."""

    depot: Depot
    templates: TemplateCache
    task: Any
    args: Any
    kwargs: Any
    due: Due
    limits: Limits
    retry: Retry
    ignore_result: bool = False
    mode: str = ""
    key: str = ""
    gate: Gate | None = None
    eta: str | None = None
    sending: bool = False
    capture: list[tuple[Envelope, Due, Limits]] | None = None
    caller: Any = None


@contextmanager
def parking_producer(
    storing: Storing, task_id: str, learn: TemplateKey | None = None, given: tuple[Any, Any] | None = None
) -> Iterator[ParkingProducer]:
    """A producer for Celery's ``send_task`` that parks the message under ``task_id``, with the ``eta`` Celery
    would have written in it in :data:`~celery_redisdelay.message.marks.ETA_HEADER` (its ``eta`` stays None).
    What else Celery publishes for the call (its task-sent event) goes through ``storing.caller``, the producer the
    caller gave, or one of the app's pool, as Celery's ``send_task`` would publish it.

    A ``storing.mode`` of ``unique`` or ``debounce`` parks it under ``storing.key`` (see
    :meth:`CallStore.park_keyed`); the producer's ``outcome`` then tells what the store did. With ``learn``, a
    template of the call is kept under that key (see :mod:`celery_redisdelay.producer.templates`) for the calls like
    it; ``given`` are the caller's args and kwargs it is checked with.
    """
    depot, eta = storing.depot, storing.eta

    def park(envelope: Envelope) -> tuple[int, str]:
        if eta is not None:
            envelope.headers[ETA_HEADER] = eta  # the envelope's own copy of Celery's headers
        if storing.capture is not None:
            storing.capture.append((envelope, storing.due, storing.limits))
            return 1, task_id
        encoded, fast = depot.encode(envelope)
        depot.check_size(envelope.task, len(encoded))
        # A broker message's metadata names the list the release script pushes it onto.
        stored_meta: Limits | CallMeta = routed(storing.limits, fast.key) if fast else storing.limits
        send_to = fast.key if storing.sending and fast else None
        retry = PublishRetry.given(envelope)  # as Celery gave it to this publish
        status, holder = store_call(storing, task_id, encoded, stored_meta, None, send_to, retry)
        if learn is not None:
            options = dict(learn.options)
            fixed = ("argsrepr" in options, "kwargsrepr" in options)
            template = CallTemplate.of(depot.app, envelope, encoded, fast, given=given, fixed_reprs=fixed)
            storing.templates.keep(learn, template, stored_meta)
        return status, holder

    with depot.app.producer_or_acquire(storing.caller) as real:
        yield ParkingProducer(real, task_id, park, depot.accepted_content_types, eta)


def park_from(storing: Storing, kept: Kept, call_id: str) -> tuple[int, str]:
    """Park a call rendered from a kept template, without Celery: (status, id), as the parking
    producer's ``outcome`` (sent onto its queue at once when ``storing.sending``: see :func:`store_call`), tried
    by ``storing.retry``. The arguments are checked as Celery checks them first, and the result backend hears of
    the call as Celery's ``send_task`` tells it, before the message goes (the Redis backend subscribes to the
    result's channel; kept templates allow no other backend that does anything here)."""
    task, depot = storing.task, storing.depot
    args, kwargs = storing.args or (), storing.kwargs or {}
    if not isinstance(args, list | tuple):
        raise TypeError("task args must be a list or tuple")
    if not isinstance(kwargs, Mapping):
        raise TypeError("task keyword arguments must be a mapping")
    if task.typing:
        task.__header__(*args, **kwargs)
    stored = kept.template.render(call_id, args, kwargs, eta=storing.eta)
    depot.check_size(kept.template.task, len(stored))
    if not storing.ignore_result:
        task._get_app().backend.on_task_call(None, call_id)
    route = kept.meta.get("l") if storing.sending else None
    send_to = route if isinstance(route, str) else None
    stored_meta = meta_json(kept.meta, storing.key) if storing.mode else kept.stored_meta
    return store_call(storing, call_id, stored, kept.meta, stored_meta, send_to, storing.retry)


def store_call(
    storing: Storing,
    call_id: str,
    payload: bytes,
    meta: Limits | CallMeta,
    stored_meta: str | None,
    send_to: str | None,
    retry: Retry,
) -> tuple[int, str]:
    """Store a call on its home shard: (status, id of the call stored or kept). ``stored_meta`` is ``meta``'s stored
    form when known. A call due now with ``send_to`` (the queue list its broker message goes to, where the broker
    is the store's Redis) and no unique key nor limits is sent: stored in flight and pushed onto the list in one
    script (:meth:`CallStore.send`), tracked from there as a released call. Any other call is parked.

    This is where every single call is written to the store (built by Celery or rendered from a template), so the
    call's publish ``retry`` applies here, once (:func:`retrying`)."""
    depot, mode, gate = storing.depot, storing.mode, storing.gate
    if send_to is not None and not mode and gate is None:
        message_meta = stored_meta if stored_meta is not None else meta_json(meta)
        queue_timeout_ms = round(depot.settings.queue_timeout * 1000)

        def send() -> tuple[int, str]:
            depot.shards.home(call_id).send(call_id, payload, message_meta, send_to, queue_timeout_ms)
            return STORED, call_id

        return retrying(retry, send)

    def park() -> tuple[int, str]:
        status, _, holder = depot.shards.home(call_id).park_keyed(
            call_id,
            payload,
            stored_meta if stored_meta is not None else meta,
            countdown_ms=storing.due.countdown_ms,
            due_ms=storing.due.at_ms,
            mode=mode,
            key=storing.key,
            gate=gate,
        )
        return status, holder

    return retrying(retry, park)


def storing_of(request: CallRequest) -> tuple[Storing, TemplateKey | None, str | None]:
    """How ``request``'s call is stored (its options worked out once, as Celery would read them), the key its
    template is kept under (None: it is not), and the name of the lock it takes, if any. Takes from the request's
    options what is the parking's (``_redisdelay_capture``, the caller's producer, ``eta``, ``countdown``) and adds
    the task's routing defaults."""
    task, rules, args, kwargs, options = request.task, request.rules, request.args, request.kwargs, request.options
    capture = options.pop("_redisdelay_capture", None)  # park_many: build the message, do not park it
    caller = _callers_producer(task, options)
    limits, mode, key, lock_name, gate = rules.call_options(args, kwargs, options)
    app = task._get_app()
    for name, value in rules.routing_options.items():
        options.setdefault(name, value)
    eta, countdown = options.pop("eta", None), options.pop("countdown", None)
    due = resolve_due(
        countdown,
        eta,
        default_countdown=rules.default_countdown,
        timezone=app.conf.timezone if eta is not None else None,  # only an eta needs it
    )
    # The eta Celery would write in the message (its as_task_v2 takes ``now`` and ``timezone`` options too).
    now = options.get("now")
    eta_text = celery_eta(
        rules.default_countdown if countdown is None and eta is None else countdown,
        eta,
        (lambda: now) if now else app.now,
        options.get("timezone") or app.timezone,
    )
    # Calls like one Celery built before are rendered from its template (templates.py).
    via, named = request.built_by
    kept_key = template_key(task, via, {**options, **named}, limits, eta_text is not None) if capture is None else None
    storing = Storing(
        rules.depot,
        rules.templates,
        task,
        args,
        kwargs,
        due,
        limits,
        # How Celery would retry this call's publish: its store calls are tried so (the write itself by what Celery
        # hands the parking producer, which is this unless Celery retries the publish itself).
        PublishRetry.deferred(app, options),
        ignore_result=request.ignore_result,
        mode=mode,
        key=key,
        gate=gate,
        eta=eta_text,
        sending=request.send_now and due.countdown_ms == 0 and eta_text is None,
        capture=capture,
        caller=caller,
    )
    return storing, kept_key, lock_name


def park_call(request: CallRequest) -> AsyncResult:
    """Park a call (:class:`CallRequest`) by its rules, with its unique or debounce key: Celery's result of the call.
    That result is the call's: dropped, it would end the Redis result backend's subscription Celery made at the
    call. The result is marked ``ignored`` as Celery marks it (``get()`` then returns None at once)."""
    storing, kept_key, lock_name = storing_of(request)
    task, args, kwargs, options = request.task, request.args, request.kwargs, request.options
    task_id, ignore_result, result_cls = request.task_id, request.ignore_result, request.result_cls
    depot, templates, retry = storing.depot, storing.templates, storing.retry
    mode, key, gate = storing.mode, storing.key, storing.gate
    made: dict[str, AsyncResult] = {}  # Celery's results of the calls it built, by id

    def send(call_id: str) -> tuple[int, str]:
        kept = templates.get(kept_key)
        if kept is not None:
            return park_from(storing, kept, call_id)
        learn = kept_key if templates.wanted(kept_key) else None
        given = (args, kwargs) if learn is not None else None
        with parking_producer(storing, call_id, learn, given) as parking:
            # A store that is down raises StoreUnavailableError, a kombu OperationalError: Celery's send_task lets
            # it through as it is (it wraps only the connection errors that are not one).
            built = request.build(call_id, parking, dict(options))
            if isinstance(built, AsyncResult):
                made[call_id] = built
            return parking.outcome

    # A keyed call lives beside its key, a locked call beside its lock: both are one script then. A call under
    # limits lives beside them (store/limits.py): its gate's state is on one shard.
    shards = depot.shards
    beside = key or lock_name or (gate.home if gate is not None else None)
    # The first store of the process records the shards (a write): tried so too.
    store = retrying(retry, lambda: shards.for_name(beside)) if beside is not None else None

    def fresh() -> str:
        return shards.new_id(store)

    if mode and task_id is not None and shards.home(task_id) is not shards.for_name(key):
        raise ScheduleError(
            f"task_id {task_id!r} cannot be given with {mode}_key when redisdelay_shards > 1: the call must be "
            "stored on its key's shard, so celery-redisdelay chooses its id; nothing was stored"
        )
    if mode == "unique":
        holder = retrying(retry, lambda: shards.for_name(key).holder(key))
        if holder is None:
            holder = send(task_id or fresh())[1]
        return _result(task, holder, ignore_result, made, result_cls)
    if mode == "debounce":
        # The replacing call takes the id of the call it replaces, so its message is built with it.
        candidate = retrying(retry, lambda: shards.for_name(key).holder(key)) or task_id or fresh()
        return _result(task, _debounced(send, candidate, fresh, task.name, key), ignore_result, made, result_cls)
    return _result(task, send(task_id or fresh())[1], ignore_result, made, result_cls)


def _debounced(
    send: Callable[[str], tuple[int, str]], candidate: str, fresh: Callable[[], str], task: str, key: str
) -> str:
    """Park a debounced call under ``candidate`` (the id of the call it replaces, or its own), taking the id of
    whichever call holds the key when it loses a race for it: the id of the call that holds the key after it."""
    for _ in range(DEBOUNCE_ATTEMPTS):
        status, holder = send(candidate)
        if status != CONFLICT:
            return holder
        candidate = holder or fresh()
    raise RedisDelayError(
        f"could not park {task} under debounce key {key!r}: other producers kept changing it "
        f"({DEBOUNCE_ATTEMPTS} attempts); nothing was stored"
    )


def _callers_producer(task: Any, options: dict[str, Any]) -> Any:
    """The producer the caller gave (``producer``, or ``publisher``, its old name), taken out of ``options``: or
    one on the ``connection`` given, as Celery's ``send_task`` makes it. None: one of the app's pool. Celery
    publishes the call's task-sent event through it, with the call's retry policy; the message itself goes
    to the parking producer, which must be the only one Celery's ``send_task`` sees."""
    producer, publisher = options.pop("producer", None), options.pop("publisher", None)
    producer = producer or publisher
    connection = options.pop("connection", None)
    if connection:
        producer = task._get_app().amqp.Producer(connection, auto_declare=False)
    return producer


def _result(
    task: Any,
    call_id: str,
    ignored: bool,
    made: dict[str, AsyncResult],
    result_cls: Callable[[str], AsyncResult] | None = None,
) -> AsyncResult:
    """The call's result: Celery's own when Celery built the call kept (see :func:`park_call`), else a new one,
    made by ``result_cls`` when given."""
    result = made.get(call_id)
    if result is None:
        result = (result_cls or task.AsyncResult)(call_id)
    result.ignored = ignored
    return result


def park_sent(
    task: Any, rules: CallRules, given: dict[str, Any], send_task: Callable[..., Any], send_now: bool = False
) -> AsyncResult:
    """Park a call made by name, ``app.send_task(task.name, ...)``, by ``rules``: ``given`` are the arguments
    of that call as bound to ``send_task``'s signature, ``send_task`` is Celery's own. ``send_now``: see
    :func:`park_call`."""
    given = dict(given)
    options = dict(given.pop("options", None) or {})
    given.pop("name", None)  # a producer or connection given stays: park_call takes it for the task-sent event
    args, kwargs = given.pop("args", None), given.pop("kwargs", None)
    task_id, result_cls = given.pop("task_id", None), given.pop("result_cls", None)
    # Task.apply_async names its task (Celery's router and send_task may read it); it is the same for every
    # call of the task, so it is no option of the call's template.
    task_type = given.pop("task_type", None)
    built_as = {"task_type": task_type} if task_type is not None else {}
    if result_cls is not None:
        # Celery makes the call's result with it: a result made again would drop, with the first one, the Redis
        # result backend's subscription to the result that Celery made at the call.
        built_as["result_cls"] = result_cls
    options.update(given)

    def build(call_id: str, parking: Any, rest: dict[str, Any]) -> Any:
        return send_task(task.name, args, kwargs, task_id=call_id, producer=parking, **built_as, **rest)

    ignore_result = bool(options.get("ignore_result"))
    return park_call(
        CallRequest(
            task, rules, args, kwargs, task_id, options, build, ignore_result, ("send_task", {}), send_now, result_cls
        )
    )
