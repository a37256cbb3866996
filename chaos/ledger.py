"""The validation's ledger: the producer's own record of what Redis told it was stored, kept outside the Redis
under test (``chaos/harness/ledger.py``, the ledger the battle keeps too, owns its records and their files).

Every park the runner makes (``apply_async`` of a message, or ``add`` of a batch item) is written, the
moment it returned, as a JSON line to a file of the run: the call id, the message number, what kind of
park it was, and the wall clock. After a SIGKILL of the store (or a failover), :meth:`Ledger.lost`
looks for every call acknowledged before the fault in the store and in the validation's record of
processed messages: a call in neither was acknowledged to the producer and is gone. What Redis itself may
lose in such a kill is :data:`chaos.harness.attribution.FSYNC_BOUND_SECONDS` of acknowledged writes.
"""

from __future__ import annotations

from .harness.attribution import FSYNC_BOUND_SECONDS  # where the tests read it
from .harness.ledger import CALL, DEBOUNCE, ITEM, LOCKED, UNIQUE, Entry, exposure
from .harness.ledger import FileLedger as Ledger  # its faults kill the store's Redis: the record is a file

__all__ = ["CALL", "DEBOUNCE", "FSYNC_BOUND_SECONDS", "ITEM", "LOCKED", "UNIQUE", "Entry", "Ledger", "exposure"]
