"""The limits calls are under, for operators: what each allows, what waits on it and what it holds, and a way to
change a limit while everything runs (``celery -A proj redisdelay limits``).

A limit is declared in code and written by each park of a call under it (``code:<name>`` in the store's
``limits`` hash); an operator's setting (``set:<name>``) wins over it until it is reset. See
:mod:`celery_redisdelay.store.limits` and ``store/lua/lib/limits.lua``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..store.calls import CallStore, redis_errors, text
from ..store.census import gates_waiting, limit_holdings
from ..store.depot import Depot
from ..store.limits import Limit as Limit  # a limit as the command line and the dashboard set it
from ..store.limits import check_name, limit_names

#: Gates looked at per shard for the waiting counts: the report stays bounded whatever the backlog.
MOST_GATES = 1000


@dataclass
class LimitState:
    """One limit over every shard: as declared and as set, the calls waiting on it, in flight under it, and
    when its next waiting call may go (ms, by the store's clock; None when nothing waits)."""

    name: str
    declared: Limit | None
    set: Limit | None
    waiting: int = 0
    gates: int = 0
    in_flight: int = 0
    next_ms: float | None = None
    released: int = 0  # calls it let go, ever (a counter: its rate is the limit's current rate)

    @property
    def effective(self) -> Limit | None:
        return self.set or self.declared

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "declared": None if self.declared is None else self.declared.describe(),
            "set": None if self.set is None else self.set.describe(),
            "effective": None if self.effective is None else self.effective.describe(),
            "waiting": self.waiting,
            "keys_waiting": self.gates,
            "in_flight": self.in_flight,
            "next_ms": self.next_ms,
            "released": self.released,
        }


def limit_states(depot: Depot) -> dict[str, LimitState]:
    """Every limit the store knows (declared by a park, or set), with what waits on it and what it holds."""
    states: dict[str, LimitState] = {}
    for store in depot.shards.all():
        _read_store(store, states)
    return dict(sorted(states.items()))


def _read_store(store: CallStore, states: dict[str, LimitState]) -> None:
    registries = store.registries
    with redis_errors("read the limits"):
        records = registries.limits.records()
        gates = gates_waiting(registries, MOST_GATES)
        now = registries.gates.server_ms()
    for record in records:
        state = states.setdefault(record.name, LimitState(record.name, None, None))
        if record.kind == "code" and record.limit is not None:  # damaged: shown as neither (read as no limit)
            state.declared = record.limit
        elif record.kind == "set" and record.limit is not None:
            state.set = record.limit
    for gate, score, count in gates:
        for name, _ in limit_names(text(gate)):
            state = states.setdefault(name, LimitState(name, None, None))
            state.waiting += count
            state.gates += 1
            at = max(score, now)
            state.next_ms = at if state.next_ms is None else min(state.next_ms, at)
    with redis_errors("count the calls in flight under limits"):
        holdings = limit_holdings(registries, list(states))
    for state, (in_flight, released) in zip(states.values(), holdings, strict=True):
        state.in_flight += in_flight
        state.released += released


def set_limit(depot: Depot, name: str, limit: Limit | None) -> None:
    """Set a limit (``task:<task name>`` or ``quota:<quota name>``) on every shard, over what the code declares;
    ``None`` resets it to the code's. The next release goes by it."""
    check_name(name, "a limit's name")
    if not name.startswith(("task:", "quota:")):
        raise ValueError(f"a limit's name is task:<task name> or quota:<quota name>, not {name!r}")
    for store in depot.shards.all():
        with redis_errors(f"set limit {name}"):
            store.registries.limits.set(name, limit)
