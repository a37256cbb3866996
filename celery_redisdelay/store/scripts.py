"""The Lua scripts, read from ``lua/`` once and registered per Redis client.

Each state change of the call store is one script: its own file, after the libraries it names on its
``-- requires:`` line (``lua/lib/``, each named once, in an order where each follows the ones it requires) and
a header written here from :mod:`.layout`: a local for each of the store's keys the script uses, a check of
their types, and the constants Python and Lua share. A script pays for what it uses, nothing more: a worker's
start of a call defines a fifth of the functions the release does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from typing import Any

from redis.commands.core import Script

from ..message.stored import BATCH_PREFIX, MESSAGE_PREFIX
from .evalsha import Connections, DirectScript, direct_pool
from .layout import HISTORY_MINUTES, LATENESS_BOUNDS_MS, STORE_KEYS, StoreKey
from .meta import FRESH

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


def _lua_list(values: Sequence[int]) -> str:
    return "{" + ", ".join(str(value) for value in values) + "}"


#: What the store scripts share with Python, as Lua expressions: how each stored form begins (see
#: :mod:`celery_redisdelay.message.stored`; Lua long brackets take the bytes as they are, quotes included), how a
#: parked call's metadata ends while it waits for its first delivery (:mod:`.meta`), where a script's own keys
#: begin, how long the history is kept, the lateness buckets.
LUA_CONSTANTS = {
    "MESSAGE_PREFIX": f"[==[{MESSAGE_PREFIX.decode()}]==]",
    "BATCH_PREFIX": f"[==[{BATCH_PREFIX.decode()}]==]",
    "FIXED_KEYS": str(len(STORE_KEYS)),
    "HISTORY_MINUTES": str(HISTORY_MINUTES),
    "LATENESS_BOUNDS": _lua_list(LATENESS_BOUNDS_MS),
    "FRESH": f"'{FRESH}'",
}

#: The header's helpers, each written only into the scripts that call it.
_CHECK_TYPE = """-- Refuse to run on keys someone else overwrote: an error here happens before any write.
local function check_type(key, expected, also)
    local found = redis.call('TYPE', key)['ok']
    if found ~= 'none' and found ~= expected and found ~= also then
        return redis.error_reply('WRONGTYPE redisdelay key ' .. key .. ' holds a ' .. found
            .. ', expected a ' .. expected .. '; delete or rename it')
    end
end
"""
_LIST_KEYS = """-- The set of KEYS[first ..], each a list or missing; or, as a second value, the error for a key of
-- another type.
local function list_keys(first)
    local lists = {}
    for i = first, #KEYS do
        local wrong = check_type(KEYS[i], 'list')
        if wrong then
            return nil, wrong
        end
        lists[KEYS[i]] = true
    end
    return lists
end
"""

_REQUIRES = re.compile(r"^-- requires: (.*)$", re.M)
_NOT_CODE = re.compile(r"--[^\n]*|'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")


_FIELDS = re.compile(r"(?<![.])[.:](?![.])\s*[A-Za-z_][A-Za-z_0-9]*|(?<=[{,])\s*[A-Za-z_][A-Za-z_0-9]*\s*=(?!=)")


def _read(path: str) -> str:
    return files(__package__).joinpath("lua", path).read_text(encoding="utf-8")


def requires(text: str) -> list[str]:
    """The libraries a script or library names on its ``-- requires:`` line."""
    found = _REQUIRES.search(text)
    return [name.strip() for name in found.group(1).split(",")] if found else []


def _libraries(names: Sequence[str], chain: tuple[str, ...] = ()) -> list[str]:
    """``names`` and the libraries they require, each once, every one after those it requires."""
    order: list[str] = []
    for name in names:
        if name in chain:
            raise RuntimeError(f"the Lua libraries require each other in a circle: {' -> '.join((*chain, name))}")
        for needed in [*_libraries(requires(_read(f"lib/{name}.lua")), (*chain, name)), name]:
            if needed not in order:
                order.append(needed)
    return order


def used_names(text: str) -> set[str]:
    """The names a Lua text uses in its code: not in comments or string literals, not a field (``meta.s``,
    ``{s = ...}``)."""
    code = _FIELDS.sub(" ", _NOT_CODE.sub(" ", text))
    return set(re.findall(r"\b[A-Za-z_][A-Za-z_0-9]*\b", code))


def _check_all(keys: Sequence[StoreKey]) -> str:
    checks = ", ".join(f"{{{key.lua}, '{key.type}'}}" for key in keys)
    return (
        f"for _, key in ipairs({{{checks}}}) do\n"
        "    local wrong = check_type(key[1], key[2])\n"
        "    if wrong then\n        return wrong\n    end\nend\n"
    )


def header(body: str) -> str:
    """What goes ahead of a store script's ``body`` (its libraries and its own text): the shared constants and
    the store's keys it uses, as locals, and a check of their types."""
    used = used_names(body)
    lines = [f"local {name} = {value}" for name, value in LUA_CONSTANTS.items() if name in used]
    keys = [(position, key) for position, key in enumerate(STORE_KEYS, start=1) if key.lua in used]
    lines += [f"local {key.lua} = KEYS[{position}]  -- {key.type}: {key.holds}" for position, key in keys]
    text = "\n".join(lines) + "\n" + _CHECK_TYPE
    usual = [key for _, key in keys if key.usual]
    other = [key for _, key in keys if not key.usual]
    if usual:
        text += _check_all(usual)
    if other:  # mostly missing: one EXISTS, and their types only when one is there
        text += f"if redis.call('EXISTS', {', '.join(key.lua for key in other)}) > 0 then\n"
        text += "".join(f"    {line}\n" for line in _check_all(other).splitlines()) + "end\n"
    if "list_keys" in used:
        text += _LIST_KEYS
    return text


def body(text: str) -> str:
    """A store script's own ``text`` after the libraries it requires, each once, in order."""
    return "".join(_read(f"lib/{name}.lua") + "\n" for name in _libraries(requires(text))) + text


def compose(text: str) -> str:
    """A store script's full text from its own: the header, then the libraries it requires, then ``text``."""
    code = body(text)
    return f"{header(code)}\n{code}"


@cache
def source(name: str) -> str:
    """The full text of a script: for a store script, with its header and libraries ahead of it."""
    text = _read(f"{name}.lua")
    return compose(text) if name in STORE_SCRIPTS else text


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
