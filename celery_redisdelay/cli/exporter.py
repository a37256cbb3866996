"""``celery -A proj redisdelay exporter | monitoring``: the Prometheus metrics served (the prometheus extra),
and the Grafana dashboard and alert rules shipped for them."""

from __future__ import annotations

import os
import threading

import click

from .. import monitoring
from ..operations import metrics
from .output import extension, on_stop_signals, say


@click.command()
@click.option("--port", type=click.IntRange(1, 65535), default=9808, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True, help="Where to listen (0.0.0.0: every interface).")
@click.pass_context
def exporter(ctx: click.Context, port: int, address: str) -> None:
    """Serve Prometheus metrics at http://ADDRESS:PORT/metrics until SIGTERM or Ctrl-C (the prometheus extra)."""
    rd = extension(ctx)
    try:
        server = metrics.serve(rd.depot, port, address)
    except (RuntimeError, OSError) as exc:
        raise click.ClickException(f"cannot serve metrics on {address}:{port}: {exc}") from exc
    stopping = threading.Event()
    on_stop_signals(stopping.set)
    say(f"redisdelay exporter: metrics of {rd.app.main} at http://{address}:{port}/metrics (pid {os.getpid()})")
    stopping.wait()
    server.shutdown()
    server.server_close()
    say("redisdelay exporter: stopped")


@click.command(name="monitoring")
@click.argument("what", type=click.Choice(sorted(monitoring.FILES)))
def monitoring_files(what: str) -> None:
    """Print the Grafana dashboard (grafana) or the Prometheus alert rules (alerts) for the exporter's metrics."""
    click.echo(monitoring.read(what), nl=False)


COMMANDS = (exporter, monitoring_files)
