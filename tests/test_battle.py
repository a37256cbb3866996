"""The battle (``python -m chaos --battle``, issue 33): its seeded plan of calls and faults, its analysis of the
ledger (exactly once, lost parked or due now, duplicates tied to a fault, early, lateness, recovery; the runs of
early-ack tasks cut short by a kill, dead-lettered by contract with the extension and lost with plain Celery, and
the ``worker lost`` dead letters no such run bears out), its report, and one very short real battle with the
extension under a worker SIGKILL, a releaser SIGKILL, a SIGKILL of Redis and a CLIENT KILL. Timings are not judged
here."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from celery_redisdelay.testing import RedisServer
from chaos.battle.analysis import CELERY_NOW, PARKED, TRACKED, Outcome, quantiles, reason_start
from chaos.battle.app import units_of
from chaos.battle.plan import BATCH, CANCEL, KINDS, NOW, SLEEP, WORKER_TERM, Mix, fault_counts, parse_shares, schedule
from chaos.battle.processes import parse_pools
from chaos.battle.report import keys_left, rss_judgement, table, verdict
from chaos.faults import REDIS_KILL, WORKER_KILL
from chaos.harness.ledger import RedisLedger, send_record

from .conftest import run_module

T0 = 1_700_000_000.0


def test_the_same_seed_gives_the_same_calls_and_faults() -> None:
    shares = parse_shares("")
    first, second = Mix(7, shares, 0.1), Mix(7, shares, 0.1)
    calls = [first.next() for _ in range(500)]
    assert calls == [second.next() for _ in range(500)]
    assert calls != [Mix(8, shares, 0.1).next() for _ in range(500)]
    assert {call.kind for call in calls} == set(KINDS)
    assert [call.n for call in calls] == list(range(500))
    for call in calls:
        assert call.countdown <= 60.0
        if call.kind == CANCEL:  # a cancel comes while the call is still parked
            assert call.countdown >= call.cancel_after + 3.0
    counts = fault_counts({WORKER_KILL: 4.0, REDIS_KILL: 0.1, WORKER_TERM: 0.0}, 3.0)
    assert counts == {WORKER_KILL: 12, REDIS_KILL: 1, WORKER_TERM: 0}  # at least one of each kind asked for
    faults = schedule(counts, 7, 3)
    assert [(f.kind, f.at, f.slot) for f in faults] == [(f.kind, f.at, f.slot) for f in schedule(counts, 7, 3)]
    assert len(faults) == 13 and all(0.05 <= f.at <= 0.95 for f in faults)
    assert [f.at for f in faults] == sorted(f.at for f in faults)


def test_shares_and_pools_are_checked() -> None:
    shares = parse_shares("now=1,countdown=1,sleep=0,retry=0,batch=0,lock=0,cancel=0")
    assert shares[NOW] == shares["countdown"] == 0.5
    assert {Mix(1, shares).next().kind for _ in range(50)} <= {NOW, "countdown"}
    with pytest.raises(ValueError, match="unknown kind"):
        parse_shares("later=1")
    assert parse_pools("prefork:2,threads:4") == [("prefork", 2), ("threads", 4)]
    with pytest.raises(ValueError, match="unknown pool"):
        parse_pools("fibers:2")


def test_the_units_a_message_carries() -> None:
    assert units_of("battle.work", [5, 0.0], 0) == ["5.0"]
    assert units_of("battle.retrying", [5, 2.0, 1], 1) == ["5.1"]
    assert units_of("battle.batch", ["k1", [{"n": 3}, {"n": 4}]], 0) == ["3.0", "4.0"]
    assert units_of("redisdelay.tick", [], 0) == []


def test_the_ledger_reads_back_what_the_producer_and_the_workers_wrote(redis_server: RedisServer) -> None:
    ledger = RedisLedger.from_url(f"{redis_server.url}/13")
    ledger.client.flushdb()
    try:
        ledger.send("1.0", send_record("now", T0, T0 + 0.1, "a", PARKED))
        ledger.send("2.0", send_record("cancel", T0 + 60, T0 + 0.2, "b", PARKED, again=True))
        assert ledger.expected() == 2  # every send written first
        ledger.cancelled("2.0", True)
        request = SimpleNamespace(hostname="worker0-1@h", delivery_tag="t1", delivery_info={"redelivered": True})
        began = ledger.started(request, "1.0")
        ledger.ended(request, "1.0", began)
        ledger.ran(request, ["3.0", "4.0"], due=T0 + 5)
        ledger.sent_first("1.1", send_record("retry", T0 + 9, T0 + 1, "a", PARKED))
        ledger.sent_first("1.1", send_record("retry", T0 + 10, T0 + 2, "a", PARKED))  # only the first is kept
        ledger.received(["1.0"], T0 + 0.5, "worker0-1@h")

        assert ledger.expected() == 2 and ledger.done() == 3 and ledger.receipts() == 1
        assert ledger.sent_not_done(["1.0", "2.0", "9.0"]) == 1
        sends, starts, ends, cancels, received = ledger.read()
        assert sends["2.0"] == {"k": "cancel", "d": T0 + 60, "t": T0 + 0.2, "id": "b", "c": PARKED, "r": 1}
        assert sends["1.1"]["d"] == T0 + 9 and "r" not in sends["1.0"] and len(sends) == 3
        assert [start["u"] for start in starts] == ["1.0", "3.0", "4.0"] and starts[1]["d"] == T0 + 5
        assert all(end["w"] == "worker0-1@h" and end["tag"] == "t1" and end["rd"] for end in ends)
        assert cancels == {"2.0": True} and received == [{"u": "1.0", "t": T0 + 0.5, "w": "worker0-1@h"}]
        assert Outcome(sends, starts, ends, cancels, [], received).as_dict()["exactly_once"] == 1  # 1.1 never ran
    finally:
        ledger.client.flushdb()
        ledger.close()


def send(kind: str, due: float, sent: float, path: str, **extra: Any) -> dict[str, Any]:
    return {"k": kind, "d": due, "t": sent, "id": "x", "c": path, **extra}


def run(
    unit: str, start: float, end: float, worker: str, due: float | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    host, own = f"{worker}@h", {} if due is None else {"d": due}
    return {"u": unit, "t": start, "w": host, "p": 1, **own}, {"u": unit, "s": start, "e": end, "w": host, **own}


def fault(kind: str, wall: float, target: str = "", back: float = 1.0) -> dict[str, Any]:
    return {"kind": kind, "wall": wall, "elapsed": round(wall - T0, 1), "injected": True, "target": target,
            "recovery_seconds": back}  # fmt: skip


def test_the_analysis_sorts_every_unit() -> None:
    sends = {
        "1.0": send(NOW, T0, T0, CELERY_NOW),  # ran once
        "2.0": send("countdown", T0 + 10, T0, PARKED),  # ran twice: its worker was killed after its run
        "3.0": send("countdown", T0 + 5, T0 + 19.5, PARKED),  # lost, sent 0.5 s before the SIGKILL of Redis
        "4.0": send("countdown", T0 + 5, T0 + 1, PARKED),  # lost, nothing explains it: a bug
        "5.0": send(NOW, T0 + 2, T0 + 2, CELERY_NOW),  # cut short by the worker SIGKILL, never again
        "6.0": send("countdown", T0 + 30, T0, PARKED),  # ran early
        "7.0": send(CANCEL, T0 + 30, T0, PARKED),  # cancelled, never ran
        "8.0": send(CANCEL, T0 + 3, T0, PARKED),  # the cancel came too late: ran once
        "9.0": send(NOW, T0 + 40, T0 + 40, CELERY_NOW),  # ran twice with no fault between
        "10.0": send(NOW, T0 + 11, T0 + 11, CELERY_NOW),  # received by the killed worker, ran again later
        # A retry sent twice (its attempt ran again after a fault): the ledger heard of the second send only,
        # and the run of the first is judged by the due time its message carried, not early.
        "11.1": send("retry", T0 + 50, T0 + 45, PARKED),
        # A batch item added as a CLIENT KILL cut its connection: the add landed, its reply was lost, the client
        # added it again, and the batch ran it twice.
        "12.0": send("batch", T0 + 59.85, T0 + 59.85, PARKED),
    }
    runs = [
        run("1.0", T0 + 0.01, T0 + 0.02, "worker0-1"),
        run("2.0", T0 + 10.0, T0 + 10.1, "worker0-1"),
        run("2.0", T0 + 42.0, T0 + 42.1, "worker1-2"),
        run("6.0", T0 + 29.0, T0 + 29.1, "worker1-2"),
        run("8.0", T0 + 3.0, T0 + 3.1, "worker1-2"),
        run("9.0", T0 + 40.0, T0 + 40.1, "worker1-2"),
        run("9.0", T0 + 41.0, T0 + 41.1, "worker1-2"),
        run("10.0", T0 + 25.0, T0 + 25.1, "worker1-2"),
        run("11.1", T0 + 30.5, T0 + 30.6, "worker1-2", due=T0 + 30.0),
        run("12.0", T0 + 61.0, T0 + 61.1, "worker1-2"),
        run("12.0", T0 + 61.0, T0 + 61.1, "worker1-2"),
    ]
    starts = [start for start, _ in runs] + [{"u": "5.0", "t": T0 + 11.5, "w": "worker0-1@h", "p": 1}]
    ends = [end for _, end in runs]
    received = [{"u": "10.0", "t": T0 + 11.2, "w": "worker0-1@h"}]
    faults = [
        fault(WORKER_KILL, T0 + 12, "worker0-1 pid 10"),
        fault(REDIS_KILL, T0 + 20, "store redis-server"),
        fault("client_kill", T0 + 59.9, "CLIENT KILL TYPE normal"),
    ]

    data = Outcome(sends, starts, ends, {"7.0": True, "8.0": False}, faults, received).as_dict()

    assert data["sent"] == 12 and data["expected"] == 11 and data["cancelled"] == 1 and data["cancel_too_late"] == 1
    assert data["exactly_once"] == 5  # 1, 6, 8, 10, 11
    lost = {row["unit"]: row for row in data["lost"]["rows"]}
    assert set(lost) == {"3.0", "4.0", "5.0"}
    assert (
        lost["3.0"]["category"] == "bound" and lost["4.0"]["category"] == "fault" and lost["5.0"]["category"] == "cut"
    )
    assert data["lost"]["parked"] == 2 and data["lost"]["parked_within_redis_bound"] == 1
    assert data["lost"]["parked_beyond_bound"] == 1 and data["lost"]["celery_now"] == 1
    duplicates = {row["unit"]: row for row in data["duplicates"]["rows"]}
    assert duplicates["2.0"]["explained"] and "worker_kill of worker0-1" in duplicates["2.0"]["why"]
    assert not duplicates["9.0"]["explained"] and data["duplicates"]["unexplained"] == 1
    assert duplicates["12.0"]["explained"] and "the reply to a send" in duplicates["12.0"]["why"]
    assert [row["unit"] for row in data["early"]["rows"]] == ["6.0"]
    assert data["lateness"][PARKED] == {"n": 3, "p50": 0.0, "p99": 0.0, "max": 0.0}  # 2.0, 8.0 on time; 6.0 -1 s
    assert data["lateness"][CELERY_NOW]["max"] == pytest.approx(14.0)  # 10.0: due at 11, ran at 25
    assert data["lateness"][f"{PARKED} (retry)"]["max"] == pytest.approx(0.5)  # by its own due time
    assert data["per_worker_sigkill"]["sigkills"] == 1 and data["per_worker_sigkill"]["lost"] == 3.0
    kill = data["recovery"][0]
    assert kill["cut_short"] == 1 and kill["held"] == 1 and kill["not_run_again"] == 1
    assert kill["max_s"] == pytest.approx(13.0)  # 10.0: received before the kill at 12, ran at 25


def worker_lost(call_id: str, worker: str, started: float) -> dict[str, Any]:
    """A dead letter as the store's sweep makes it of a run cut short with its worker (store/lua/sweep.lua)."""
    at = datetime.fromtimestamp(started, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    why = (
        f"worker lost: the run of delivery 1 that started on {worker}@h at {at}Z had not reported its end when its "
        "worker was lost; its task runs a call at most once past its start (redisdelay_worker_lost), so it is not "
        "run again: check whether the run did its work, then requeue it to run it again"
    )
    return {"id": call_id, "why": why, "at": started + 60.0}


Rows = list[dict[str, Any]]


def cut_short_battle(plain: bool) -> tuple[dict[str, Any], Rows, Rows, Rows, Rows]:
    """Calls of early-ack tasks and the kills of their workers, as the ledger and the fault log have them."""
    path = CELERY_NOW if plain else TRACKED
    sends = {
        "1.0": send(SLEEP, T0, T0, path, id="c1"),  # its run cut short by the kill at 12 s, never run again
        "2.0": send(SLEEP, T0 + 1, T0 + 1, path, id="c2"),  # the same, on the worker killed at 30 s
        "3.0": send(NOW, T0 + 2, T0 + 2, path, id="c3"),  # ran once, on a worker no fault hit
        "4.0": send(NOW, T0 + 11.9, T0 + 11.9, path, id="c4"),  # accepted, then killed before its first write
        "5.0": send(NOW, T0 + 29.0, T0 + 29.0, path, id="c5"),  # ended 0.2 s before its worker's kill
        "6.0": send(NOW, T0 + 11.9, T0 + 11.9, path, id="c6"),  # started by a pool process just after the kill
    }
    runs = [run("3.0", T0 + 2.1, T0 + 2.2, "worker2-3"), run("5.0", T0 + 29.7, T0 + 29.8, "worker1-2")]
    starts = [start for start, _ in runs] + [
        {"u": "1.0", "t": T0 + 11.0, "w": "worker0-1@h", "p": 1},
        {"u": "2.0", "t": T0 + 29.5, "w": "worker1-2@h", "p": 1},
    ]
    received: Rows = [
        {"u": "4.0", "t": T0 + 11.95, "w": "worker0-1@h"},
        {"u": "6.0", "t": T0 + 11.95, "w": "worker0-1@h"},
    ]
    faults = [fault(WORKER_KILL, T0 + 12, "worker0-1 pid 10"), fault(WORKER_KILL, T0 + 30, "worker1-2 pid 11")]
    return sends, starts, [end for _, end in runs], received, faults


def test_a_run_cut_short_and_dead_lettered_is_by_contract_not_lost() -> None:
    sends, starts, ends, received, faults = cut_short_battle(plain=False)
    letters = [
        worker_lost("c1", "worker0-1", T0 + 10.999),
        worker_lost("c4", "worker0-1", T0 + 11.96),  # the store's start, 40 ms before the kill
        worker_lost("c6", "worker0-1", T0 + 12.01),  # a pool process outlived its main process by 10 ms
        worker_lost("c5", "worker1-2", T0 + 29.699),  # its run ended; the kill took its acknowledgement
        {"id": "c9", "why": "not acknowledged after 5 deliveries (last seen queued)", "at": T0 + 90},
    ]

    data = Outcome(sends, starts, ends, {}, faults, received, letters).as_dict()

    letter_rows = {row["unit"]: row for row in data["dead_letters"]["rows"]}
    assert letter_rows["1.0"]["category"] == "cut" and letter_rows["1.0"]["id"] == "c1"
    assert letter_rows["1.0"]["worker"] == "worker0-1" and "worker_kill at 12.0s" in letter_rows["1.0"]["why"]
    assert (
        letter_rows["4.0"]["category"] == "accepted" and "+0.040s before its worker_kill" in letter_rows["4.0"]["why"]
    )
    assert letter_rows["5.0"]["category"] == "ended" and letter_rows["5.0"]["explained"]
    figures = data["dead_letters"]
    assert (
        letter_rows["6.0"]["category"] == "accepted" and "-0.010s before its worker_kill" in letter_rows["6.0"]["why"]
    )
    assert figures["by_contract"] == 3 and figures["cut"] == 1 and figures["accepted"] == 2
    assert figures["ended"] == 1 and figures["ended_unexplained"] == 0 and figures["wrong"] == 0
    assert figures["other"] == 1 and figures["per_worker_sigkill"] == 1.5
    assert data["per_worker_sigkill"]["dead_lettered"] == 1.5
    # Dead-lettered by contract: neither lost nor a duplicate. 2.0 has no dead letter: its run is lost, cut short.
    assert [row["unit"] for row in data["lost"]["rows"]] == ["2.0"]
    assert data["lost"]["rows"][0]["category"] == "cut" and data["lost"]["cut_short"] == 1
    assert data["lost"]["tracked_beyond_bound"] == 1 and data["duplicates"]["total"] == 0
    assert data["exactly_once"] == 2  # 3.0, and 5.0 whose dead letter came after its run ended
    assert [row["dead_lettered"] for row in data["recovery"]] == [3, 0]
    ok, problems = verdict(report_data(False, data, []))
    assert not ok and problems == ["1 tracked calls due now lost (beyond Redis's own bound)"]
    text = table({**report_data(False, data, []), "ok": ok, "problems": problems})
    counted = r"dead-lettered by contract +3 \(1\.5 per worker SIGKILL\): cut short in their run 1, started before"
    assert re.search(counted, text)
    assert re.search(r"cut short, lost +1 runs started", text) and "c1        1.0 sleep     cut" in text


def test_a_worker_lost_dead_letter_no_cut_short_run_bears_out_is_wrong() -> None:
    sends, starts, ends, received, faults = cut_short_battle(plain=False)
    letters = [
        worker_lost("c1", "worker0-1", T0 + 10.999),
        worker_lost("c2", "worker1-2", T0 + 29.499),
        worker_lost("c3", "worker2-3", T0 + 2.099),  # ran once on a worker no fault hit: ended, unexplained
        worker_lost("c4", "worker0-1", T0 + 10.0),  # the store's start 2 s before the kill, none in the ledger
        worker_lost("c6", "worker0-1", T0 + 10.0),  # no call the battle sent
    ]
    sends = {**sends, "6.0": send(BATCH, T0, T0, PARKED, id="c7")}
    starts = [*starts, {"u": "7.0", "t": T0 + 20.0, "w": "worker2-3@h", "p": 1}]
    sends["7.0"] = send(NOW, T0 + 20, T0 + 20, PARKED, id="c8")
    letters.append(worker_lost("c8", "worker2-3", T0 + 19.999))  # started, never ended, its worker never killed
    batch_letter = worker_lost("c7", "worker0-1", T0 + 11.0)  # a batch's task runs again: no dead letter is due

    data = Outcome(sends, starts, ends, {}, faults, received, [*letters, batch_letter]).as_dict()

    rows = {row["id"]: row for row in data["dead_letters"]["rows"]}
    assert rows["c1"]["category"] == rows["c2"]["category"] == "cut"
    assert rows["c3"]["category"] == "ended" and not rows["c3"]["explained"]
    assert rows["c4"]["category"] == "wrong" and "not within 1s before it" in rows["c4"]["why"]
    assert rows["c6"]["category"] == "wrong" and rows["c6"]["unit"] is None
    assert rows["c8"]["category"] == "wrong" and "with no fault of that worker after" in rows["c8"]["why"]
    assert rows["c7"]["category"] == "wrong" and "runs a call cut short again" in rows["c7"]["why"]
    assert data["dead_letters"]["wrong"] == 4 and data["dead_letters"]["ended_unexplained"] == 1
    assert {row["unit"] for row in data["lost"]["rows"]} == {"4.0", "6.0", "7.0"}  # wrong letters count for nothing
    ok, problems = verdict(report_data(False, data, []))
    assert not ok
    assert "4 'worker lost' dead letters no run cut short by a kill bears out" in problems
    assert "1 'worker lost' dead letters of runs that ended, unexplained" in problems
    everything_acks_late = Outcome(sends, starts, ends, {}, faults, received, letters[:1], acks_late=True).as_dict()
    assert everything_acks_late["dead_letters"]["wrong"] == 1 and everything_acks_late["lost"]["cut_short"] == 2


def test_plain_celery_loses_the_runs_cut_short_the_extension_dead_letters() -> None:
    sends, starts, ends, received, faults = cut_short_battle(plain=True)

    data = Outcome(sends, starts, ends, {}, faults, received).as_dict()

    lost = {row["unit"]: row["category"] for row in data["lost"]["rows"]}
    assert lost == {"1.0": "cut", "2.0": "cut", "4.0": "held", "6.0": "held"} and data["lost"]["cut_short"] == 2
    assert data["lost"]["celery_now"] == 4 and data["dead_letters"]["by_contract"] == 0
    text = table({**report_data(True, data, []), "ok": True, "problems": []})
    assert re.search(r"cut short, lost +2 runs started, their worker killed, never run again", text)
    assert re.search(r"dead-lettered by contract +- \(plain Celery has none", text)
    assert verdict(report_data(True, data, [])) == (True, [])


def test_a_worker_lost_dead_letter_of_a_run_that_ended_is_explained_by_a_lost_acknowledgement() -> None:
    sends = {f"{n}.0": send(NOW, T0 + n, T0 + n, TRACKED, id=f"c{n}") for n in (1, 2, 3)}
    runs = [
        run("1.0", T0 + 40.0, T0 + 40.1, "worker2-3"),  # ended 0.9 s before the SIGKILL of Redis
        run("2.0", T0 + 43.9, T0 + 44.0, "worker2-3"),  # ended while Redis was away: its acknowledgement dropped
        run("3.0", T0 + 20.0, T0 + 20.1, "worker2-3"),  # ended long before any fault
    ]
    faults = [fault(REDIS_KILL, T0 + 41.0, "store redis-server", back=5.0)]
    letters = [worker_lost(f"c{n}", "worker2-3", T0 + start - 0.001) for n, start in ((1, 40), (2, 43.9), (3, 20))]
    starts, ends = [start for start, _ in runs], [end for _, end in runs]

    data = Outcome(sends, starts, ends, {}, faults, (), letters).as_dict()

    rows = {row["unit"]: row for row in data["dead_letters"]["rows"]}
    assert rows["1.0"]["explained"] and "the acknowledgement was lost with the connection" in rows["1.0"]["why"]
    assert rows["2.0"]["explained"] and "redis_kill at 41.0s, -3.000s from the end" in rows["2.0"]["why"]
    assert not rows["3.0"]["explained"] and data["dead_letters"]["ended_unexplained"] == 1
    assert data["exactly_once"] == 3 and data["dead_letters"]["by_contract"] == 0


def test_a_worker_lost_reason_names_its_worker_and_start() -> None:
    worker, started = reason_start(worker_lost("c1", "worker0-1", T0 + 1.25)["why"])
    assert worker == "worker0-1" and started == pytest.approx(T0 + 1.25)
    assert reason_start("worker lost: the run of delivery 2 that started on a worker was cut short") == (None, None)
    assert reason_start("payload missing at sweep") == (None, None)


def test_quantiles() -> None:
    assert quantiles([]) == {"n": 0, "p50": None, "p99": None, "max": None}
    values = quantiles(float(value) for value in range(1, 101))
    assert values == {"n": 100, "p50": 50.0, "p99": 99.0, "max": 100.0}


def test_keys_left_and_rss_and_the_verdict() -> None:
    start = {"keys": {"_kombu.binding.battle": {"type": "set", "size": 1}}, "dbsize": 1, "used_memory": 1}
    end = {
        "keys": {
            **start["keys"],
            "{battle}:counters": {"type": "hash", "size": 16},
            "{battle}:payloads": {"type": "hash", "size": 3},
        },
        "dbsize": 3,
        "used_memory": 2,
    }
    keys = keys_left(start, end)
    assert [row["key"] for row in keys["leaked"]] == ["{battle}:payloads"]
    assert [row["key"] for row in keys["documented"]] == ["{battle}:counters"]
    samples = [{"t": float(t), "rss_kib": {"worker0-1": 100_000 + t * 10, "runner": 50_000}} for t in range(0, 300, 5)]
    [judged] = rss_judgement(samples)
    assert judged["worker"] == "worker0-1" and judged["flat"] and judged["growth"] < 0.03
    assert not rss_judgement([{"t": 0.0, "rss_kib": {"worker0-1": 1}}, {"t": 30.0, "rss_kib": {"worker0-1": 2}}])


def report_data(plain: bool, outcome: dict[str, Any], leaked: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "settings": {"plain": plain, "seed": 1, "rate": 10.0, "workers": "prefork:2", "longest_countdown": 6.0},
        "server": "7.0.15",
        "software": {"revision": "abc"},
        "run": {"sending_seconds": 10.0, "rate_reached": 10.0, "drained": "complete", "drain_seconds": 1.0},
        "outcome": outcome,
        "keys": {"dbsize": [1, 2], "leaked": leaked, "documented": []},
        "memory": [],
        "rss_flat": [],
        "faults": {"counts": {WORKER_KILL: {"planned": 1, "injected": 1}}, "list": []},
        "send_errors": [],
        "producer_errors": [],
        "unplanned_exits": [],
        "seconds": 12.0,
    }


def test_the_verdict_judges_the_extension_only() -> None:
    sends = {"1.0": send("countdown", T0 + 5, T0, PARKED), "2.0": send(BATCH, T0, T0, PARKED)}
    starts, ends = zip(*[run("2.0", T0 + 1, T0 + 1.1, "worker0-1")], strict=True)
    outcome = Outcome(sends, list(starts), list(ends), {}, []).as_dict()
    leaked = [{"key": "{battle}:payloads", "type": "hash", "size": 1}]

    ok, problems = verdict(report_data(False, outcome, leaked))
    assert not ok and problems == ["1 parked calls lost (beyond Redis's own bound)", "1 keys left behind"]
    assert verdict(report_data(True, outcome, leaked)) == (True, [])
    data = {**report_data(False, outcome, []), "ok": False, "problems": problems}
    text = table(data)
    assert re.search(r"lost +1: parked 1 ", text) and "FAILED" in text


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_a_very_short_battle_loses_no_parked_call(tmp_path: Path) -> None:
    out = tmp_path / "battle.json"
    status, output = run_module(
        "chaos",
        *("--battle", "--minutes", "0.25", "--rate", "20", "--countdown-scale", "0.01", "--seed", "2"),
        *("--lease", "4", "--visibility-timeout", "10", "--settle", "5", "--quiet", "0", "--mix", "sleep=0"),
        *("--workers", "prefork:1,threads:2", "--worker-kills", "4", "--worker-terms", "0", "--beat-kills", "0"),
        *("--releaser-kills", "4", "--redis-kills", "4", "--client-kills", "4", "--json", str(out)),
        timeout=120,
    )
    report = judged(out, output, {"worker_kill", "releaser_kill", "redis_kill", "client_kill"})
    assert len(report["outcome"]["recovery"]) == 4 and report["memory"], output
    assert status == 0, output


def judged(out: Path, output: str, faults: set[str]) -> dict[str, Any]:
    """The report of a very short battle, checked: no parked call lost, none early, no duplicate unexplained, no
    cancelled call run, no key left, and exactly ``faults`` injected."""
    print(output)
    report: dict[str, Any] = json.loads(out.read_text())
    outcome = report["outcome"]
    assert outcome["sent"] > 0 and outcome["lost"]["parked_beyond_bound"] == 0, output
    assert outcome["early"]["total"] == 0 and outcome["duplicates"]["unexplained"] == 0, output
    assert outcome["cancelled_but_ran_count"] == 0 and report["keys"]["leaked"] == [], output
    assert {kind for kind, count in report["faults"]["counts"].items() if count["injected"]} == faults, output
    return report


def test_the_rabbitmq_broker_takes_broker_restarts_and_leaves_calls_due_now_to_celery() -> None:
    from chaos.battle.main import RABBITMQ_RESTARTS, parse_args

    args = parse_args(["--broker", "rabbitmq"])
    assert args.broker_restart == RABBITMQ_RESTARTS and not args.track_due_now  # tracked only on a Redis broker
    assert parse_args(["--broker", "rabbitmq", "--broker-restarts", "2"]).broker_restart == 2.0
    assert parse_args([]).broker_restart == 0.0  # the store's Redis is the broker: its faults are the Redis ones
    with pytest.raises(SystemExit):
        parse_args(["--broker", "rabbitmq", "--track-due-now"])


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_very_short_battle_on_rabbitmq_loses_no_parked_call(tmp_path: Path) -> None:
    from celery_redisdelay.testing.rabbitmq import INSTALL_HINT, available

    if not available():
        pytest.skip(f"RabbitMQ is not installed ({INSTALL_HINT})")
    out = tmp_path / "battle.json"
    status, output = run_module(
        "chaos",
        *("--battle", "--broker", "rabbitmq", "--minutes", "0.3", "--rate", "20", "--countdown-scale", "0.01"),
        *("--seed", "3", "--lease", "4", "--visibility-timeout", "10", "--settle", "5", "--quiet", "0"),
        *("--mix", "sleep=0", "--workers", "prefork:1,threads:2", "--worker-kills", "4", "--worker-terms", "0"),
        *("--beat-kills", "0", "--releaser-kills", "4", "--redis-kills", "0", "--client-kills", "0"),
        *("--broker-restarts", "3", "--json", str(out)),
        timeout=220,
    )
    report = judged(out, output, {"worker_kill", "releaser_kill", "broker_restart"})
    assert report["settings"]["broker"] == "rabbitmq", output
    assert status == 0, output
