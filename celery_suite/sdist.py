"""Celery's source distribution, whose ``t/integration`` holds its integration tests: fetched once per version
into the gitignored ``.cache/celery-sdist/`` and unpacked there."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "celery-sdist"


def installed_celery() -> str:
    """The version of the Celery this Python imports."""
    return version("celery")


def unpacked(celery_version: str, cache: Path = CACHE) -> Path:
    """The folder of Celery ``celery_version``'s unpacked sdist (``<folder>/t/integration``), fetched if needed."""
    folder = cache / f"celery-{celery_version}"
    if (folder / "t" / "integration").is_dir():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    tarball = cache / f"celery-{celery_version}.tar.gz"
    if not tarball.exists():
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
        subprocess.run([*pip, "--no-binary", ":all:", f"celery=={celery_version}", "--dest", str(cache)], check=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(cache, filter="data")
    if not (folder / "t" / "integration").is_dir():
        raise RuntimeError(f"{tarball} holds no t/integration")
    return folder
