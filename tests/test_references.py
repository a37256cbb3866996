"""The manual's reference page is what docs/references.py writes from the code of this version: a setting, a command,
a metric or an alert added without the manual knowing fails here (``python3 dev.py references`` writes it again)."""

from __future__ import annotations

import difflib
import importlib.util
from types import ModuleType

from celery_redisdelay.settings import DEFAULTS
from celery_redisdelay.testing import RedisServer
from tests.conftest import ROOT


def references() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_references", ROOT / "docs" / "references.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_page_is_what_the_code_writes(redis_server: RedisServer) -> None:
    written = references().render(redis_server.url)
    page = (ROOT / "docs" / "reference.rst").read_text()
    diff = "\n".join(difflib.unified_diff(page.splitlines(), written.splitlines(), "docs/reference.rst", "code", n=1))
    assert written == page, f"docs/reference.rst is stale: run python3 dev.py references\n{diff}"


def test_settings_rst_describes_every_setting_and_no_other() -> None:
    described = references().described_settings((ROOT / "docs" / "settings.rst").read_text())
    assert set(DEFAULTS) - set(described) == set(), "settings.rst does not describe these"
    assert set(described) - set(DEFAULTS) == set(), "settings.rst describes settings the code does not have"
