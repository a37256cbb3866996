"""``celery -A proj redisdelay ...``: the command line, registered under the ``celery.commands`` entry point."""

from .commands import redisdelay

__all__ = ["redisdelay"]
