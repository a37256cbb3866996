"""``celery -A proj redisdelay web``: the dashboard (:mod:`celery_redisdelay.web`, the web extra), served until
stopped."""

from __future__ import annotations

import click

from .output import extension, say


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Where to listen (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=5556, show_default=True)
@click.option("--read-only", is_flag=True, help="Show everything, change nothing: no action buttons, POSTs refused.")
@click.option("--auth", envvar="REDISDELAY_WEB_AUTH", help="user:password for HTTP basic auth on every page.")
@click.option(
    "--secret",
    envvar="REDISDELAY_WEB_SECRET",
    help="Signs CSRF tokens (default: random per process; share one across processes).",
)
@click.option("--threads", type=click.IntRange(1, 64), default=4, show_default=True)
@click.pass_context
def web(
    ctx: click.Context, host: str, port: int, read_only: bool, auth: str | None, secret: str | None, threads: int
) -> None:
    """Serve the dashboard at http://HOST:PORT/ until SIGTERM or Ctrl-C (the web extra)."""
    rd = extension(ctx)
    try:
        from ..web import create_app, serve
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs the web extra: pip install 'celery-redisdelay[web]' ({exc})"
        ) from exc
    try:
        app = create_app(rd, read_only=read_only, auth=auth, secret=secret)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--auth") from exc
    if host not in ("127.0.0.1", "localhost", "::1") and auth is None:
        click.echo(
            f"redisdelay web: WARNING: listening on {host} without --auth: anyone who reaches it can act", err=True
        )
    serve(app, host, port, threads, say=say)


COMMANDS = (web,)
