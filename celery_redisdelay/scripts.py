"""The Lua scripts, read from ``lua/`` once and registered per Redis client.

Each state change of the call store is one script: the prelude (shared helpers and a check of the
key types) followed by the script's own file.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

from redis.commands.core import Script

from .stored import BATCH_PREFIX, MESSAGE_PREFIX

STORE_SCRIPTS = (
    "park",
    "park_many",
    "claim",
    "release",
    "confirm",
    "unclaim",
    "start",
    "touch",
    "ack",
    "sweep",
    "bury",
    "cancel",
    "requeue_dead",
    "purge_dead",
    "batch_add",
    "batch_flush",
    "lock_take",
    "lock_release",
    "purge_many",
    "reschedule_many",
    "requeue_many",
)
STANDALONE_SCRIPTS = ("validate_consume", "lock_extend")


#: What the store scripts share with Python, defined for them ahead of the prelude: how each stored form
#: begins (see :mod:`celery_redisdelay.stored`).
LUA_CONSTANTS = {"MESSAGE_PREFIX": MESSAGE_PREFIX, "BATCH_PREFIX": BATCH_PREFIX}


@cache
def source(name: str) -> str:
    """The full text of a script, the constants and the prelude ahead of it for store scripts."""
    text = files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")
    if name in STORE_SCRIPTS:
        prelude = files(__package__).joinpath("lua", "prelude.lua").read_text(encoding="utf-8")
        # Lua long brackets take the bytes as they are, quotes included.
        constants = "".join(f"local {name} = [==[{value.decode()}]==]\n" for name, value in LUA_CONSTANTS.items())
        return f"{constants}{prelude}\n{text}"
    return text


class Scripts:
    """The scripts bound to one client; each runs with EVALSHA and loads itself on NOSCRIPT."""

    def __init__(self, client: Any) -> None:
        self._scripts: dict[str, Script] = {
            name: client.register_script(source(name)) for name in STORE_SCRIPTS + STANDALONE_SCRIPTS
        }

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]
