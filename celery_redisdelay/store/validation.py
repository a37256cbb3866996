"""The validation's store side: a validation run's own keys (``{prefix:validate:<run>}``, apart from the calls), written
by ``validate_consume.lua`` for each delivery of its messages (see ``operations/validation.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import StoreBase, text


class Validation(StoreBase):
    """The store's method for a validation run's consumer."""

    def validate_consume(self, keys: Sequence[str], number: int, fail_every: int) -> bool:
        """One delivery of a validation message (``keys`` are the run's): whether it is recorded as processed."""
        return bool(self._scripts["validate_consume"](keys=list(keys), args=[number, fail_every]))

    def validation_run(self, run_id: str) -> ValidationRun:
        """The record of validation run ``run_id``."""
        return ValidationRun(self, run_id)


class ValidationRun:
    """One validation run's record: ``processed`` (message number -> deliveries that recorded it processed) and
    ``counters`` (``deliveries``, ``failures``), under the run's own hash tag."""

    def __init__(self, store: Validation, run_id: str) -> None:
        self.store = store
        self.keys = store.keys.validation_keys(run_id)

    def consume(self, number: int, fail_every: int) -> bool:
        """One delivery of message ``number``: whether it is recorded as processed (else it fails on purpose)."""
        return self.store.validate_consume(self.keys, number, fail_every)

    def processed_count(self) -> int:
        """How many of the run's messages were processed at least once."""
        return int(self.store.client.hlen(self.keys[0]))

    def results(self) -> tuple[dict[int, int], dict[str, int]]:
        """Per message processed, how many times; and the run's counters."""
        processed: Any = self.store.client.hgetall(self.keys[0])
        counters: Any = self.store.client.hgetall(self.keys[1])
        times = {int(number): int(n) for number, n in processed.items()}
        return times, {text(key): int(value) for key, value in counters.items()}

    def forget(self) -> None:
        """Delete the run's record."""
        self.store.client.delete(*self.keys)
