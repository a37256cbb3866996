"""The dashboard: parked, in-flight and dead calls in a browser (the ``web`` extra: Flask and waitress).

``celery -A proj redisdelay web`` serves it on 127.0.0.1:5556; :func:`create_app` gives the same WSGI
app to mount in a Flask, Django or (through a WSGI adapter) ASGI application. The core package never
imports this one.
"""

from __future__ import annotations

from .app import create_app
from .server import serve

__all__ = ["create_app", "serve"]
