"""Sphinx configuration of the manual (``python3 dev.py docs`` builds it into docs/_build/html)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import celery_redisdelay  # noqa: E402 - the package of this checkout, for its version and the API reference

project = "celery-redisdelay"
author = "The celery-redisdelay authors"
copyright = "the celery-redisdelay authors"
# The version is written once, in celery_redisdelay/__init__.py (pyproject.toml reads it too); the manual's title
# and pages show it.
release = celery_redisdelay.__version__
version = ".".join(release.split(".")[:2])

extensions = ["sphinx.ext.autodoc"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options: dict[str, object] = {}
# Celery's and kombu's own types are not documented here: their names stand as they are.
nitpicky = False

html_theme = "furo"
html_title = f"celery-redisdelay {release}"
html_static_path: list[str] = []
exclude_patterns = ["_build"]
smartquotes = False  # the manual quotes code and settings: straight quotes, as in the README
