"""The rows of the results table, the table itself, and the JSON file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NOT_IMPLEMENTED = "not implemented"
FAILED = "failed"
SKIPPED = "skipped"  # the figure cannot run here (its topology is unavailable); its result says why


@dataclass
class Row:
    """One line of the table: our number, the baseline measured in the same run, and the target.

    ``ours`` is a number, or :data:`NOT_IMPLEMENTED` / :data:`FAILED` / :data:`SKIPPED`. ``ratio`` is ours / baseline.
    ``met`` is None where there is no target.
    """

    figure: str
    ours: float | str
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def ratio(ours: float | None, baseline: float | None) -> float | None:
    if ours is None or baseline is None or baseline == 0:
        return None
    return ours / baseline


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100)
    return float(ordered[int(rank) - 1])


def _number(value: float, unit: str) -> str:
    if unit in ("calls/s", "B/call", "calls"):
        return f"{value:,.0f} {unit}"
    if unit == "MB":
        return f"{value:+.1f} MB"
    return f"{value:,.1f} {unit}"


def _cells(row: dict[str, Any]) -> list[str]:
    ours = row["ours"]
    ours_text = _number(ours, row["unit"]) if isinstance(ours, (int, float)) else str(ours)
    baseline = row.get("baseline")
    baseline_text = "-"
    if isinstance(baseline, (int, float)):
        baseline_text = _number(baseline, row["unit"])
        if row.get("baseline_name"):
            baseline_text += f" ({row['baseline_name']})"
    found = row.get("ratio")
    ratio_text = f"{found:.2f}x" if isinstance(found, (int, float)) else "-"
    met = row.get("met")
    met_text = "-" if met is None else ("yes" if met else "no")
    return [row["figure"], ours_text, baseline_text, ratio_text, row.get("target") or "-", met_text]


def table(figures: dict[str, dict[str, Any]]) -> str:
    """The results as a plain-text table, one line per row of every figure."""
    header = ["figure", "ours", "baseline (same run)", "ratio", "target", "met"]
    lines = [header]
    for name, result in figures.items():
        rows = result.get("rows") or []
        if not rows:
            lines.append([name, str(result.get("status", "?")), "-", "-", "-", "-"])
        lines.extend(_cells(row) for row in rows)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rule = "  ".join("-" * width for width in widths)
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines]
    return "\n".join([text[0], rule, *text[1:]])


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
