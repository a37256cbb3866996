"""The outcome of each test, read from pytest's JUnit XML, and the comparison of the modes."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

PASSED = "passed"


def read(junit_xml: Path) -> dict[str, str]:
    """Test id (``module::Class::name``) -> passed, failed, error or skipped, from a JUnit XML report."""
    outcomes: dict[str, str] = {}
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            outcomes[test] = "failed"
        elif "error" in kinds:
            outcomes[test] = "error"
        elif "skipped" in kinds:
            outcomes[test] = "skipped"
        else:
            outcomes[test] = PASSED
    return outcomes


@dataclass
class Comparison:
    """What passes with Celery alone and not in another mode: explained (a known difference) or not."""

    rows: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # test, outcome per mode
    explained: dict[str, dict[str, str]] = field(default_factory=dict)  # mode -> test -> reason
    unexplained: dict[str, list[str]] = field(default_factory=dict)  # mode -> tests

    @property
    def ok(self) -> bool:
        return not any(self.unexplained.values())


def compare(results: dict[str, dict[str, str]], differences: dict[str, dict[str, str]]) -> Comparison:
    """Compare each mode's outcomes with ``plain``'s; ``differences[mode][test]`` is why a test may not pass."""
    comparison = Comparison()
    plain = results.get("plain", {})
    tests = sorted(set().union(*(outcomes.keys() for outcomes in results.values())))
    for test in tests:
        comparison.rows.append((test, {mode: outcomes.get(test, "-") for mode, outcomes in results.items()}))
    for mode, outcomes in results.items():
        if mode == "plain":
            continue
        known = differences.get(mode, {})
        for test, outcome in plain.items():
            if outcome != PASSED or outcomes.get(test) == PASSED:
                continue
            if test in known:
                comparison.explained.setdefault(mode, {})[test] = known[test]
            else:
                comparison.unexplained.setdefault(mode, []).append(test)
    return comparison
