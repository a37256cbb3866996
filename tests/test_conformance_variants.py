"""The conformance suite (``tests/test_conformance.py``, on prefork with ``@rd.delayed``) in its other variants:

* ``all-tasks``: ``redisdelay_all_tasks`` on, each task's second variant a plain ``@app.task`` or
  ``@shared_task`` that the setting adopts, compared with the same task left to Celery;
* ``tracked``: the same with ``redisdelay_track_due_now``, the second variant's calls due now tracked too;
* the worker on Celery's ``threads`` and ``gevent`` pools (the tests of what only prefork has, time limits and a
  pool process that dies, skip, saying so).

The app is built when ``tests/conformance_app.py`` is imported, so each variant runs the suite in a pytest
process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.e2e

VARIANTS = {
    "all-tasks": {"REDISDELAY_CONFORMANCE_MODE": "all-tasks"},
    "tracked": {"REDISDELAY_CONFORMANCE_MODE": "tracked"},
    "threads": {"REDISDELAY_CONFORMANCE_POOL": "threads"},
    "gevent": {"REDISDELAY_CONFORMANCE_POOL": "gevent"},
}


#: The pool variants run with ``python3 dev.py test --slow``: tests/test_pools.py runs every feature under each pool.
SLOW = {"threads", "gevent"}


@pytest.mark.parametrize(
    "variant", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in VARIANTS]
)
def test_the_conformance_suite(variant: str) -> None:
    env = {**os.environ, **VARIANTS[variant], "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "tests/test_conformance.py"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, f"{done.stdout[-12000:]}\n{done.stderr[-3000:]}"
    assert " passed" in summary and "failed" not in summary, summary
