"""dev.py release-check's own checks, on inputs made here: nothing is built or installed. Each bad input must
give one line that names what is wrong."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import dev

CHANGELOG = """\
=========
Changelog
=========

0.5.0 - 2026-11-28
------------------

Added
~~~~~

* something.

0.4.0 - 2026-11-26
------------------

Fixed
~~~~~

* something else.
"""


def test_the_checkout_s_version_has_the_changelog_s_newest_entry() -> None:
    version = dev.package_version(dev.VERSION_FILE.read_text())
    assert dev.changelog_problem(dev.CHANGELOG.read_text(), version) is None
    assert dev.changelog_versions(dev.CHANGELOG.read_text())[0] == version


def test_changelog_versions_are_read_newest_first() -> None:
    assert dev.changelog_versions(CHANGELOG) == ["0.5.0", "0.4.0"]
    assert dev.changelog_problem(CHANGELOG, "0.5.0") is None


def test_a_version_the_changelog_does_not_have_is_named() -> None:
    problem = dev.changelog_problem(CHANGELOG, "0.6.0")
    assert problem is not None and "\n" not in problem
    assert "version and changelog disagree" in problem and "0.6.0" in problem and "newest is 0.5.0" in problem


def test_a_version_that_is_not_the_newest_entry_is_named() -> None:
    problem = dev.changelog_problem(CHANGELOG, "0.4.0")
    assert problem == "version and changelog disagree: the package is 0.4.0, CHANGELOG.rst's newest entry is 0.5.0"


def test_an_unreleased_entry_or_no_entry_is_named() -> None:
    unreleased = CHANGELOG.replace("0.5.0 - 2026-11-28\n------------------", "Unreleased\n----------")
    assert "Unreleased" in (dev.changelog_problem(unreleased, "0.4.0") or "")
    problem = dev.changelog_problem("Changelog\n=========\n", "0.5.0")
    assert problem is not None and "no 'X.Y.Z - YYYY-MM-DD' entry" in problem


def test_the_version_is_read_from_the_package_s_init() -> None:
    assert dev.package_version('"""Doc."""\n\n__version__ = "1.2.3"\n') == "1.2.3"
    with pytest.raises(SystemExit, match="has no __version__"):
        dev.package_version("VERSION = '1.2.3'\n")


def test_a_file_the_sdist_lacks_is_named() -> None:
    members = ["pkg-0.5.0", "pkg-0.5.0/LICENSE", "pkg-0.5.0/docs/conf.py", "pkg-0.5.0/tests/test_a.py"]
    required = ["LICENSE", "docs/conf.py", "docs/index.rst", "tests/test_a.py", "tests/test_b.py"]
    assert dev.sdist_missing(members, required) == ["docs/index.rst", "tests/test_b.py"]
    assert dev.sdist_missing([*members, "pkg-0.5.0/docs/index.rst", "pkg-0.5.0/tests/test_b.py"], required) == []


def test_what_the_sdist_must_hold_comes_from_the_checkout(tmp_path: Path) -> None:
    for name in ("LICENSE", "docs/conf.py", "docs/index.rst", "tests/test_a.py", "tests/data/x.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    required = dev.sdist_required(tmp_path, ("LICENSE", "docs/*.rst", "docs/conf.py", "tests/*.py", "CHANGELOG.rst"))
    # A pattern that matches nothing is missing as itself: the sdist cannot hold what the checkout lacks.
    assert required == ["LICENSE", "docs/index.rst", "docs/conf.py", "tests/test_a.py", "CHANGELOG.rst"]
    assert "tests/test_release_check.py" in dev.sdist_required(dev.ROOT)


def test_the_supported_pythons_are_the_classifiers_from_requires_python_on() -> None:
    declared = dev.project()["project"]
    assert dev.supported_pythons() == ["3.11", "3.12", "3.13"]
    assert declared["requires-python"] == f">={dev.supported_pythons()[0]}"
    with pytest.raises(SystemExit, match=r"not one pyproject.toml's classifiers declare \(3.11, 3.12, 3.13\)"):
        dev.checked_version("3.10")


def stub(path: Path, body: str) -> Path:
    """An executable shell script at ``path``: a stand-in for an interpreter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_python_is_found_on_path_then_under_pyenv_newest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pyenv shim of a version that is not selected is on PATH and exits 127: it is passed over.
    stub(tmp_path / "bin" / "python3.99", "exit 127")
    older = stub(tmp_path / "pyenv" / "versions" / "3.99.2" / "bin" / "python3.99", "echo 3.99")
    newer = stub(tmp_path / "pyenv" / "versions" / "3.99.10" / "bin" / "python3.99", "echo 3.99")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    assert dev.python_candidates("3.99") == [tmp_path / "bin" / "python3.99", newer, older]
    assert dev.find_python("3.99") == newer
    (tmp_path / "bin" / "python3.99").unlink()
    on_path = stub(tmp_path / "bin" / "python3.99", "echo 3.99")
    assert dev.find_python("3.99") == on_path


def test_a_missing_python_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    stub(tmp_path / "pyenv" / "versions" / "3.99.1" / "bin" / "python3.99", "echo 3.98")  # not the one it says
    with pytest.raises(SystemExit) as missing:
        dev.find_python("3.99")
    message = str(missing.value)
    assert "\n" not in message and "Python 3.99 not found" in message
    assert "pyenv install 3.99" in message and "the OS package python3.99" in message
    # The release check names it as its own line, and builds nothing for it.
    problem = dev.install_problem("3.99", tmp_path / "celery_redisdelay-0.5.0-py3-none-any.whl", "0.5.0")
    assert problem is not None and problem.startswith("Python 3.99 not found")


def test_wheel_demo_takes_its_pythons_apart_from_the_demo_s_arguments() -> None:
    assert dev.demo_pythons(["--count", "100"]) == ([dev.running_python()], ["--count", "100"])
    assert dev.demo_pythons(["--python", "3.12,3.13", "--count", "100", "--python", "3.11"]) == (
        ["3.12", "3.13", "3.11"],
        ["--count", "100"],
    )
    with pytest.raises(SystemExit, match=r"not one pyproject\.toml's classifiers declare"):
        dev.demo_pythons(["--python", "2.7"])
    with pytest.raises(SystemExit, match="--python needs a version"):
        dev.demo_pythons(["--python"])
