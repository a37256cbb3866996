"""What Prometheus and Grafana users load: a Grafana dashboard and alert rules on the exporter's metrics.

``celery -A proj redisdelay monitoring grafana`` and ``... monitoring alerts`` print them; from Python,
:func:`read` returns their text.
"""

from __future__ import annotations

from importlib import resources

#: The files shipped, by the name the CLI takes.
FILES = {"grafana": "grafana-dashboard.json", "alerts": "prometheus-alerts.yml"}


def read(name: str) -> str:
    """The text of the shipped file ``name`` (a key of :data:`FILES`)."""
    if name not in FILES:
        raise ValueError(f"no monitoring file {name!r}: choose one of {', '.join(FILES)}")
    return resources.files(__name__).joinpath(FILES[name]).read_text(encoding="utf-8")


__all__ = ["FILES", "read"]
