"""What Flower shows of the calls the store keeps, next to what the store itself shows (docs/tracing.rst).

A real worker sending events, and Flower 2 reading them (its HTTP API): a parked call is in the store's listing and
not in Flower's task list until it is released; then Flower lists it as a plain call, without an eta.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from celery_redisdelay.testing import CeleryProcess, RedisServer, free_port, wait_for, worker
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e


class Watched:
    def __init__(self, proj: Any, port: int) -> None:
        self.proj = proj
        self.port = port

    def tasks(self) -> dict[str, dict[str, Any]]:
        """Flower's task list: id -> what Flower knows of the task."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/tasks", timeout=5) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    def answers(self) -> bool:
        try:
            self.tasks()
        except OSError:
            return False
        return True


@pytest.fixture(scope="module")
def watched(redis_server: RedisServer) -> Iterator[Watched]:
    env = {"REDISDELAY_TEST_URL": redis_server.url, "PYTHONPATH": str(ROOT), "FLOWER_UNAUTHENTICATED_API": "true"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REDISDELAY_TEST_URL", redis_server.url)
        from tests import flower_proj

        flower_proj.rd.depot.client.flushdb()
        port = free_port()
        running = worker("tests.flower_proj", concurrency=2, queues="flower", env=env, cwd=str(ROOT), extra=["-E"])
        flower = CeleryProcess("tests.flower_proj", ["flower", "--address=127.0.0.1", f"--port={port}"], env, str(ROOT))
        running.start()
        flower.start()
        try:
            wait_for(lambda: "ready." in running.output(), 60, "the worker to be ready")
            state = Watched(flower_proj, port)
            wait_for(state.answers, 60, "Flower to answer")
            yield state
        finally:
            for process in (flower, running):
                process.stop()
                print(process.output()[-2000:])
                process.remove_files()


def test_a_parked_call_shows_in_flower_once_released_and_as_a_plain_call(watched: Watched) -> None:
    proj = watched.proj
    parked = proj.echo.apply_async((1,), countdown=4)
    now = proj.echo.delay(2)
    # Flower has seen the call due now, so its events flow; the parked one is in the store only.
    wait_for(lambda: watched.tasks().get(now.id, {}).get("state") == "SUCCESS", 30, "Flower to list the call due now")
    entry = proj.rd.find(parked.id)
    assert entry is not None and entry.state == "delayed", entry
    assert parked.id not in watched.tasks()
    # Released: Flower lists it, run, with no eta (it was reached in the store).
    assert parked.get(timeout=30) == 1
    shown = wait_for(
        lambda: (row := watched.tasks().get(parked.id)) and row.get("state") == "SUCCESS" and row,
        30,
        "Flower to list the released call",
    )
    assert shown["eta"] is None, shown
    # Its acknowledgement reaches the store from the pool process's outbox, a moment after the result.
    wait_for(lambda: proj.rd.find(parked.id) is None, 30, "the released call to be acknowledged")
