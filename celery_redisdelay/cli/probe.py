"""``celery -A proj redisdelay probe``: a worker probe for Kubernetes (an exec probe, liveness or readiness).

It exits 0 or 1 and prints one line saying why, from what the worker writes itself (its heartbeat in the store, or
the file of ``redisdelay_probe_file`` with ``--file``), never from ``celery inspect ping``; the verdict is
:mod:`celery_redisdelay.operations.probe`'s. Anything that keeps it from judging (the store unreachable, a bad
setting) is a failure too, with its reason.
"""

from __future__ import annotations

import json

import click
from celery.utils.nodenames import default_nodename, host_format, node_format

from ..errors import RedisDelayError
from ..extension import RedisDelay
from ..operations.probe import SHORTEST_BOUND, ProbeResult, probe_file, probe_worker
from .output import JSON_OPTION, extension, say


def worker_name(value: str | None) -> str:
    """A worker's full name as Celery makes it from ``-n`` (``%h``, ``%n``, ``%d`` expanded; ``celery@`` before a
    bare host; ``celery@<this host>`` without one)."""
    return str(host_format(default_nodename(value or "")))


@click.command()
@click.option(
    "-n",
    "--hostname",
    "name",
    help="The worker's name, as given to the worker's -n (w1@%h); default: Celery's, celery@<this host>.",
)
@click.option(
    "--max-stall",
    "--max-age",
    "bound",
    type=click.FloatRange(min=SHORTEST_BOUND),
    help="Seconds: fail what has lasted longer (a stuck loop, queues not consumed, a silent worker; --file: the "
    "file's age). Default: redisdelay_lease (30 s by default).",
)
@click.option(
    "--file",
    "path",
    help="Judge the file the worker touches (redisdelay_probe_file; %h and %n expanded by -n) instead of the store.",
)
@JSON_OPTION
@click.pass_context
def probe(ctx: click.Context, name: str | None, bound: float | None, path: str | None, as_json: bool) -> None:
    """Whether a worker works: its event loop turns, its leases are renewed, it consumes the queues it should.
    Exits 0 (it does) or 1 (it does not, or it cannot tell), printing one line that says why."""
    worker = worker_name(name)
    try:
        if path is not None:
            app = ctx.obj.app
            max_age = bound if bound is not None else RedisDelay.of(app).settings.lease
            result = probe_file(node_format(path, worker), max_age)
        else:
            result = probe_worker(extension(ctx), worker, bound)
    except RedisDelayError as exc:
        result = ProbeResult(False, worker, f"FAIL {worker}: cannot tell: {exc}", (str(exc),), bound)
    say(json.dumps(result.as_dict(), default=str) if as_json else result.line)
    ctx.exit(0 if result.ok else 1)


COMMANDS = (probe,)
