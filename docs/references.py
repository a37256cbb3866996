"""The manual's reference page (docs/reference.rst), written from the code: the settings (settings.py), the command
line (its click commands), the exporter's metrics (a scrape of a real store) and the shipped alert rules.

``python3 dev.py references`` writes it; ``tests/test_references.py`` fails when the page is not what this writes,
so a setting, a command, a metric or an alert cannot be added without the manual knowing.
"""

from __future__ import annotations

import re
import textwrap
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import click
import yaml
from celery import Celery

from celery_redisdelay import RedisDelay, monitoring
from celery_redisdelay.cli import redisdelay
from celery_redisdelay.settings import DEFAULTS

PAGE = Path(__file__).resolve().parent / "reference.rst"
SETTINGS_PAGE = Path(__file__).resolve().parent / "settings.rst"

HEAD = """\
.. This page is written by ``python3 dev.py references`` (docs/references.py); do not edit it by hand.

#########
Reference
#########

Written from the code of this version: every setting, command, metric and shipped alert, each with what the code
says of it. :doc:`settings` says what each setting does at length, :doc:`operations` what to do when an alert fires.
"""


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A ``list-table`` of plain text cells."""
    lines = [".. list-table::", "   :header-rows: 1", ""]
    for row in [list(headers), *rows]:
        lines.append(f"   * - {row[0]}")
        lines += [f"     - {cell}" for cell in row[1:]]
    return "\n".join(lines) + "\n"


def one_line(text: str) -> str:
    return " ".join(text.split())


def cut(text: str, marks: tuple[str, ...]) -> tuple[str, str]:
    """``text`` split after the first of ``marks`` outside a literal (````...````): (up to it, the rest)."""
    inside = False
    for i in range(len(text)):
        if text.startswith("``", i):
            inside = not inside
        elif not inside and any(text.startswith(mark, i) for mark in marks):
            return text[: i + 1], text[i + 2 :]
    return text, ""


def described_settings(page: str) -> dict[str, str]:
    """Each setting settings.rst describes (a definition list entry whose term names it, alone or with others) ->
    the first sentence of what it does, past what its default is."""
    found: dict[str, str] = {}
    for match in re.finditer(r"^(``redisdelay_\w+``(?:,? and ``redisdelay_\w+``)*)\n((?:    .*\n|\n)+)", page, re.M):
        body = one_line(match.group(2))
        if body.startswith("Default"):
            default, rest = cut(body, (": ", "; ", ". "))
            body = rest[:1].upper() + rest[1:] if rest else default
        sentence = cut(body, (". ",))[0]
        for name in re.findall(r"``(redisdelay_\w+)``", match.group(1)):
            found[name] = sentence.rstrip(".;:") + "."
    return found


def settings_section() -> str:
    described = described_settings(SETTINGS_PAGE.read_text())
    rows = [
        (
            f"``{name}``",
            f"``{default!r}``" if default is not None else "``None``: worked out",
            described.get(name, "**undocumented**"),
        )
        for name, default in DEFAULTS.items()
    ]
    return "Settings\n========\n\n" + table(("setting", "default", "what it does (from :doc:`settings`)"), rows)


def cli_section() -> str:
    out = ["Commands\n========\n", "``celery -A proj redisdelay COMMAND``; ``--help`` on each says the rest.\n"]
    for name in sorted(redisdelay.commands):
        command = redisdelay.commands[name]
        out.append(f"``{name}``\n    {one_line(command.help or '')}\n")
        options = [param for param in command.params if isinstance(param, click.Option) and not param.hidden]
        if options:
            out.append("    Options: " + ", ".join(f"``{'/'.join(opt.opts)}``" for opt in options) + ".\n")
    return "\n".join(out)


def scrape(url: str) -> list[tuple[str, str, str, list[str]]]:
    """The metric families a real exporter serves for a store with calls in every state it reports: (name, type,
    help, labels)."""
    from celery_redisdelay.operations.metrics import RedisDelayCollector

    app = Celery("references", broker=f"{url}/0", set_as_current=False)
    app.conf.update(redisdelay_key_prefix=f"references-{uuid.uuid4().hex[:8]}", task_default_queue="references")
    rd = RedisDelay(app)

    @rd.delayed(name="references.limited", limit_concurrency=2)
    def limited() -> None: ...

    try:
        limited.apply_async(countdown=3600)
        rd.pause(task="references.limited", reason="references")
        families: list[Any] = list(RedisDelayCollector(rd).collect())
        rows = []
        for family in families:
            labels = sorted({label for sample in family.samples for label in sample.labels if label != "le"})
            rows.append((family.name, family.type, one_line(family.documentation), labels))
        return sorted(rows)
    finally:
        rd.resume(task="references.limited")
        for store in rd.depot.shards.all():
            keys = list(store.client.scan_iter(match=f"{{{store.keys.tag}}}*"))
            if keys:
                store.client.delete(*keys)
        app.close()


def metrics_section(url: str) -> str:
    rows = [
        (f"``{name}{'_total' if kind == 'counter' else ''}``", kind, ", ".join(labels) or "(none)", help_text)
        for name, kind, help_text, labels in scrape(url)
    ]
    head = "Metrics\n=======\n\n``celery -A proj redisdelay exporter`` serves these (a scrape of a real store).\n\n"
    return head + table(("metric", "type", "labels", "what it counts"), rows)


def alerts_section() -> str:
    rules = yaml.safe_load(monitoring.read("alerts"))["groups"][0]["rules"]
    rows = [
        (
            f"``{rule['alert']}``",
            rule["labels"]["severity"],
            rule.get("for", "0m"),
            one_line(rule["annotations"]["description"]),
        )
        for rule in rules
    ]
    head = "Alerts\n======\n\n``celery -A proj redisdelay monitoring alerts`` prints the rules.\n\n"
    return head + table(("alert", "severity", "for", "what it means"), rows)


def render(url: str) -> str:
    sections = [HEAD, settings_section(), cli_section(), metrics_section(url), alerts_section()]
    return "\n".join(textwrap.dedent(section).rstrip() + "\n" for section in sections)


def main() -> None:
    from celery_redisdelay.testing import RedisServer

    with RedisServer() as server:
        PAGE.write_text(render(server.url))
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
