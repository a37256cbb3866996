"""Serving the dashboard with waitress, a production WSGI server in pure Python, until SIGTERM or Ctrl-C."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from waitress import create_server


def serve(
    app: Any, host: str = "127.0.0.1", port: int = 5556, threads: int = 4, say: Callable[[str], None] = print
) -> None:
    """Serve ``app`` on ``host``:``port`` with ``threads`` worker threads until SIGTERM or SIGINT."""
    server: Any = create_server(app, host=host, port=port, threads=threads, ident="redisdelay")

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)  # waitress's loop catches it, closes its sockets and stops its threads

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # Every address it listens on (a name can resolve to several), with the real port (--port 0).
    listening = getattr(server, "effective_listen", None) or [(server.effective_host, server.effective_port)]
    for address, bound in listening:
        say(f"redisdelay web: serving on http://{f'[{address}]' if ':' in address else address}:{bound}/")
    server.run()
    say("redisdelay web: stopped")
