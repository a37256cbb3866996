"""The validation's store side: a validation run's own keys (``{prefix:validate:<run>}``, apart from the calls), written
by ``validate_consume.lua`` for each delivery of its messages (see ``operations/validation.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from .base import StoreBase


class Validation(StoreBase):
    """The store's method for a validation run's consumer."""

    def validate_consume(self, keys: Sequence[str], number: int, fail_every: int) -> bool:
        """One delivery of a validation message (``keys`` are the run's): whether it is recorded as processed."""
        return bool(self._scripts["validate_consume"](keys=list(keys), args=[number, fail_every]))
