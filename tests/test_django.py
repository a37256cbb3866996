"""Django: Celery's Django fixup makes ``DjangoTask`` the app's task class (Celery 5.4+); a delayed task
derives from it, so ``delay_on_commit`` parks the call once the transaction commits, and not at all
when it rolls back. The project is ``tests/django_proj`` (sqlite), run in processes of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import pytest

from celery_redisdelay.testing import beat, wait_for, worker

from .conftest import ROOT

pytest.importorskip("django")
pytest.importorskip("celery.contrib.django.task", reason="DjangoTask (delay_on_commit) is Celery 5.4+")
pytestmark = pytest.mark.e2e


def test_delay_on_commit_parks_the_call_after_the_commit(redis_server: Any) -> None:
    key = f"django-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "REDISDELAY_TEST_URL": redis_server.url,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.django_proj.settings",
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.django_proj.scenario", key],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["classes"][:2] == ["record", "DelayedTask"] and "DjangoTask" in seen["classes"]
    assert (seen["inside"], seen["after_commit"], seen["after_rollback"]) == (0, 1, 1)

    marks = __import__("redis").Redis.from_url(f"{redis_server.url}/2")
    processes = [
        worker("tests.django_proj.celery_app", concurrency=1, env=env, cwd=str(ROOT)),
        beat("tests.django_proj.celery_app", env=env, cwd=str(ROOT)),
    ]
    try:
        for process in processes:
            process.start()
        wait_for(lambda: marks.lrange(key, 0, -1), 60, "the committed call to run on the Django worker")
        assert marks.lrange(key, 0, -1) == [b"committed"], "the rolled-back call was never parked"
    finally:
        for process in processes:
            process.stop()
            if sys.exc_info()[0] is not None:
                print(process.output()[-3000:])
            process.remove_files()
