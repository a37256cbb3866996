"""The battle's report: the figures as data (JSON) and as text, and the verdict."""

from __future__ import annotations

import re
from typing import Any

from ..harness.report import summary, verdict_row
from ..measure import DOCUMENTED

MIB = 1024 * 1024
#: A worker incarnation's RSS is judged from this long after its start, if it lived twice as long.
WARM_SECONDS = 60.0
RSS_FLAT_SHARE = 0.10
#: The keys a drained store may hold that it did not hold before the first call (``chaos/measure.py``'s,
#: under the battle's prefix).
BATTLE_DOCUMENTED = {rule.replace("chaos", "battle"): why for rule, why in DOCUMENTED.items()}


def keys_left(start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """The keys after the drain that were not there before the first call: documented ones, and leaks."""
    new = sorted(set(end["keys"]) - set(start["keys"]))
    leaked: list[dict[str, Any]] = []
    documented: list[dict[str, Any]] = []
    for key in new:
        info = end["keys"][key]
        why = next((why for rule, why in BATTLE_DOCUMENTED.items() if re.fullmatch(rule, key)), None)
        if why is None and info.get("tasks") == ["redisdelay.tick"]:
            why = "beat's tick, waiting in its queue or being run"
        row = {"key": key, "type": info["type"], "size": info["size"]}
        (leaked if why is None else documented).append({**row, "why": why} if why else row)
    return {
        "dbsize": [start["dbsize"], end["dbsize"]],
        "used_memory": [start["used_memory"], end["used_memory"]],
        "documented": documented,
        "leaked": leaked,
    }


def rss_judgement(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each worker incarnation that lived at least twice :data:`WARM_SECONDS`: its RSS (main and pool
    processes) after the warm-up against the highest after that, and whether it stayed within 10%."""
    series: dict[str, list[tuple[float, int]]] = {}
    for row in samples:
        for name, kib in (row.get("rss_kib") or {}).items():
            if name.startswith("worker"):
                series.setdefault(name, []).append((row["t"], kib))
    judged = []
    for name, points in series.items():
        first = points[0][0]
        if points[-1][0] - first < 2 * WARM_SECONDS:
            continue
        warm = next(kib for moment, kib in points if moment >= first + WARM_SECONDS)
        highest = max(kib for moment, kib in points if moment >= first + WARM_SECONDS)
        growth = (highest - warm) / warm if warm else 0.0
        judged.append(
            {
                "worker": name,
                "lived_s": round(points[-1][0] - first),
                "warm_kib": warm,
                "highest_kib": highest,
                "last_kib": points[-1][1],
                "growth": round(growth, 3),
                "flat": growth <= RSS_FLAT_SHARE,
            }
        )
    return judged


def memory_table(samples: list[dict[str, Any]], rows: int = 12) -> list[dict[str, Any]]:
    """About ``rows`` samples spread over the run: Redis's memory, the workers' RSS in all and per process."""
    if not samples:
        return []
    step = max(1, len(samples) // rows)
    picked = samples[::step]
    if picked[-1] is not samples[-1]:
        picked.append(samples[-1])
    table = []
    for row in picked:
        rss = row.get("rss_kib") or {}
        workers = [kib for name, kib in rss.items() if name.startswith("worker")]
        table.append(
            {
                "t": row["t"],
                "sent": row.get("sent"),
                "done": row.get("done"),
                "queue": row.get("queue"),
                "parked": row.get("parked"),
                "redis_used_mib": round(row["redis_used_memory"] / MIB, 1) if "redis_used_memory" in row else None,
                "redis_rss_mib": round(row["redis_rss"] / MIB, 1) if "redis_rss" in row else None,
                "dbsize": row.get("dbsize"),
                "workers_rss_mib": round(sum(workers) / 1024, 1),
                "worker_mean_mib": round(sum(workers) / len(workers) / 1024, 1) if workers else None,
                "others_rss_mib": {
                    name: round(kib / 1024, 1) for name, kib in rss.items() if not name.startswith("worker")
                },
            }
        )
    return table


def verdict(data: dict[str, Any]) -> tuple[bool, list[str]]:
    """Problems of the extension (plain Celery's figures are measured, not judged)."""
    if data["settings"]["plain"]:
        return True, []
    outcome, problems = data["outcome"], []
    lost = outcome["lost"]
    if lost["parked_beyond_bound"]:
        problems.append(f"{lost['parked_beyond_bound']} parked calls lost (beyond Redis's own bound)")
    if lost.get("tracked_beyond_bound"):
        problems.append(f"{lost['tracked_beyond_bound']} tracked calls due now lost (beyond Redis's own bound)")
    if outcome["early"]["total"]:
        problems.append(f"{outcome['early']['total']} runs before their due time")
    if outcome["duplicates"]["unexplained"]:
        problems.append(f"{outcome['duplicates']['unexplained']} duplicates no fault explains")
    letters = outcome.get("dead_letters") or {}
    if letters.get("wrong"):
        problems.append(f"{letters['wrong']} 'worker lost' dead letters no run cut short by a kill bears out")
    if letters.get("ended_unexplained"):
        problems.append(f"{letters['ended_unexplained']} 'worker lost' dead letters of runs that ended, unexplained")
    if outcome["cancelled_but_ran_count"]:
        problems.append(f"{outcome['cancelled_but_ran_count']} cancelled calls ran")
    if data["keys"]["leaked"]:
        problems.append(f"{len(data['keys']['leaked'])} keys left behind")
    if data["producer_errors"]:
        problems.append(f"{len(data['producer_errors'])} sends failed for good")
    if data.get("error"):
        problems.append("the battle failed: " + str(data["error"]).strip().splitlines()[-1])
    return not problems, problems


def _q(values: dict[str, Any]) -> str:
    if not values.get("n"):
        return "-"
    return f"p50 {values['p50']:.3f}s  p99 {values['p99']:.3f}s  max {values['max']:.3f}s  ({values['n']:,} units)"


def _by_contract(outcome: dict[str, Any]) -> str:
    """The line of the dead letters of runs cut short with their worker (none with plain Celery)."""
    letters = outcome.get("dead_letters") or {}
    if not letters:
        return "-"
    return (
        f"{letters['by_contract']:,} ({letters['per_worker_sigkill']} per worker SIGKILL): cut short in their run "
        f"{letters['cut']}, started before the ledger saw it {letters['accepted']}; 'worker lost' dead letters of "
        f"runs that ended {letters['ended']} ({letters['ended_unexplained']} unexplained), wrong {letters['wrong']}; "
        f"other dead letters {letters['other']}"
    )


def _keys_line(data: dict[str, Any]) -> str:
    """The keys left after the drain, once the 'worker lost' dead letters were read and purged."""
    keys = data["keys"]
    text = f"dbsize {keys['dbsize'][0]} -> {keys['dbsize'][1]}"
    if not data["settings"]["plain"]:
        text += f" (after purging {data['run'].get('worker_lost_purged') or 0} 'worker lost' dead letters)"
    leaked = ", ".join(f"{row['key']} ({row['type']} {row['size']})" for row in keys["leaked"][:10]) or "-"
    return f"{text}; {len(keys['leaked'])} undocumented: {leaked}"


def _letter_lines(letters: dict[str, Any]) -> list[str]:
    """The 'worker lost' dead letters, each with its call id and unit, and the other dead letters."""
    rows, others = letters.get("rows") or [], letters.get("other_rows") or []
    if not rows and not others:
        return []
    lines = ["", "  dead letters ('worker lost': by contract, cut or accepted; ended; wrong)"]
    lines += [
        f"    {row['id']} {row['unit'] or '?':>10} {row['kind'] or '?':<9} {row['category']:<8} "
        f"{'' if row['explained'] else 'UNEXPLAINED: '}{row['why']}"
        for row in rows[:40]
    ]
    lines += [f"    {row['id']} other: {row['why']}" for row in others[:20]]
    return lines


def table(data: dict[str, Any]) -> str:
    settings, outcome, run = data["settings"], data["outcome"], data["run"]
    lost, dups = outcome["lost"], outcome["duplicates"]
    mode = "plain Celery (no extension)" if settings["plain"] else "celery-redisdelay, redisdelay_all_tasks"
    per = outcome["per_worker_sigkill"]
    counts = data["faults"]["counts"]
    rows: list[tuple[str, str]] = [
        ("mode", mode),
        ("server", f"{data['server']} (store and broker), appendfsync everysec; ledger apart"),
        ("software", ", ".join(f"{k} {v}" for k, v in data["software"].items())),
        (
            "size",
            f"{outcome['sent']:,} units sent in {run.get('sending_seconds')} s ({run.get('rate_reached')} calls/s "
            f"asked {settings['rate']:g}); workers {settings['workers']}; longest countdown "
            f"{settings['longest_countdown']:g} s",
        ),
        ("sent by kind", ", ".join(f"{k} {v:,}" for k, v in outcome["sent_by_kind"].items())),
        ("sent by path", ", ".join(f"{k} {v:,}" for k, v in outcome["sent_by_path"].items())),
        ("expected runs", f"{outcome['expected']:,} ({outcome['cancelled']:,} cancelled)"),
        ("ran exactly once", f"{outcome['exactly_once']:,}"),
        (
            "lost",
            f"{lost['total']:,}: parked {lost['parked']} (within Redis's 2 s bound before a SIGKILL "
            f"{lost['parked_within_redis_bound']}, beyond it {lost['parked_beyond_bound']}); tracked due now "
            f"{lost.get('tracked', 0)} (beyond the bound {lost.get('tracked_beyond_bound', 0)}); Celery's path: due "
            f"now {lost['celery_now']}, with an eta {lost['celery_eta']}",
        ),
        ("cut short, lost", f"{lost.get('cut_short', 0):,} runs started, their worker killed, never run again"),
        (
            "dead-lettered by contract",
            "- (plain Celery has none: it loses them)" if settings["plain"] else _by_contract(outcome),
        ),
        ("duplicates", f"{dups['total']:,} ({dups['unexplained']} unexplained)"),
        (
            "cancels",
            f"{outcome['cancelled']:,} cancelled, {outcome['cancel_too_late']:,} too late (released), "
            f"{outcome['cancelled_but_ran_count']} cancelled but ran",
        ),
        ("early runs", f"{outcome['early']['total']}"),
        *((f"lateness {path}", _q(values)) for path, values in outcome["lateness"].items()),
        (
            "per worker SIGKILL",
            f"{per['sigkills']} SIGKILLs: lost {per['lost']}, dead-lettered by contract {per.get('dead_lettered')}, "
            f"duplicated {per['duplicated']}, late (> {outcome['late_seconds']:g} s) {per['late']}",
        ),
        ("faults", ", ".join(f"{k} {v['injected']}/{v['planned']}" for k, v in counts.items() if v["planned"])),
        ("drain", f"{run.get('drained')} after {run.get('drain_seconds')} s"),
        ("keys left", _keys_line(data)),
        (
            "send errors",
            f"{len(data['send_errors'])} sends raised and were made again; "
            f"{len(data['producer_errors'])} failed for good",
        ),
        ("unplanned exits", f"{len(data['unplanned_exits'])}"),
        ("elapsed", f"{data['seconds']} s in all"),
        verdict_row(data),
    ]
    lines = summary(f"battle, seed {settings['seed']}", rows)
    for row in data["keys"]["documented"]:
        lines.append(f"    documented key: {row['key']} ({row['type']} {row['size']}): {row['why']}")
    lines += ["", "  memory over the run (MiB; workers: every worker's main and pool processes)"]
    lines.append(
        f"  {'t':>6}  {'sent':>9}  {'ran':>9}  {'queue':>7}  {'parked':>7}  {'redis used':>10}  {'redis rss':>9}  "
        f"{'workers':>8}  {'per worker':>10}  others"
    )
    for row in data["memory"]:
        others = ", ".join(f"{name} {mib}" for name, mib in row["others_rss_mib"].items())
        lines.append(
            f"  {row['t']:>5.0f}s  {row['sent'] or 0:>9,}  {row['done'] or 0:>9,}  {row['queue'] or 0:>7,}  "
            f"{row['parked'] or 0:>7,}  {row['redis_used_mib'] or 0:>10}  {row['redis_rss_mib'] or 0:>9}  "
            f"{row['workers_rss_mib']:>8}  {row['worker_mean_mib'] or 0:>10}  {others}"
        )
    judged = data["rss_flat"]
    if judged:
        lines.append(
            "  worker incarnations that lived 2 min or more, RSS after 1 min -> highest after (MiB): "
            + "; ".join(
                f"{row['worker']} {row['lived_s']}s {row['warm_kib'] / 1024:.1f} -> {row['highest_kib'] / 1024:.1f} "
                f"({row['growth']:+.1%})"
                for row in judged
            )
        )
    else:
        lines.append("  no worker lived 2 minutes: RSS flatness is not judged per incarnation")
    lines += [
        "",
        f"  {'fault':<14}  {'at':>7}  {'back':>6}  {'affected':>8}  {'cut':>5}  {'held':>5}  {'median':>7}  "
        f"{'max':>7}  not again  dead  target",
    ]
    for row in outcome["recovery"]:
        median = "-" if row["median_s"] is None else f"{row['median_s']:.2f}s"
        longest = "-" if row["max_s"] is None else f"{row['max_s']:.2f}s"
        lines.append(
            f"  {row['kind']:<14}  {row['at'] or 0:>6.1f}s  {row['back_s']:>5.1f}s  {row['affected']:>8}  "
            f"{row['cut_short']:>5}  {row['held']:>5}  {median:>7}  "
            f"{longest:>7}  {row['not_run_again']:>9}  {row.get('dead_lettered', 0):>4}  {row['target']}"
        )
    pooled = outcome.get("recovery_pooled") or {}
    if pooled:
        lines.append("  waits pooled by fault and path (from the fault, or the due time if later, to the next start):")
        lines += [
            f"    {name:<32} {_q(values)}, longest: unit {values['worst_unit']}" for name, values in pooled.items()
        ]
    skipped = [fault for fault in data["faults"]["list"] if not fault["injected"]]
    if skipped:
        lines.append(
            f"  not injected: {', '.join(f['kind'] + ' (' + (f['detail'] or 'run over') + ')' for f in skipped)}"
        )
    if dups["rows"]:
        lines += ["", "  duplicates"]
        lines += [
            f"    {row['unit']:>10} {row['kind']:<9} {row['path']:<10} {row['runs']} runs on "
            f"{','.join(row['workers'])}: {'' if row['explained'] else 'UNEXPLAINED: '}{row['why']}"
            for row in dups["rows"][:40]
        ]
    lines += _letter_lines(outcome.get("dead_letters") or {})
    if lost["rows"]:
        lines += ["", "  lost"]
        lines += [
            f"    {row['unit']:>10} {row['kind']:<9} {row['path']:<10} {row['category']:<5} {row['why']}"
            for row in lost["rows"][:40]
        ]
    if outcome["early"]["rows"]:
        lines += ["", "  early"] + [f"    {row}" for row in outcome["early"]["rows"][:20]]
    return "\n".join(lines)
