"""Which path a call takes: the table of docs/how-it-works.rst ("Which path a call takes") against the one function
that decides (``celery_redisdelay/producer/paths.py``), row by row and for every combination of the facts; and the
extension's routing of real calls down each path."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path as FilePath
from typing import Any, NamedTuple

import pytest

from celery_redisdelay.producer.paths import Call, Path, may_leave_celery, path

DOC = FilePath(__file__).resolve().parent.parent / "docs" / "how-it-works.rst"
FACTS = [field.name for field in dataclasses.fields(Call)]
PATHS = {"Celery": Path.CELERY, "parked": Path.PARK, "tracked": Path.TRACK}


class Row(NamedTuple):
    number: int
    when: str  # a Python expression over the facts
    path: Path

    def holds(self, call: Call) -> bool:
        return bool(eval(self.when, {"__builtins__": {}}, dataclasses.asdict(call)))


def table() -> list[Row]:
    """The rows of the table under "Which path a call takes", in order."""
    text = DOC.read_text()
    section = text[text.index(".. _call-paths:") : text.index(".. _tracking:")]
    rows = []
    for line in section.splitlines():
        found = re.match(r"^(\d+)\s+``(.+?)``\s+(\w+)\s", line)
        if found:
            number, when, name = found.groups()
            rows.append(Row(int(number), when, PATHS[name]))
    return rows


def every_call() -> list[Call]:
    return [
        Call(**dict(zip(FACTS, values, strict=True))) for values in itertools.product((False, True), repeat=len(FACTS))
    ]


def by_table(call: Call) -> Path:
    return next(row.path for row in table() if row.holds(call))


def test_the_table_is_read_whole() -> None:
    rows = table()
    assert [row.number for row in rows] == list(range(1, len(rows) + 1)) and len(rows) == 8
    assert rows[-1].when == "True", "the last row catches every call the others leave"
    names = {name for row in rows for name in re.findall(r"\w+", row.when)} - {"and", "or", "not", "True"}
    assert names <= set(FACTS), f"the table names facts Call does not have: {names - set(FACTS)}"


@pytest.mark.parametrize("row", table(), ids=lambda row: f"row{row.number}")
def test_each_row_gives_its_path(row: Row) -> None:
    """A call for which this row is the first that holds takes the row's path (each row decides some call)."""
    decided = [call for call in every_call() if next(r for r in table() if r.holds(call)) == row]
    assert decided, f"row {row.number} decides no call: an earlier row always holds first"
    for call in decided:
        assert path(call) is row.path, f"row {row.number} ({row.when}): {call}"


def test_every_combination_takes_the_tables_path() -> None:
    calls = every_call()
    assert len(calls) == 2 ** len(FACTS)
    wrong = [call for call in calls if path(call) is not by_table(call)]
    assert not wrong, f"{len(wrong)} combinations differ from the table, e.g. {wrong[0]}"


def test_the_quick_exit_never_keeps_a_call_from_its_path() -> None:
    """``may_leave_celery`` decides before a call's arguments are bound; where it says Celery, so does the table."""
    for call in every_call():
        for explicit, waits in itertools.product((False, True), repeat=2):
            if (call.ours and not explicit) or (call.later and not waits):
                continue  # a task of ours is named explicitly; a call due later has a countdown or an eta
            tracked = call.tracked and not call.opted_out
            quick = may_leave_celery(
                explicit=explicit,
                protocol_1=call.protocol_1,
                all_tasks=call.all_tasks,
                waits=waits,
                limited=call.limited,
                tracked=tracked,
            )
            assert quick or path(call) is Path.CELERY, (call, explicit, waits)


@pytest.fixture
def routed(make_app: Any) -> Any:
    """An app in the all-tasks mode with a plain task, a task that opts out, a limited task and a delayed one;
    each call's path is what the router sent it down."""
    app, rd = make_app(redisdelay_all_tasks=True, task_default_queue="paths")

    @app.task(name="paths.plain", shared=False)
    def plain() -> None: ...

    @app.task(name="paths.kept_out", shared=False, redisdelay_track=False)
    def kept_out() -> None: ...

    @app.task(name="paths.limited", shared=False, redisdelay_limit_rate="5/s")
    def limited() -> None: ...

    @rd.delayed(name="paths.delayed")
    def delayed() -> None: ...

    app.finalize()
    return app, rd


@pytest.mark.parametrize(
    ("task", "options", "expected"),
    [
        ("paths.plain", {}, Path.TRACK),
        ("paths.plain", {"countdown": 60}, Path.PARK),
        ("paths.plain", {"countdown": 0}, Path.TRACK),
        ("paths.plain", {"redisdelay_track": False}, Path.CELERY),
        ("paths.kept_out", {}, Path.CELERY),
        ("paths.kept_out", {"countdown": 60}, Path.PARK),
        ("paths.limited", {}, Path.PARK),
        ("paths.delayed", {}, Path.PARK),
        ("celery.backend_cleanup", {}, Path.CELERY),
    ],
)
def test_a_real_call_goes_where_the_table_says(routed: Any, task: str, options: dict[str, Any], expected: Path) -> None:
    app, rd = routed
    result = app.send_task(task, **options)
    entry = rd.find(result.id)
    where = "celery" if entry is None else entry.state
    assert where == {Path.CELERY: "celery", Path.PARK: "delayed", Path.TRACK: "inflight"}[expected], (task, options)
