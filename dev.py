#!/usr/bin/env python3
"""Development commands; needs only Python 3.11+: makes .venv, installs the project into it, runs.

python3 dev.py demo     run the example project's validation on an embedded Redis
python3 dev.py test     run the test suite (extra arguments go to pytest)
python3 dev.py lint     ruff and mypy
python3 dev.py bench    the benchmarks
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".installed"
EXTRAS = "embedded,test,lint"


def ensure_venv() -> None:
    wanted = hashlib.sha256((ROOT / "setup.cfg").read_bytes() + (ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted and PYTHON.exists():
        return
    if not PYTHON.exists():
        print(f"dev.py: creating {VENV}", flush=True)
        venv.create(VENV, with_pip=True)
    print("dev.py: installing the project and its test tools into .venv", flush=True)
    pip = [str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-e", f".[{EXTRAS}]"], cwd=ROOT, check=True)
    STAMP.write_text(wanted)


def run(*args: str) -> int:
    return subprocess.call([str(PYTHON), *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command not in {"demo", "test", "lint", "bench"}:
        print(__doc__)
        return 0 if command in {"help", "-h", "--help"} else 2
    ensure_venv()
    if command == "demo":
        return run("-m", "example_project.demo", *rest)
    if command == "test":
        return run("-m", "pytest", *rest)
    if command == "bench":
        return run("-m", "bench", *rest)
    return run("-m", "ruff", "check", ".") or run("-m", "ruff", "format", "--check", ".") or run("-m", "mypy")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
