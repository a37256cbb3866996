"""What the battle sends and which faults it injects, both drawn from the seed: the same seed gives the
same calls and the same fault schedule, with the extension or with plain Celery.

The calls (:class:`Mix`): each call is one of :data:`KINDS`, drawn with the shares given, and its
countdown, sleep, lock or batch key drawn with it, from one stream of the seeded RNG, so call ``n`` is
the same in every run of a seed (whichever producer thread sends it). Countdowns are log-uniform from
:data:`MIN_COUNTDOWN` to the longest (10 minutes, times ``--countdown-scale`` for short runs): most are
short, some are long.

The faults (:func:`schedule`): ``rate per minute * minutes`` of each kind (at least one of each kind whose
rate is above 0), at moments drawn uniformly over the sending time, each worker fault on a drawn worker.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from ..faults import (
    BEAT_KILL,
    BROKER_RESTART,
    CLIENT_KILL,
    REDIS_KILL,
    REDIS_RESTART,
    RELEASER_KILL,
    WORKER_KILL,
    Fault,
)
from .config import LOCK_SLOTS

NOW, COUNTDOWN, SLEEP, RETRY, BATCH, LOCK, CANCEL = "now", "countdown", "sleep", "retry", "batch", "lock", "cancel"
KINDS = (NOW, COUNTDOWN, SLEEP, RETRY, BATCH, LOCK, CANCEL)
DEFAULT_SHARES = {NOW: 0.55, COUNTDOWN: 0.20, SLEEP: 0.05, RETRY: 0.05, BATCH: 0.07, LOCK: 0.04, CANCEL: 0.04}
MIN_COUNTDOWN = 1.0
LONGEST_COUNTDOWN = 600.0
#: A retry's countdown is at most this (times the scale); a sleeping call sleeps this long.
LONGEST_RETRY_COUNTDOWN = 30.0
SLEEP_RANGE = (0.1, 1.5)
LOCK_SLEEP_RANGE = (0.05, 0.3)
#: A cancel comes this long after the park; the call's countdown outlasts it by CANCEL_MARGIN at least.
CANCEL_AFTER_RANGE = (0.2, 2.0)
CANCEL_MARGIN = 3.0
BATCH_KEYS = 4

WORKER_TERM = "worker_term"
FAULT_KINDS = (
    WORKER_KILL,
    WORKER_TERM,
    BEAT_KILL,
    RELEASER_KILL,
    REDIS_KILL,
    REDIS_RESTART,
    CLIENT_KILL,
    BROKER_RESTART,
)
#: Faults fall between these shares of the sending time.
EARLIEST, LATEST = 0.05, 0.95


@dataclass(frozen=True)
class Call:
    """One call of the battle: message ``n`` of ``kind``."""

    n: int
    kind: str
    countdown: float = 0.0  # 0: due now
    sleep: float = 0.0
    retry_countdown: float = 0.0
    slot: int = 0  # the lock
    key: str = ""  # the batch key
    cancel_after: float = 0.0


def parse_shares(text: str | None) -> dict[str, float]:
    """``now=0.6,countdown=0.2,...``: the kinds named replace the defaults' shares; all are normalised."""
    shares = dict(DEFAULT_SHARES)
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in KINDS:
            raise ValueError(f"unknown kind {name!r} in the mix (kinds: {', '.join(KINDS)})")
        share = float(value)
        if not share >= 0 or math.isinf(share):
            raise ValueError(f"the share of {name} must be a number >= 0")
        shares[name] = share
    total = sum(shares.values())
    if total <= 0:
        raise ValueError("the mix has no calls")
    return {name: share / total for name, share in shares.items()}


class Mix:
    """The seeded stream of calls; thread-safe."""

    def __init__(self, seed: int, shares: Mapping[str, float], countdown_scale: float = 1.0) -> None:
        self.rng = random.Random(f"battle-calls-{seed}")
        self.kinds = [kind for kind in KINDS if shares.get(kind, 0) > 0]
        self.weights = [shares[kind] for kind in self.kinds]
        self.longest = max(MIN_COUNTDOWN, LONGEST_COUNTDOWN * countdown_scale)
        self.longest_retry = max(MIN_COUNTDOWN, min(self.longest, LONGEST_RETRY_COUNTDOWN * countdown_scale))
        self._lock = threading.Lock()
        self._n = 0

    def countdown(self, low: float, high: float) -> float:
        high = max(low, high)
        return round(math.exp(self.rng.uniform(math.log(low), math.log(high))), 3)

    def next(self) -> Call:
        with self._lock:
            n = self._n
            self._n += 1
            rng = self.rng
            kind = rng.choices(self.kinds, self.weights)[0]
            if kind == COUNTDOWN:
                return Call(n, kind, countdown=self.countdown(MIN_COUNTDOWN, self.longest))
            if kind == SLEEP:
                countdown = self.countdown(MIN_COUNTDOWN, self.longest) if rng.random() < 0.5 else 0.0
                return Call(n, kind, countdown=countdown, sleep=round(rng.uniform(*SLEEP_RANGE), 3))
            if kind == RETRY:
                return Call(n, kind, retry_countdown=self.countdown(MIN_COUNTDOWN, self.longest_retry))
            if kind == BATCH:
                return Call(n, kind, key=f"k{rng.randrange(BATCH_KEYS)}")
            if kind == LOCK:
                return Call(n, kind, slot=rng.randrange(LOCK_SLOTS), sleep=round(rng.uniform(*LOCK_SLEEP_RANGE), 3))
            if kind == CANCEL:
                after = round(rng.uniform(*CANCEL_AFTER_RANGE), 3)
                least = after + CANCEL_MARGIN
                return Call(n, kind, countdown=self.countdown(least, max(least, self.longest)), cancel_after=after)
            return Call(n, NOW)

    @property
    def drawn(self) -> int:
        return self._n


def fault_counts(rates: Mapping[str, float], minutes: float) -> dict[str, int]:
    """How many faults of each kind: the rate per minute times the minutes, at least one if the rate is above 0."""
    return {kind: max(1, round(rate * minutes)) if rate > 0 else 0 for kind, rate in rates.items()}


def schedule(counts: Mapping[str, int], seed: int, workers: int) -> list[Fault]:
    """The faults, at shares of the sending time drawn from the seed, in order; worker faults on a drawn worker."""
    rng = random.Random(f"battle-faults-{seed}")
    faults = []
    for kind in FAULT_KINDS:
        for _ in range(counts.get(kind, 0)):
            at = round(rng.uniform(EARLIEST, LATEST), 5)
            slot = rng.randrange(workers) if kind in (WORKER_KILL, WORKER_TERM) else 0
            faults.append(Fault(kind, at, slot=slot))
    return sorted(faults, key=lambda fault: fault.at)
