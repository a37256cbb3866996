"""The run's report as a table on stdout (the same as JSON: ``chaos/harness/report.py``)."""

from __future__ import annotations

import json
from typing import Any

from .faults import KINDS
from .harness.report import summary, verdict_row


def _ids(values: list[Any], limit: int = 20) -> str:
    shown = ", ".join(str(value) for value in values[:limit])
    return f"[{shown}{', ...' if len(values) > limit else ''}]"


def _mib(kib: int) -> str:
    return f"{kib / 1024:.1f}"


def _hung(rows: list[dict[str, Any]]) -> str:
    """The hung pool processes: how many, and whose."""
    return f"{len(rows)}" + "".join(f", pid {row['pid']} of {row['worker']}" for row in rows[:5])


def _summary(data: dict[str, Any]) -> list[str]:
    result = data.get("result") or {}
    settings = data["settings"]
    lost = data.get("losses") or {}
    rows: list[tuple[str, str]] = [
        ("redis", f"{settings['topology']}, {settings['redis']}, wait_replicas {settings['wait_replicas']}"),
        ("expected", f"{result.get('expected', '?')}"),
        ("processed", f"{result.get('processed', '?')}"),
        ("missing", f"{len(result.get('missing', []))} {_ids(result.get('missing', []))}"),
        (
            "  of which",
            f"{lost.get('missing_lost_in_kills', 0)} acknowledged and lost in a SIGKILL of Redis (bound: "
            f"{lost.get('bound_s', '?')} s before it), {lost.get('missing_other', '?')} for any other reason",
        ),
        ("duplicates", f"{len(result.get('duplicates', []))} {_ids(result.get('duplicates', []))}"),
        ("hung processes", _hung(data.get("hung_processes") or [])),
        ("dead-lettered", f"{result.get('dead', '?')}"),
        ("deliveries", f"{result.get('deliveries', '?')}"),
        ("failures", f"{result.get('failures', '?')} (on purpose: fail_every={settings.get('fail_every', 2)})"),
        ("elapsed", f"{result.get('elapsed', '?')} s (validation or soak), {data.get('seconds', '?')} s (whole run)"),
        ("left in store", json.dumps(data.get("store_after"))),
        ("runs seen", json.dumps(data.get("runs"))),
    ]
    counts = data["faults"]["counts"]
    planned = [
        f"{kind} {counts[kind]['injected']}/{counts[kind]['planned']}" for kind in KINDS if counts[kind]["planned"]
    ]
    rows.append(("faults", ", ".join(planned) or "none"))
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
    if data.get("runner_retries") or data.get("parks_refused"):
        rows.append(
            (
                "runner retries",
                f"{len(data.get('runner_retries') or [])} Redis commands retried by the runner's client, "
                f"{len(data.get('parks_refused') or [])} parks refused and made again",
            )
        )
    if data.get("error"):
        rows.append(("error", str(data["error"]).strip().splitlines()[-1]))
    rows.append(verdict_row(data))
    what = (
        f"{settings['soak_minutes']:g}-minute soak" if settings["mode"] == "soak" else f"{settings['count']:,} messages"
    )
    return summary(f"chaos run: {what}, seed {settings['seed']}", rows)


def _explained(data: dict[str, Any]) -> list[str]:
    lines = []
    duplicates = data.get("duplicates_explained") or []
    if duplicates:
        lines += ["", f"  {'message':>7}  {'id':<36}  {'runs':>4}  {'allowed':<7}  explanation"]
        for row in duplicates:
            lines.append(
                f"  {row['number']:>7}  {row['id'] or '?':<36}  {len(row['runs']):>4}  "
                f"{'yes' if row['allowed'] else 'NO':<7}  {row['explanation']}"
            )
    missing = data.get("missing_explained") or []
    if missing:
        lines += ["", f"  {'missing':>7}  {'id':<36}  {'runs':>4}  explanation"]
        for row in missing[:50]:
            lines.append(f"  {row['number']:>7}  {row['id'] or '?':<36}  {len(row['runs']):>4}  {row['explanation']}")
    for row in (data.get("hung_processes") or [])[:3]:
        if row.get("stack"):
            lines += ["", f"  hung pool process {row['pid']} of {row['worker']}, where it blocks:", row["stack"]]
    return lines


def _losses(data: dict[str, Any]) -> list[str]:
    kills = (data.get("losses") or {}).get("kills") or []
    if not kills:
        return []
    lines = ["", "  SIGKILLs of the store's Redis: acknowledged parks gone after each"]
    lines.append(f"  {'#':>3}  {'at':>8}  {'exposed':>7}  {'lost':>4}  {'window (s before)':<18}  what happened")
    for index, kill in enumerate(kills, 1):
        window = "-" if not kill["window_s"] else f"{kill['window_s'][0]:.3f} .. {kill['window_s'][1]:.3f}"
        lines.append(
            f"  {index:>3}  {kill['at'] or 0:>7.1f}s  {kill['exposed'] or 0:>7}  {kill['lost']:>4}  {window:<18}  "
            f"{kill['detail']}"
        )
    lines.append("  (exposed: parks acknowledged in the 2 s before the kill, the ones Redis's bound allows it to lose)")
    switches = (data.get("losses") or {}).get("master_switches") or []
    if switches:
        described = ", ".join(
            f"{switch['at']}s {switch['from']}->{switch['to']}{'' if switch['planned'] else ' (UNPLANNED)'}"
            for switch in switches
        )
        lines.append(f"  master switches seen by the first sentinel: {described}")
    return lines


def _history(data: dict[str, Any]) -> list[str]:
    history = data.get("history")
    if not history:
        return []
    if "error" in history:
        return ["", f"  the store's history could not be read: {history['error']}"]
    lines = [
        "",
        f"  the store's history over the run ({history['minutes']} minutes) against the ledger: {history['calls']} "
        f"calls, {history['lost']} lost, {history['exposed']} exposed, {history['park_retried']} parks retried",
    ]
    for row in history["totals"]:
        high = "no limit" if row["high"] is None else f"{row['high']:,}"
        verdict = "ok" if row["ok"] else "OUT OF RANGE"
        lines.append(f"  {row['name']:<14} {row['history']:>8,}   allowed {row['low']:,} .. {high:<10} {verdict}")
    return lines


def _recovery(data: dict[str, Any]) -> list[str]:
    rows = data.get("recovery") or []
    if not rows:
        return []
    lines = ["", "  recovery: calls each fault affected, and how long until they ran again"]
    lines.append(
        f"  {'fault':<14}  {'at':>8}  {'back':>6}  {'affected':>8}  {'median':>7}  {'longest':>7}  not run again"
    )
    for row in rows:
        median = "-" if row["median_s"] is None else f"{row['median_s']:.2f}s"
        longest = "-" if row["longest_s"] is None else f"{row['longest_s']:.2f}s"
        lines.append(
            f"  {row['kind']:<14}  {row['at'] or 0:>7.1f}s  {row['process_recovery_s'] or 0:>5.1f}s  "
            f"{row['affected']:>8}  {median:>7}  {longest:>7}  {row['not_run_again']}"
        )
    seen: dict[str, str] = {}
    for row in rows:
        seen.setdefault(row["kind"], row["bounded_by"])
    lines += [f"  {kind}: {why}" for kind, why in seen.items()]
    return lines


def _soak(data: dict[str, Any]) -> list[str]:
    soak = data.get("soak")
    if not soak:
        return []
    result = data.get("result") or {}
    lateness = soak["release_lateness"]
    lines = [
        "",
        f"  soak: parked for {soak['parked_seconds']} s, drained in {soak['drain_seconds']} s; in by kind "
        f"{json.dumps(result.get('parked_by_kind'))}",
        f"  release lateness (the store's histogram, {lateness['releases']:,} releases): p50 <= "
        f"{lateness['p50_le_s']} s, p99 <= {lateness['p99_le_s']} s",
    ]
    first = soak.get("first_start_lateness")
    if first:
        lines.append(
            f"  due to first start on a worker ({first['calls']:,} calls): p50 {first['p50_s']} s, p99 "
            f"{first['p99_s']} s, max {first['max_s']} s"
        )
    lines += [
        "",
        f"  {'process':<24}  {'pid':>7}  {'lived':>11}  {'first':>6}  {'at 60s':>6}  {'end':>6}  {'peak':>6}  "
        f"{'high 2/3':>8}  {'low 1/3':>7}  (RSS, MiB; highest in the first 2/3 of its life, lowest in the last 1/3)",
    ]
    for row in soak["rss"]:
        lived = f"{row['from_s']:.0f}-{row['to_s']:.0f}s"
        lines.append(
            f"  {row['name']:<24}  {row['pid']:>7}  {lived:>11}  {_mib(row['first_kib']):>6}  "
            f"{_mib(row['warm_kib']):>6}  {_mib(row['last_kib']):>6}  {_mib(row['peak_kib']):>6}  "
            f"{_mib(row['high_before_kib']):>8}  {_mib(row['floor_late_kib']):>7}"
        )
    for role, part in soak["redis"].items():
        compared = part["compare"]
        start, end = part["start"], part["end"]
        lines += [
            "",
            f"  redis {role}: keys {compared['dbsize'][0]} at the start, {compared['dbsize'][1]} after the drain; "
            f"used_memory {start['used_memory']:,} -> {end['used_memory']:,} B, dataset "
            f"{start['used_memory_dataset']:,} -> {end['used_memory_dataset']:,} B",
        ]
        before, after = start.get("memory", {}), end.get("memory", {})
        parts = [
            f"{name.replace('used_memory_', '').replace('mem_', '')} {before.get(name, '?')} -> {after.get(name, '?')}"
            for name in ("used_memory_overhead", "used_memory_scripts", "mem_clients_normal", "mem_aof_buffer")
        ]
        scripts = f"{before.get('number_of_cached_scripts', '?')} -> {after.get('number_of_cached_scripts', '?')}"
        lines.append(f"    memory: {', '.join(parts)}; cached scripts {scripts}")
        change = compared["dataset_change"]
        lines.append(
            f"    dataset {change['change']:+,} B: latency histograms of commands first used during the run "
            f"{change['latency_histograms']:+,} B, the rest (keys) {change['rest']:+,} B"
        )
        for row in compared["new_keys_documented"]:
            lines.append(f"    new, documented: {row['key']} ({row['type']}, {row['size']}): {row['why']}")
        for row in compared["leaked_keys"]:
            lines.append(f"    LEFT OVER: {row['key']} ({row['type']}, {row['size']})")
        for row in compared["changed_size"]:
            lines.append(f"    changed size: {row['key']} ({row['type']}) {row['start']} -> {row['end']}")
        if compared["gone_keys"]:
            lines.append(f"    gone since the start: {', '.join(compared['gone_keys'])}")
    return lines


def _faults(data: dict[str, Any]) -> list[str]:
    lines = []
    exits = data.get("unplanned_exits") or []
    if exits:
        lines += ["", f"  {'exit':<16}  {'at':>8}  {'status':>6}  reason -> replacement"]
        for record in exits:
            lines.append(
                f"  {record['name'] + ' ' + str(record['pid']):<16}  {record['at'] or 0:>7.1f}s  "
                f"{record['status']!s:>6}  {record['reason'][:160]} -> {record['replacement']}"
            )
    faults = data["faults"]["list"]
    if faults:
        lines += ["", f"  {'#':>3}  {'fault':<14}  {'at':>8}  {'progress':>8}  {'recovery':>8}  target -> replacement"]
        for index, fault in enumerate(faults, 1):
            if not fault["injected"]:
                lines.append(f"  {index:>3}  {fault['kind']:<14}  {'-':>8}  {'-':>8}  {'-':>8}  not injected")
                continue
            target = fault["target"] + (f" -> {fault['replacement']}" if fault["replacement"] else "")
            detail = f" ({fault['detail']})" if fault["detail"] else ""
            error = f" ERROR {fault['error']}" if fault["error"] else ""
            lines.append(
                f"  {index:>3}  {fault['kind']:<14}  {fault['elapsed']:>7.1f}s  {fault['progress']:>8.3f}  "
                f"{fault['recovery_seconds'] or 0:>7.1f}s  {target}{detail}{error}"
            )
    return lines


def table(data: dict[str, Any]) -> str:
    """The report as text: the figures, the duplicates and missing messages with their explanation, what
    each SIGKILL of Redis cost, the recovery of each fault, the soak's measurements, the faults."""
    parts = [
        _summary(data),
        _explained(data),
        _losses(data),
        _history(data),
        _recovery(data),
        _soak(data),
        _faults(data),
    ]
    return "\n".join(line for part in parts for line in part)
