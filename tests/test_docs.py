"""The manual (``docs/``): Sphinx builds it with warnings as errors, and every page of it opens in a real browser
(Debian's chromium, headless, driven by Playwright) with its title, and no link between its pages is broken:
each ``href`` to a page of the site names a built file, and each ``#anchor`` is an element of that page.
Skipped, saying why, where Sphinx, Playwright or chromium is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

from tests.conftest import ROOT

CHROMIUM = os.environ.get("REDISDELAY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
#: The pages of the manual's table of contents, and their titles.
PAGES = {
    "index": "celery-redisdelay",
    "guide": "Using it",
    "adoption": "Adopting it in a running project",
    "differences": "Differences from Celery's own countdown",
    "settings": "Settings",
    "pools": "Worker pools",
    "how-it-works": "How it works",
    "guarantees": "Guarantees",
    "performance": "Performance",
    "operations": "Operations",
    "dashboard": "Dashboard",
    "scale-out": "Scale-out",
    "security": "Security and high availability",
    "development": "Development",
    "api": "API reference",
    "kubernetes": "Running on Kubernetes",
    "production": "Going to production",
    "upgrading": "Upgrading, rolling back and removing",
    "tracing": "Traces across the wait",
    "reference": "Reference",
    "rabbitmq": "RabbitMQ with a Redis store",
}

pytest.importorskip("sphinx", reason="Sphinx is not installed (the docs group has it)")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the test group has it)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs")
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"the manual does not build cleanly:\n{done.stdout}\n{done.stderr}"
    return out


def test_every_page_is_built(site: Path) -> None:
    assert {path.stem for path in site.glob("*.html")} >= set(PAGES)


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"no chromium at {CHROMIUM} (apt-get install chromium)")
def test_every_page_opens_in_a_browser_and_no_link_is_broken(site: Path) -> None:
    broken: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            anchors: dict[str, set[str]] = {}
            links: list[tuple[str, str]] = []
            for name, title in PAGES.items():
                page.goto((site / f"{name}.html").as_uri())
                assert page.locator("h1").first.inner_text().strip().rstrip("¶").strip() == title, name
                assert "docutils" not in page.content() or "system-message" not in page.content(), name
                anchors[name] = set(page.eval_on_selector_all("[id]", "nodes => nodes.map(n => n.id)"))
                hrefs = page.eval_on_selector_all("a[href]", "nodes => nodes.map(n => n.getAttribute('href'))")
                links += [(name, href) for href in hrefs]
            checked = 0
            for source, href in links:
                target, fragment = urldefrag(href)
                if urlsplit(target).scheme or not (target.endswith(".html") or target == ""):
                    continue  # another site, or a file (an image, the source)
                checked += 1
                page_name = Path(unquote(target)).stem if target else source
                if not (site / f"{page_name}.html").exists():
                    broken.append(f"{source}: {href} (no page)")
                elif fragment and page_name in anchors and unquote(fragment) not in anchors[page_name]:
                    broken.append(f"{source}: {href} (no such anchor)")
        finally:
            browser.close()
    assert checked > 100, "the links between the pages were not found"
    assert broken == []
