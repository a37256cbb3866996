"""The run's report: a table on stdout and the same as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .faults import KINDS


def _ids(values: list[Any], limit: int = 20) -> str:
    shown = ", ".join(str(value) for value in values[:limit])
    return f"[{shown}{', ...' if len(values) > limit else ''}]"


def table(data: dict[str, Any]) -> str:
    """The report as text: the figures, the duplicates with their explanation, the faults."""
    result = data.get("result") or {}
    lines = []
    rows: list[tuple[str, str]] = [
        ("expected", f"{result.get('expected', '?')}"),
        ("processed", f"{result.get('processed', '?')}"),
        ("missing", f"{len(result.get('missing', []))} {_ids(result.get('missing', []))}"),
        ("duplicates", f"{len(result.get('duplicates', []))} {_ids(result.get('duplicates', []))}"),
        ("dead-lettered", f"{result.get('dead', '?')}"),
        ("deliveries", f"{result.get('deliveries', '?')}"),
        ("failures", f"{result.get('failures', '?')} (on purpose: fail_every={data['settings']['fail_every']})"),
        ("elapsed", f"{result.get('elapsed', '?')} s (validation), {data.get('seconds', '?')} s (whole run)"),
        ("timed out", f"{result.get('timed_out', '?')}"),
        ("left in store", json.dumps(data.get("store_after"))),
        ("runs seen", json.dumps(data.get("runs"))),
    ]
    counts = data["faults"]["counts"]
    rows.append(
        (
            "faults",
            ", ".join(f"{kind} {counts[kind]['injected']}/{counts[kind]['planned']}" for kind in KINDS),
        )
    )
    waits = data.get("long_waits")
    if waits:
        rows.append(
            (
                "long waits",
                f"{waits['after_queue_timeout']} deliveries came ~the queue timeout after the previous one "
                f"(swept: the message was lost between the broker and a worker)",
            )
        )
    exits = data.get("unplanned_exits") or []
    rows.append(("unplanned exits", f"{len(exits)} (processes that died on their own and were restarted)"))
    if data.get("runner_retries"):
        rows.append(("runner retries", f"{len(data['runner_retries'])} Redis commands retried by the runner's client"))
    if data.get("error"):
        rows.append(("error", str(data["error"]).strip().splitlines()[-1]))
    rows.append(("verdict", "OK" if data["ok"] else "FAILED"))
    width = max(len(name) for name, _ in rows)
    lines.append(f"chaos run: {data['settings']['count']:,} messages, seed {data['settings']['seed']}")
    lines.extend(f"  {name:<{width}}  {value}" for name, value in rows)

    duplicates = data.get("duplicates_explained") or []
    if duplicates:
        lines.append("")
        lines.append(f"  {'message':>7}  {'id':<36}  {'runs':>4}  {'allowed':<7}  explanation")
        for row in duplicates:
            lines.append(
                f"  {row['number']:>7}  {row['id'] or '?':<36}  {len(row['runs']):>4}  "
                f"{'yes' if row['allowed'] else 'NO':<7}  {row['explanation']}"
            )
    missing = data.get("missing_explained") or []
    if missing:
        lines.append("")
        lines.append(f"  {'missing':>7}  {'id':<36}  {'runs':>4}  explanation")
        for row in missing[:50]:
            lines.append(f"  {row['number']:>7}  {row['id'] or '?':<36}  {len(row['runs']):>4}  {row['explanation']}")

    if exits:
        lines.append("")
        lines.append(f"  {'exit':<16}  {'at':>8}  {'status':>6}  reason -> replacement")
        for record in exits:
            lines.append(
                f"  {record['name'] + ' ' + str(record['pid']):<16}  {record['at'] or 0:>7.1f}s  "
                f"{record['status']!s:>6}  {record['reason'][:160]} -> {record['replacement']}"
            )

    faults = data["faults"]["list"]
    if faults:
        lines.append("")
        lines.append(f"  {'#':>3}  {'fault':<13}  {'at':>8}  {'progress':>8}  {'recovery':>8}  target -> replacement")
        for index, fault in enumerate(faults, 1):
            if not fault["injected"]:
                lines.append(f"  {index:>3}  {fault['kind']:<13}  {'-':>8}  {'-':>8}  {'-':>8}  not injected")
                continue
            target = fault["target"] + (f" -> {fault['replacement']}" if fault["replacement"] else "")
            detail = f" ({fault['detail']})" if fault["detail"] else ""
            error = f" ERROR {fault['error']}" if fault["error"] else ""
            lines.append(
                f"  {index:>3}  {fault['kind']:<13}  {fault['elapsed']:>7.1f}s  {fault['progress']:>8.3f}  "
                f"{fault['recovery_seconds'] or 0:>7.1f}s  {target}{detail}{error}"
            )
    return "\n".join(lines)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
