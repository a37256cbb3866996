"""The parts of a chaos run's report both runners share: the summary table's layout, the fault counts, the
verdict line, and the end of a run (the table printed, the JSON written, the logs kept or deleted).

What each report holds is its runner's own (``chaos/outcome.py`` and ``chaos/report.py`` for the validation
and the soak, ``chaos/battle/report.py`` for the battle); their form is what the tests, CI and ``dev.py`` read.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..faults import Fault
from .console import say


def summary(title: str, rows: Iterable[tuple[str, str]]) -> list[str]:
    """The title, then one aligned ``name  value`` line a row."""
    rows = list(rows)
    width = max(len(name) for name, _ in rows)
    return [title, *(f"  {name:<{width}}  {value}" for name, value in rows)]


def verdict_row(data: Mapping[str, Any]) -> tuple[str, str]:
    """The summary's last row: OK, or FAILED and the problems."""
    return ("verdict", "OK" if data["ok"] else "FAILED: " + "; ".join(data.get("problems") or []))


def injected_counts(faults: list[Fault], kinds: Iterable[str]) -> dict[str, dict[str, int]]:
    """Per kind of fault: how many were planned, how many injected."""
    return {
        kind: {
            "planned": sum(fault.kind == kind for fault in faults),
            "injected": sum(fault.injected for fault in faults if fault.kind == kind),
        }
        for kind in kinds
    }


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def publish(
    data: dict[str, Any],
    table: Callable[[dict[str, Any]], str],
    path: Path,
    run_dir: Path,
    *,
    keep: bool,
    kept: str = "logs",
    files: Mapping[str, Any] | None = None,
) -> int:
    """End a run: the table printed, the report written to ``path`` as JSON, and the run's directory kept (with
    ``files`` written in it as JSON, name -> data; ``kept`` says what it holds) or deleted. The exit status."""
    data["logs"] = str(run_dir) if keep else None
    print()
    print(table(data))
    write_json(path, data)
    say(f"report written to {path}")
    if keep:
        for name, content in (files or {}).items():
            write_json(run_dir / name, content)
        say(f"{kept} kept in {run_dir}")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0 if data["ok"] else 1
