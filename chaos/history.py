"""The store's history (per-minute counts) after a validation run, against the runner's ledger.

Every count is written by the script that makes the change it counts, so a SIGKILL of Redis loses a count
exactly when it loses the change: the history must still agree with what survived. Over the whole run
(a fresh store), with N calls acknowledged to the producer, ``lost`` of them gone in a kill, ``exposed``
parks within Redis's loss bound before the kills, and ``retried`` parks the runner sent again:

- parked: N - lost to N - lost + retried. A park sent again after its reply was lost is counted once while
  its call still waits (park.lua), so only a call released between the two attempts counts twice; the runner
  notes a park as retried when its thread saw a command fail, on redis-py's retries and on the store's own
  direct path alike (run.py);
- acknowledged: N - lost - exposed to N - lost (a call run from the broker although its park was lost
  finds nothing to acknowledge, and only a call within the bound can be one);
- dead-lettered as the validation counted; nothing cancelled, revoked or expired;
- delivered again (swept): at least the failures the consumer recorded that survived, so at least
  failures - exposed;
- released: every surviving call at least once and every swept call once more: at least
  N - lost - exposed + swept (a release given back after a failed publish counts again, so no upper bound).
"""

from __future__ import annotations

import math
import time
from typing import Any

from celery_redisdelay import RedisDelay
from celery_redisdelay.operations.history import KEPT_MINUTES, read_history

from .ledger import ITEM
from .run import Run


def check_history(run: Run, rd: RedisDelay, result: dict[str, Any]) -> dict[str, Any]:
    """Each total of the history over the run, the range the ledger allows, and whether it is in it."""
    minutes = min(KEPT_MINUTES, math.ceil((time.time() - run.started_wall) / 60) + 2)
    totals = read_history(rd.depot, minutes).totals()
    calls = len({entry.id for entry in run.ledger.entries if entry.kind != ITEM})
    lost = len(run.lost_ids)
    exposed = sum(fault.exposed or 0 for fault in run.faults)
    retried = len(run.park_retried)
    survived = calls - lost
    expected: dict[str, tuple[int, float]] = {
        "parked": (survived, survived + retried),
        "acked": (survived - exposed, survived),
        "dead_lettered": (result["dead"], result["dead"]),
        "cancelled": (0, 0),
        "revoked": (0, 0),
        "expired": (0, 0),
        "swept": (result["failures"] - exposed, math.inf),
        "released": (survived - exposed + totals["swept"], math.inf),
    }
    rows = [
        {
            "name": name,
            "history": totals[name],
            "low": low,
            "high": None if high == math.inf else high,
            "ok": low <= totals[name] <= high,
        }
        for name, (low, high) in expected.items()
    ]
    return {
        "minutes": minutes,
        "calls": calls,
        "lost": lost,
        "exposed": exposed,
        "park_retried": retried,
        "totals": rows,
        "ok": all(row["ok"] for row in rows),
    }
