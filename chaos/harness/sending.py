"""How the runners send: producer threads at a steady pace, and each send made again until Redis takes it.

Both runners send as a careful application does: a send that raises while Redis restarts, fails over or
refuses it is made again (under the same task id, so a first send that landed after all is replaced, or,
for a call due now, runs twice), and every refusal is noted with the message number, for the report and
for the attribution of duplicates (the ledger marks such a send as sent again). What counts as a refusal
differs: the validation's runner retries only the store's own errors (anything else is a bug it must see),
the battle every error, as an application would.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .console import say

T = TypeVar("T")


def run_producers(producers: list[threading.Thread], every: float, progress: Callable[[], str]) -> None:
    """Start the producer threads and wait until all have ended, saying ``progress()`` every ``every`` seconds."""
    for producer in producers:
        producer.start()
    last = time.monotonic()
    while any(producer.is_alive() for producer in producers):
        for producer in producers:
            producer.join(1.0)
        if time.monotonic() - last >= every:
            last = time.monotonic()
            say(progress())


def paced(
    index: int, producers: int, rate: float, seconds: float, began: float, stopping: threading.Event | None = None
) -> Iterator[int]:
    """The slots of producer ``index`` of ``producers`` sending ``rate`` a second in all, for ``seconds`` from
    ``began`` (monotonic) or until ``stopping``: yields at each, on time (the producers' slots interleave)."""
    interval = producers / rate
    for step in itertools.count():
        moment = began + (step + index / producers) * interval
        delay = moment - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if time.monotonic() - began >= seconds or (stopping is not None and stopping.is_set()):
            return
        yield step


@dataclass
class Resender:
    """Makes a send again until Redis takes it, for up to ``patience`` seconds a send; notes each refusal."""

    #: The errors that are a refusal (anything else is raised at once).
    errors: tuple[type[BaseException], ...]
    patience: float
    pause: float
    #: How a refusal's error is written in the report (``str`` or ``repr``).
    describe: Callable[[BaseException], str] = repr
    #: Set, it ends the retries: the error is raised.
    stopping: threading.Event | None = None
    #: Every refusal: when (wall clock), the message number, the error.
    refused: list[dict[str, Any]] = field(default_factory=list)

    def until_taken(self, attempt: Callable[[], T], n: int) -> tuple[T, bool]:
        """``attempt()`` until it returns, for message ``n``: (its value, whether it was made again)."""
        deadline = time.monotonic() + self.patience
        retried = False
        while True:
            try:
                return attempt(), retried
            except self.errors as exc:
                if time.monotonic() > deadline or (self.stopping is not None and self.stopping.is_set()):
                    raise
                retried = True
                self.refused.append({"t": round(time.time(), 3), "n": n, "error": self.describe(exc)[:200]})
                time.sleep(self.pause)
