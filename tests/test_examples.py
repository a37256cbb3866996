"""The README's code runs as printed, against a real redis-server: the quick start, and the settings and decorators
it shows after it. Its comments are checked too (what ``rd.cancel`` answers, what ``rd.stats()`` holds)."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import redis

from celery_redisdelay.testing import RedisServer
from tests.conftest import ROOT

README = (ROOT / "README.rst").read_text()


def python_blocks(text: str) -> list[str]:
    """The ``.. code-block:: python`` blocks and the ``::`` literal blocks of Python, dedented."""
    blocks = re.findall(r"^\.\. code-block:: python\n\n((?:    .*\n|\n)+)", text, re.M)
    blocks += re.findall(r"::\n\n((?:    .*\n|\n)+)", text)
    return [textwrap.dedent(block) for block in blocks if not block.lstrip().startswith("celery ")]


def on(server: RedisServer, code: str) -> str:
    """The example pointed at the test's server, on databases no other test uses."""
    return code.replace("redis://127.0.0.1:6379/0", f"{server.url}/11").replace(
        "redis://127.0.0.1:6379/1", f"{server.url}/12"
    )


def test_the_quick_start_runs_as_printed(redis_server: RedisServer) -> None:
    (quick,) = [block for block in python_blocks(README) if "RedisDelay(app)" in block]
    names: dict[str, Any] = {}
    lines = on(redis_server, quick).splitlines()
    cancel = next(i for i, line in enumerate(lines) if line.startswith("rd.cancel("))
    stats = next(i for i, line in enumerate(lines) if line.startswith("rd.stats()"))
    redis.Redis.from_url(f"{redis_server.url}/11").flushdb()
    try:
        exec("\n".join(lines[:cancel]), names)
        cancelled = eval(lines[cancel].split("#")[0], names)
        assert cancelled is True, "the comment says True: it was still parked"
        shown = eval(lines[stats].split("#")[0], names)
        said = dict(re.findall(r"'(\w+)': (\d+)", lines[stats].split("#")[1]))
        assert {key: str(shown[key]) for key in said} == said, (shown, said)
    finally:
        if "rd" in names:
            names["rd"].client.flushdb()
        if "app" in names:
            names["app"].close()


def test_the_other_examples_run(redis_server: RedisServer) -> None:
    """The settings and the limits decorator shown after the quick start, in an app of the quick start's form."""
    (quick,) = [block for block in python_blocks(README) if "RedisDelay(app)" in block]
    setup = on(redis_server, quick.split("@rd.delayed")[0])
    others = [block for block in python_blocks(README) if "RedisDelay(app)" not in block]
    assert len(others) >= 3, others
    names: dict[str, Any] = {}
    try:
        exec(setup, names)
        for block in others:
            exec(block, names)
        assert names["app"].conf.redisdelay_all_tasks is True
        assert names["app"].conf.redisdelay_track_due_now is False
        assert names["sync_tenant"].name.endswith("sync_tenant")
    finally:
        if "app" in names:
            names["app"].close()


GUIDE = (ROOT / "docs" / "guide.rst").read_text()
#: What a guide example assumes from its page's prose, given before it runs: the objects its tasks call, and the
#: tasks the unique/debounce example names.
PRELUDE = """
from types import SimpleNamespace
trucks = SimpleNamespace(load=lambda area, parcels: None)
orders = SimpleNamespace(set_status=lambda order_id, status: None)
doc = {"title": "a document"}

@rd.delayed
def remind(user_id): ...

@rd.delayed
def reindex(user_id, doc): ...
"""


def test_the_guides_examples_run(redis_server: RedisServer) -> None:
    """Every Python example of the guide, in an app of the README's quick start, with what its prose assumes; the
    Django one needs Django's settings module: tests/django_proj/celery_app.py has its form, and test_django runs it."""
    (quick,) = [block for block in python_blocks(README) if "RedisDelay(app)" in block]
    setup = on(redis_server, quick.split("@rd.delayed")[0])
    examples = [block for block in python_blocks(GUIDE) if "DJANGO_SETTINGS_MODULE" not in block]
    assert len(examples) >= 4, examples
    redis.Redis.from_url(f"{redis_server.url}/11").flushdb()
    names: dict[str, Any] = {}
    try:
        exec(setup + PRELUDE, names)
        for block in examples:
            exec(block, names)
        rd = names["rd"]
        assert rd.stats()["batch_items"] == 1  # bind_truck.add: one parcel gathered
        first = names["remind"].apply_async((42,), countdown=3600, unique_key="user:42")
        assert names["remind"].apply_async((42,), countdown=3600, unique_key="user:42").id == first.id
    finally:
        if "rd" in names:
            names["rd"].client.flushdb()
        if "app" in names:
            names["app"].close()
