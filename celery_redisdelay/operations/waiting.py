"""Eta messages waiting in the broker's queues, moved into the store: ``celery -A proj redisdelay adopt``.

Producers without the extension (the deploy before it, another service) leave task messages with an eta in
the broker's queues, and kombu puts back there those a stopped worker held. A worker with
``redisdelay_park_received`` parks them as it receives them; ``adopt`` does it at once, for every queue of
the app on a Redis broker, without a worker: each message of one of the app's tasks whose eta is more than
``redisdelay_park_received_after`` away is parked as its call (the message minus its eta, due at its eta) and
taken out of its list. Where the broker is the store's Redis both happen in one script; elsewhere the park
comes first and the message is removed after it (a message parked twice is one call).

The lists are read a step at a time from their heads, where producers push; consumers pop at the tails, so
a list that changes while it is read makes the scan see some messages twice, never miss one still there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kombu.utils import json

from ..errors import RedisDelayError
from ..message.envelope import EnvelopeError
from ..message.received import envelope_of_pushed
from ..producer.adoption import park_waiting, waiting_due_ms
from ..store.broker_lists import BrokerLists, broker_lists
from ..store.calls import CONFLICT, STORED, BrokerCopy, redis_errors

if TYPE_CHECKING:
    from ..producer.rules import CallRules
    from ..store.depot import Depot

#: Messages read from a list per step.
STEP = 500


@dataclass
class AdoptReport:
    """What ``adopt`` found and did."""

    examined: int = 0  #: messages read from the queues
    waiting: int = 0  #: of those, eta messages of the app's tasks to park
    adopted: int = 0  #: parked, and taken out of their list (none with ``dry_run``)
    known: int = 0  #: the store had their call already: taken out of the list
    gone: int = 0  #: a consumer took them meanwhile
    failed: int = 0  #: could not be read as a task message (left where they are)
    finished: bool = True  #: False when the time budget ran out first

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def adopt_waiting(
    depot: Depot,
    rules_of: Callable[[Any], CallRules | None],
    *,
    dry_run: bool = False,
    budget: float = 600.0,
    step: int = STEP,
) -> AdoptReport:
    """Park the eta messages waiting in the app's queues (see the module's docstring); ``rules_of(task)``
    gives the rules of a task whose calls may be parked (the extension's ``rules_of``)."""
    report = AdoptReport()
    deadline = time.monotonic() + budget
    app = depot.app
    with broker_lists(depot) as broker:
        if not broker.redis:
            raise RedisDelayError(
                f"adopt reads the queues of a Redis broker; the broker of {depot.app.main!r} is "
                f"{broker.transport}: its workers park eta messages as they receive them "
                "(redisdelay_park_received)"
            )
        for key in depot.broker_layout.list_keys(app):
            start = 0
            while start < broker.length(key):
                if time.monotonic() > deadline:
                    report.finished = False
                    return report
                taken = 0
                for raw in broker.read(key, start, start + step - 1):  # bytes: the clients decode nothing
                    report.examined += 1
                    outcome = _adopt_one(depot, rules_of, broker, key, raw, dry_run)
                    if outcome is not None:
                        setattr(report, outcome, getattr(report, outcome) + 1)
                        report.waiting += outcome != "failed"
                        taken += outcome in ("adopted", "known", "gone") and not dry_run
                start += step - taken
    return report


def _adopt_one(
    depot: Depot,
    rules_of: Callable[[Any], CallRules | None],
    broker: BrokerLists,
    key: str,
    raw: Any,
    dry_run: bool,
) -> str | None:
    """Park one message of a list if it is an eta message of the app's; what happened (a report field), or
    None for a message left alone (no eta, near, another app's task)."""
    try:
        headers = json.loads(raw)["headers"]
        due = waiting_due_ms(depot, headers) if isinstance(headers, dict) else None
        rules = rules_of(depot.app.tasks.get(headers.get("task"))) if due is not None else None
        if due is None or rules is None:
            return None
        if dry_run:
            return "adopted"
        envelope = envelope_of_pushed(raw)
    except (ValueError, TypeError, KeyError, AttributeError, EnvelopeError):
        return "failed"
    copy = BrokerCopy("list", (key,), raw) if broker.in_store else None
    status = park_waiting(depot, rules, envelope, due, copy)
    if status == CONFLICT:
        return "gone"
    if not broker.in_store:
        with redis_errors("remove an adopted message from its queue"):
            broker.remove(key, raw)
    return "adopted" if status == STORED else "known"
