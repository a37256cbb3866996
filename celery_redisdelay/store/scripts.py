"""The Lua scripts, read from ``lua/`` once and registered per Redis client.

Each state change of the call store is one script: the prelude (shared helpers and a check of the
key types) followed by the script's own file.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from typing import Any

from redis.commands.core import Script

from ..message.stored import BATCH_PREFIX, MESSAGE_PREFIX
from .evalsha import Connections, DirectScript, direct_pool

STORE_SCRIPTS = (
    "park",
    "park_many",
    "send",
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
    "cancel_done",
    "requeue_dead",
    "purge_dead",
    "batch_add",
    "batch_flush",
    "lock_take",
    "lock_release",
    "purge_many",
    "reschedule_many",
    "requeue_many",
    "adopt",
    "lease",
    "track",
    "delivery",
)
STANDALONE_SCRIPTS = ("validate_consume", "lock_extend")


#: What the store scripts share with Python, defined for them ahead of the prelude: how each stored form
#: begins (see :mod:`celery_redisdelay.message.stored`).
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
    """The scripts bound to one client; each runs with EVALSHA and loads itself on NOSCRIPT.

    ``store_keys`` are the keys every store script gets first: :meth:`run` sends them with the call's
    own, directly on a pooled connection where the client allows it (:mod:`celery_redisdelay.store.evalsha`).
    """

    def __init__(self, client: Any, store_keys: Sequence[bytes] = ()) -> None:
        self._scripts: dict[str, Script] = {
            name: client.register_script(source(name)) for name in STORE_SCRIPTS + STANDALONE_SCRIPTS
        }
        self._store_keys = list(store_keys)
        pool = direct_pool(client)
        connections = Connections(pool) if pool is not None else None
        self._direct = (
            {name: DirectScript(self._scripts[name], connections, store_keys) for name in STORE_SCRIPTS}
            if connections is not None
            else {}
        )

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]

    def run(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run the store script ``name`` with the store's keys, then ``keys``, and ``args``."""
        direct = self._direct.get(name)
        if direct is not None:
            return direct(keys, args)
        return self._scripts[name](keys=[*self._store_keys, *keys], args=list(args))

    def pipelined(self, name: str, keys: Sequence[Any], args: Sequence[Any], pipe: Any) -> None:
        """Queue the store script ``name`` on a pipeline (see :meth:`run`)."""
        self._scripts[name](keys=[*self._store_keys, *keys], args=list(args), client=pipe)
