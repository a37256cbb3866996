"""Limits that hold across every worker: a task's rate and concurrency, per key, and quotas shared by tasks.

A limit is declared in code (``@rd.delayed(limit_rate="100/m", limit_concurrency=5, limit_key="tenant:{tenant}",
limit_quota="crm-api")``, quotas in the ``redisdelay_quotas`` setting) and enforced where the calls are
released: a call under limits waits in Redis, past its due time if it must, until every limit it is under lets it
go (``lua/release.lua``, ``lua/lib/limits.lua``). Each call carries its *gate*: the limit instances it is
under, one per line, each a limit's name, a tab and the key its arguments gave. Each park also writes the limits
as the code declares them, so that the release reads them from Redis, where an operator may override them
(``celery -A proj redisdelay limits set``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError, ScheduleError

#: Celery's rate units (``celery.utils.time.rate``): per second, minute, hour.
RATE_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000}
#: The options of ``@rd.delayed`` (and, prefixed ``redisdelay_``, of ``@app.task``) that declare limits.
LIMIT_OPTIONS = ("limit_rate", "limit_concurrency", "limit_key", "limit_quota")
TASK_LIMIT = "task:"
QUOTA_LIMIT = "quota:"


def parse_rate(value: Any, option: str, of: str = "") -> tuple[float, int]:
    """A rate in Celery's syntax (``"100/m"``, ``"5/s"``, ``"10/h"``, or a number: per second) as (calls, per
    ms); ConfigurationError naming ``option`` (of ``of``, the task) when it is not a positive rate."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigurationError(f"{option}={value!r}{of} must be a rate such as '100/m', '5/s' or '10/h'")
    text = str(value).strip()
    calls, _, unit = text.partition("/")
    per_ms = RATE_UNITS_MS.get(unit.strip() or "s")
    try:
        number = float(calls)
    except ValueError:
        number = math.nan
    if per_ms is None or not math.isfinite(number) or number <= 0:
        raise ConfigurationError(
            f"{option}={value!r}{of} is not a rate: give calls per second, minute or hour, more than 0, "
            "as Celery's rate_limit does ('100/m', '5/s', '10/h')"
        )
    return number, per_ms


@dataclass(frozen=True)
class Limit:
    """What one limit allows: each rate (calls per ms), and at most ``concurrency`` calls in flight."""

    rates: tuple[tuple[float, int], ...] = ()
    concurrency: int | None = None

    @classmethod
    def declared(cls, rate: Any, concurrency: Any, names: tuple[str, str], of: str = "") -> Limit:
        """A limit from its options (``rate``: one rate or several; ``concurrency``: a positive integer or
        None), checked; ConfigurationError names the option (``names``: the rate's, the concurrency's; ``of``:
        whose) and the value."""
        rates = () if rate is None else rate if isinstance(rate, (list, tuple)) else (rate,)
        parsed = tuple(parse_rate(one, names[0], of) for one in rates)
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise ConfigurationError(f"{names[1]}={concurrency!r}{of} must be an integer of 1 or more")
        return cls(parsed, concurrency)

    @property
    def empty(self) -> bool:
        return not self.rates and self.concurrency is None

    def to_json(self) -> str:
        """The stored form the scripts read: ``{"r": [[calls, per ms], ...], "c": concurrency}``."""
        spec: dict[str, Any] = {"r": [[_number(calls), per] for calls, per in self.rates]}
        if self.concurrency is not None:
            spec["c"] = self.concurrency
        return json.dumps(spec, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Limit:
        spec = json.loads(raw)
        return cls(tuple((float(calls), int(per)) for calls, per in spec.get("r", ())), spec.get("c"))

    def describe(self) -> str:
        """``100/m, 5 at once``: as a person writes it."""
        units = {ms: unit for unit, ms in RATE_UNITS_MS.items()}
        parts = [f"{_number(calls)}/{units.get(per, f'{per}ms')}" for calls, per in self.rates]
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} at once")
        return ", ".join(parts) or "no limit"


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def quotas_from_conf(conf: Mapping[str, Any]) -> dict[str, Limit]:
    """The ``redisdelay_quotas`` setting, checked: ``{"crm-api": {"rate": "600/m", "concurrency": 10}}``."""
    given = conf.get("redisdelay_quotas") or {}
    if not isinstance(given, Mapping):
        raise ConfigurationError(f"redisdelay_quotas must be a dict of quota name -> limits, not {given!r}")
    quotas = {}
    for name, options in given.items():
        check_name(name, "a quota name in redisdelay_quotas")
        if not isinstance(options, Mapping) or set(options) - {"rate", "concurrency"}:
            raise ConfigurationError(
                f"redisdelay_quotas[{name!r}] must be a dict with 'rate' and/or 'concurrency', not {options!r}"
            )
        where = f"redisdelay_quotas[{name!r}]"
        limit = Limit.declared(
            options.get("rate"), options.get("concurrency"), (f"{where} rate", f"{where} concurrency")
        )
        if limit.empty:
            raise ConfigurationError(f"redisdelay_quotas[{name!r}] sets neither a rate nor a concurrency")
        quotas[name] = limit
    return quotas


def check_name(name: Any, what: str) -> None:
    if not isinstance(name, str) or not name or any(c in name for c in "\t\n\0"):
        raise ConfigurationError(f"{what} must be a non-empty string without tabs or newlines, not {name!r}")


@dataclass(frozen=True)
class Gate:
    """The limits one call is under: its gate (the limit instances, as the scripts read them), the limits
    as declared (name, stored form) for the park to write, and the name that chooses its shard."""

    gate: str
    declared: tuple[tuple[str, str], ...]
    home: str


@dataclass(frozen=True)
class TaskLimits:
    """A task's own limit (rate and concurrency, per key when ``key`` is a template) and the quotas it shares."""

    task: str
    own: Limit
    key: str | None
    quotas: tuple[str, ...]

    @classmethod
    def declared(cls, task: str, options: Mapping[str, Any]) -> TaskLimits | None:
        """The limits of a task from its options (``limit_rate``, ...); None when it has none. Checked here,
        at decoration, quota names included (which quotas exist is checked at the first call)."""
        names = ("limit_rate", "limit_concurrency")
        own = Limit.declared(options.get("limit_rate"), options.get("limit_concurrency"), names, f" of {task}")
        key = options.get("limit_key")
        if key is not None and (not isinstance(key, str) or not key):
            raise ConfigurationError(f"limit_key of {task} must be a non-empty template string, not {key!r}")
        if key is not None and own.empty:
            raise ConfigurationError(
                f"limit_key={key!r} of {task} needs limit_rate or limit_concurrency: the key says whose limit it is"
            )
        quota = options.get("limit_quota")
        quotas = () if quota is None else tuple(quota) if isinstance(quota, (list, tuple)) else (quota,)
        for name in quotas:
            check_name(name, f"limit_quota of {task}")
        if own.empty and not quotas:
            return None
        return cls(task, own, key, quotas)

    def gate(self, key: str, quotas: Mapping[str, Limit]) -> Gate:
        """The gate of a call whose arguments gave ``key`` (``""`` without ``limit_key``)."""
        if any(c in key for c in "\t\n\0"):
            raise ScheduleError(f"the limit_key of {self.task} gave {key!r}: a limit key cannot hold tabs or newlines")
        lines, declared = [], []
        if not self.own.empty:
            lines.append(f"{TASK_LIMIT}{self.task}\t{key}")
            declared.append((TASK_LIMIT + self.task, self.own.to_json()))
        for name in self.quotas:
            limit = quotas.get(name)
            if limit is None:
                raise ConfigurationError(
                    f"limit_quota={name!r} of {self.task} names no quota of redisdelay_quotas "
                    f"(quotas: {', '.join(sorted(quotas)) or 'none'}); nothing was stored"
                )
            lines.append(f"{QUOTA_LIMIT}{name}\t")
            declared.append((QUOTA_LIMIT + name, limit.to_json()))
        # A quota is shared: its calls live on its shard. Without one, a keyed limit spreads over the shards.
        home = lines[-1] if self.quotas else lines[0]
        return Gate("\n".join(lines), tuple(declared), home)


def limit_names(gate: str) -> Sequence[tuple[str, str]]:
    """The (limit name, key) of each instance of a gate."""
    return [(name, key) for name, _, key in (line.partition("\t") for line in gate.split("\n") if line)]
